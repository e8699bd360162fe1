//! An OpenStack cloud credential from the `clouds.yaml` an operator already has
//! (`plexctl cloud-credential create --provider openstack --clouds-yaml FILE --cloud NAME`).
//!
//! One cloud entry becomes the payload the broker's OpenStack substrate reads
//! (docs/broker.md): `auth_url`, `region` (from `region_name`), `interface`, the application
//! credential (`application_credential_id`/`_secret`, or `_name` with `username` and
//! `user_domain_name`) or the password (`username`, `password`, `user_domain_name`,
//! `project_name`/`project_id`, `project_domain_name`), and `ca_pem` read from `cacert`.
//! A key the broker would not use (`token`, `verify: false`, another `auth_type`) is refused by
//! name, so a credential never silently loses a setting. Messages never quote a secret.

use std::io::Read as _;
use std::path::Path;

use serde_json::{Map, Value};
use serde_yaml::Value as Yaml;

use crate::failure::Failure;

/// The largest clouds.yaml, CA file or --payload-file read (a real one is a few kB).
pub const MAX_FILE: u64 = 1024 * 1024;

/// The auth keys copied as they are.
const AUTH_KEYS: [&str; 11] = [
    "auth_url",
    "application_credential_id",
    "application_credential_secret",
    "application_credential_name",
    "username",
    "password",
    "user_domain_name",
    "user_domain_id",
    "project_name",
    "project_id",
    "project_domain_name",
];

fn usage(msg: String) -> Failure {
    Failure::Usage(msg)
}

/// The text of the file at `path` (named `what` in messages), refused when it holds more than
/// [`MAX_FILE`] bytes. A file that grows while it is read, or a pipe whose size is not known
/// beforehand, is cut at the cap and refused the same way.
pub(crate) fn read_capped(path: &Path, what: &str) -> Result<String, Failure> {
    let cannot = |e: std::io::Error| usage(format!("cannot read {what} {}: {e}", path.display()));
    let too_big = |len: String| {
        usage(format!(
            "{what} {} is {len} bytes; at most {MAX_FILE} bytes (1 MiB) are read",
            path.display()
        ))
    };
    let file = std::fs::File::open(path).map_err(cannot)?;
    let len = file.metadata().map_err(cannot)?.len();
    if len > MAX_FILE {
        return Err(too_big(len.to_string()));
    }
    let mut text = String::new();
    file.take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(cannot)?;
    if text.len() as u64 > MAX_FILE {
        return Err(too_big(format!("more than {MAX_FILE}")));
    }
    Ok(text)
}

/// The payload of cloud `cloud` in the clouds.yaml at `path`; a relative `cacert` is read
/// relative to the file.
pub fn payload(path: &Path, cloud: &str) -> Result<Map<String, Value>, Failure> {
    let text = read_capped(path, "--clouds-yaml")?;
    let base = path.parent().unwrap_or(Path::new("."));
    from_text(&text, cloud, &|cacert| {
        read_capped(&base.join(cacert), "the cacert of the cloud")
    })
    .map_err(|e| usage(format!("--clouds-yaml {}: {e}", path.display())))
}

fn text_of(v: &Yaml, key: &str) -> Result<String, String> {
    match v {
        Yaml::String(s) => Ok(s.clone()),
        Yaml::Number(n) => Ok(n.to_string()),
        _ => Err(format!("`{key}` must be text")),
    }
}

/// [`payload`] on the file's text; `read_ca` reads a `cacert` path.
pub fn from_text(
    text: &str,
    cloud: &str,
    read_ca: &dyn Fn(&str) -> Result<String, Failure>,
) -> Result<Map<String, Value>, String> {
    let doc: Yaml = serde_yaml::from_str(text).map_err(|e| format!("is not YAML: {e}"))?;
    let clouds = doc
        .get("clouds")
        .and_then(Yaml::as_mapping)
        .ok_or("has no `clouds:` mapping")?;
    let names: Vec<String> = clouds
        .keys()
        .filter_map(|k| k.as_str().map(str::to_owned))
        .collect();
    let entry = clouds
        .get(cloud)
        .and_then(Yaml::as_mapping)
        .ok_or_else(|| format!("has no cloud `{cloud}` (it has: {})", names.join(", ")))?;
    let mut out = Map::new();
    for (k, v) in entry {
        let key = k.as_str().unwrap_or_default();
        match key {
            "auth" => {
                let auth = v.as_mapping().ok_or("`auth` must be a mapping")?;
                for (ak, av) in auth {
                    let ak = ak.as_str().unwrap_or_default();
                    if !AUTH_KEYS.contains(&ak) {
                        return Err(format!(
                            "cloud `{cloud}`: `auth.{ak}` is not used by the broker (it takes {}); remove it",
                            AUTH_KEYS.join(", ")
                        ));
                    }
                    out.insert(ak.to_owned(), Value::String(text_of(av, ak)?));
                }
            }
            "auth_type" => {
                let t = text_of(v, key)?;
                if !matches!(
                    t.as_str(),
                    "v3applicationcredential" | "password" | "v3password"
                ) {
                    return Err(format!(
                        "cloud `{cloud}`: auth_type `{t}` is not supported; use an application credential (v3applicationcredential) or a password"
                    ));
                }
            }
            "region_name" => {
                out.insert("region".into(), Value::String(text_of(v, key)?));
            }
            "interface" => {
                out.insert("interface".into(), Value::String(text_of(v, key)?));
            }
            "identity_api_version" => {
                if text_of(v, key)? != "3" {
                    return Err(format!(
                        "cloud `{cloud}`: identity_api_version must be 3 (Keystone v3)"
                    ));
                }
            }
            "cacert" => {
                let ca = read_ca(&text_of(v, key)?).map_err(|e| e.to_string())?;
                out.insert("ca_pem".into(), Value::String(ca));
            }
            "verify" if v.as_bool() == Some(true) => {}
            "verify" => {
                return Err(format!(
                    "cloud `{cloud}`: `verify: false` is refused: the broker always checks the cloud's TLS certificate; give its CA with `cacert`"
                ));
            }
            other => {
                return Err(format!(
                    "cloud `{cloud}`: `{other}` is not used by the broker; remove it (it takes auth, auth_type, region_name, interface, identity_api_version, cacert)"
                ));
            }
        }
    }
    if !out.contains_key("auth_url") {
        return Err(format!("cloud `{cloud}` has no auth.auth_url"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "clouds:
  admin:
    auth:
      auth_url: http://127.0.0.1:5000/v3
      username: admin
      password: s3cret
      project_name: admin
      user_domain_name: Default
      project_domain_name: Default
    region_name: RegionOne
    interface: public
    identity_api_version: 3
  lab:
    auth_type: v3applicationcredential
    auth:
      auth_url: https://keystone.example:5000/v3
      application_credential_id: abc
      application_credential_secret: xyz
    region_name: RegionTwo
    cacert: ca.pem
";

    fn no_ca(_: &str) -> Result<String, Failure> {
        Err(Failure::Usage("no CA here".into()))
    }

    #[test]
    fn an_application_credential_cloud_becomes_the_brokers_payload_with_its_ca() {
        let p = from_text(FILE, "lab", &|path| {
            assert_eq!(path, "ca.pem");
            Ok("PEM".into())
        })
        .unwrap();
        assert_eq!(
            Value::Object(p),
            serde_json::json!({"auth_url": "https://keystone.example:5000/v3",
                "application_credential_id": "abc", "application_credential_secret": "xyz",
                "region": "RegionTwo", "ca_pem": "PEM"})
        );
    }

    #[test]
    fn a_password_cloud_keeps_its_project_and_domains() {
        let p = from_text(FILE, "admin", &no_ca).unwrap();
        assert_eq!(p["username"], "admin");
        assert_eq!(p["project_domain_name"], "Default");
        assert_eq!(p["region"], "RegionOne");
        assert_eq!(p["interface"], "public");
    }

    #[test]
    fn what_the_broker_would_not_use_is_refused_by_name_and_no_secret_is_quoted() {
        let e = from_text(FILE, "nope", &no_ca).unwrap_err();
        assert!(
            e.contains("has no cloud `nope` (it has: admin, lab)"),
            "{e}"
        );
        let insecure = FILE.replace("cacert: ca.pem", "verify: false");
        let e = from_text(&insecure, "lab", &no_ca).unwrap_err();
        assert!(e.contains("`verify: false` is refused"), "{e}");
        let token = FILE.replace("password: s3cret", "token: t0ken");
        let e = from_text(&token, "admin", &no_ca).unwrap_err();
        assert!(e.contains("`auth.token` is not used"), "{e}");
        assert!(!e.contains("t0ken"), "{e}");
        let e = from_text(FILE, "lab", &no_ca).unwrap_err();
        assert!(e.contains("no CA here"), "{e}");
        let v2 = FILE.replace("identity_api_version: 3", "identity_api_version: 2");
        assert!(from_text(&v2, "admin", &no_ca).is_err());
    }
}
