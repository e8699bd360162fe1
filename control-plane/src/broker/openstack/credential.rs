//! The OpenStack cloud credential: the opened payload of a `--provider openstack` cloud
//! credential, a JSON object. Parsing is strict (unknown fields are refused) and every error
//! names the field; `Debug` never shows a secret.
//!
//! ```json
//! {"auth_url": "https://keystone.example:5000/v3", "region": "RegionOne",
//!  "application_credential_id": "...", "application_credential_secret": "..."}
//! ```
//!
//! Sign-in is one of: an application credential by id (`application_credential_id` +
//! `application_credential_secret`), by name (`application_credential_name` + `username` +
//! `user_domain_name` + the secret), or a password (`username` + `password` +
//! `user_domain_name` (default `Default`) + `project_name` with `project_domain_name` (default
//! `Default`) or `project_id`). `region` is optional when the catalog has one region;
//! `interface` defaults to `public`; `ca_pem` is a CA the cloud's TLS chains to (else the
//! system's roots).

use serde::Deserialize;

/// A secret string whose `Debug` is redacted.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(String);

impl Secret {
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Which project a password sign-in is scoped to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Project {
    Id(String),
    Name { name: String, domain_name: String },
}

/// How the broker signs in to Keystone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Auth {
    ApplicationCredentialId {
        id: String,
        secret: Secret,
    },
    ApplicationCredentialName {
        name: String,
        username: String,
        user_domain_name: String,
        secret: Secret,
    },
    Password {
        username: String,
        user_domain_name: String,
        password: Secret,
        project: Project,
    },
}

/// One parsed OpenStack cloud credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenStackCredential {
    /// Keystone v3, e.g. `https://keystone.example:5000/v3`.
    pub auth_url: String,
    /// The catalog region; `None`: the catalog's only one.
    pub region: Option<String>,
    /// The endpoint interface: `public`, `internal` or `admin`.
    pub interface: String,
    pub auth: Auth,
    /// A PEM CA the cloud's TLS chains to.
    pub ca_pem: Option<String>,
}

impl OpenStackCredential {
    /// Who signs in, for messages: the application credential's id, its name and user, or the
    /// user name. Never a secret.
    pub(crate) fn who(&self) -> String {
        match &self.auth {
            Auth::ApplicationCredentialId { id, .. } => id.clone(),
            Auth::ApplicationCredentialName { name, username, .. } => {
                format!("{name} (user {username})")
            }
            Auth::Password { username, .. } => format!("user {username}"),
        }
    }
}

/// The payload as written. Every field optional here; [`parse`] says which are missing.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    auth_url: Option<String>,
    region: Option<String>,
    interface: Option<String>,
    application_credential_id: Option<String>,
    application_credential_name: Option<String>,
    application_credential_secret: Option<String>,
    username: Option<String>,
    password: Option<String>,
    user_domain_name: Option<String>,
    project_name: Option<String>,
    project_id: Option<String>,
    project_domain_name: Option<String>,
    ca_pem: Option<String>,
}

/// The fields a payload may have, for the unknown-field error.
const FIELDS: &str = "auth_url, region, interface, application_credential_id, application_credential_name, application_credential_secret, username, password, user_domain_name, project_name, project_id, project_domain_name, ca_pem";

/// The longest payload accepted (a CA bundle fits many times over).
pub(crate) const MAX_PAYLOAD_BYTES: usize = 256 * 1024;

/// Parses an opened OpenStack credential payload. The error names the missing, unknown or
/// conflicting field (and never echoes a value).
pub(crate) fn parse(bytes: &[u8]) -> Result<OpenStackCredential, String> {
    if bytes.len() > MAX_PAYLOAD_BYTES {
        return Err(format!(
            "the OpenStack credential is {} bytes, more than the {MAX_PAYLOAD_BYTES} accepted",
            bytes.len()
        ));
    }
    let raw: Raw = serde_json::from_slice(bytes).map_err(|e| {
        let e = e.to_string();
        if let Some(rest) = e.strip_prefix("unknown field ") {
            let field = rest.split(',').next().unwrap_or(rest);
            format!("the OpenStack credential has an unknown field {field}; it accepts {FIELDS}")
        } else {
            format!(
                "the OpenStack credential must be a JSON object of strings ({FIELDS}): {}",
                e.split(" at line").next().unwrap_or(&e)
            )
        }
    })?;
    let nonempty = |field: &str, v: Option<String>| -> Result<Option<String>, String> {
        match v {
            Some(s) if s.trim().is_empty() => Err(format!(
                "the OpenStack credential's field {field} is empty; give it a value or leave it out"
            )),
            other => Ok(other),
        }
    };
    let auth_url = nonempty("auth_url", raw.auth_url)?.ok_or_else(|| {
        "the OpenStack credential needs auth_url (Keystone v3, e.g. https://keystone.example:5000/v3)"
            .to_owned()
    })?;
    let url = reqwest::Url::parse(&auth_url).map_err(|e| {
        format!("the OpenStack credential's auth_url is not a URL ({e}); give Keystone's v3 URL")
    })?;
    if !matches!(url.scheme(), "https" | "http") || url.host_str().is_none() {
        return Err(
            "the OpenStack credential's auth_url must be an http(s) URL with a host".to_owned(),
        );
    }
    let interface = nonempty("interface", raw.interface)?.unwrap_or_else(|| "public".to_owned());
    if !matches!(interface.as_str(), "public" | "internal" | "admin") {
        return Err(format!(
            "the OpenStack credential's interface is {interface:?}; use public, internal or admin"
        ));
    }
    let region = nonempty("region", raw.region)?;
    let ca_pem = nonempty("ca_pem", raw.ca_pem)?;
    if let Some(pem) = &ca_pem
        && !pem.contains("-----BEGIN CERTIFICATE-----")
    {
        return Err("the OpenStack credential's ca_pem holds no PEM certificate (no BEGIN CERTIFICATE line)".to_owned());
    }
    let app_id = nonempty("application_credential_id", raw.application_credential_id)?;
    let app_name = nonempty(
        "application_credential_name",
        raw.application_credential_name,
    )?;
    let app_secret = nonempty(
        "application_credential_secret",
        raw.application_credential_secret,
    )?;
    let username = nonempty("username", raw.username)?;
    let password = nonempty("password", raw.password)?;
    let user_domain_name = nonempty("user_domain_name", raw.user_domain_name)?;
    let project_name = nonempty("project_name", raw.project_name)?;
    let project_id = nonempty("project_id", raw.project_id)?;
    let project_domain_name = nonempty("project_domain_name", raw.project_domain_name)?;

    let auth = if app_id.is_some() || app_name.is_some() || app_secret.is_some() {
        for (field, set) in [
            ("password", password.is_some()),
            ("project_name", project_name.is_some()),
            ("project_id", project_id.is_some()),
            ("project_domain_name", project_domain_name.is_some()),
        ] {
            if set {
                return Err(format!(
                    "the OpenStack credential mixes an application credential with {field}; an application credential is bound to its project, so drop {field}"
                ));
            }
        }
        let secret = Secret(app_secret.ok_or_else(|| {
            "the OpenStack credential needs application_credential_secret with its application credential".to_owned()
        })?);
        match (app_id, app_name) {
            (Some(_), Some(_)) => {
                return Err("the OpenStack credential has both application_credential_id and application_credential_name; keep one".to_owned());
            }
            (Some(id), None) => Auth::ApplicationCredentialId { id, secret },
            (None, Some(name)) => Auth::ApplicationCredentialName {
                name,
                username: username.ok_or_else(|| {
                    "the OpenStack credential needs username with application_credential_name (or give application_credential_id instead)".to_owned()
                })?,
                user_domain_name: user_domain_name.ok_or_else(|| {
                    "the OpenStack credential needs user_domain_name with application_credential_name".to_owned()
                })?,
                secret,
            },
            (None, None) => {
                return Err("the OpenStack credential needs application_credential_id (or application_credential_name) with its application_credential_secret".to_owned());
            }
        }
    } else {
        let username = username.ok_or_else(|| {
            "the OpenStack credential needs application_credential_id and application_credential_secret, or username and password".to_owned()
        })?;
        let password = Secret(password.ok_or_else(|| {
            "the OpenStack credential needs password with username (or an application credential instead)".to_owned()
        })?);
        let project = match (project_id, project_name) {
            (Some(_), Some(_)) => {
                return Err(
                    "the OpenStack credential has both project_id and project_name; keep one"
                        .to_owned(),
                );
            }
            (Some(id), None) => {
                if project_domain_name.is_some() {
                    return Err("the OpenStack credential's project_domain_name goes with project_name, not project_id; drop it".to_owned());
                }
                Project::Id(id)
            }
            (None, Some(name)) => Project::Name {
                name,
                domain_name: project_domain_name.unwrap_or_else(|| "Default".to_owned()),
            },
            (None, None) => {
                return Err("the OpenStack credential needs project_name or project_id with a password sign-in".to_owned());
            }
        };
        Auth::Password {
            username,
            user_domain_name: user_domain_name.unwrap_or_else(|| "Default".to_owned()),
            password,
            project,
        }
    };
    Ok(OpenStackCredential {
        auth_url,
        region,
        interface,
        auth,
        ca_pem,
    })
}

#[cfg(test)]
#[path = "credential_tests.rs"]
mod tests;
