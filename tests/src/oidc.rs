//! The real OpenID Provider of the end-to-end tests and a headless browser for it.
//!
//! [`Issuer::start`] runs `tests/oidc/provider.mjs` (the certified npm `oidc-provider` on
//! Debian's nodejs; scripts/deps.sh installs it into /var/cache/plexsphere/oidc-provider) on a
//! free loopback port. Its users are [`USERS`] (alice: groups ["ops"], bob: ["dev"], mallory:
//! none), password `<user>-password`. Its clients: the console's (confidential; any https
//! loopback `/v1/auth/callback` on any port) and plexctl's (public, native, device grant).
//!
//! [`Browser`] signs in the way a person would, without a browser: it follows the redirects,
//! keeps the cookies and posts the issuer's plain HTML forms (login, consent, device code).
//!
//! [`call`] and [`bind_role`] talk to the control plane's API with a bearer token or a
//! browser's cookies (and CSRF header), for the sign-in and console tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use reqwest::Url;
use serde_json::{Value, json};

use crate::process::{Proc, STARTUP_BOUND};

/// The test users the provider knows.
pub const USERS: [&str; 3] = ["alice", "bob", "mallory"];
/// The console's client id at the provider.
pub const CONSOLE_CLIENT_ID: &str = "plexsphere-console";
/// plexctl's client id at the provider (public, no secret).
pub const CLI_CLIENT_ID: &str = "plexctl";
/// How many redirects and form posts one sign-in may take before the harness gives up.
pub const MAX_STEPS: usize = 20;
/// How long one request to the provider or the control plane may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// Where scripts/deps.sh installs the provider's npm packages.
pub const DEFAULT_MODULES: &str = "/var/cache/plexsphere/oidc-provider";

/// The password of a test user.
pub fn password(user: &str) -> String {
    format!("{user}-password")
}

/// A running provider.
pub struct Issuer {
    proc: Proc,
    /// `http://127.0.0.1:PORT`, the `iss` of its tokens.
    pub url: String,
    /// The console client's secret; also in [`Issuer::secret_file`].
    pub console_client_secret: String,
    /// A file holding the console client's secret (for `--oidc-client-secret-file`).
    pub secret_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Issuer {
    /// Starts the provider on a free loopback port and waits until it serves.
    pub fn start() -> Result<Self> {
        let dir = tempfile::tempdir().context("a directory for the provider")?;
        let secret = format!("console-secret-{}", std::process::id());
        let secret_file = dir.path().join("console-client-secret");
        std::fs::write(&secret_file, &secret).context("writing the client secret")?;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("oidc/provider.mjs");
        let modules =
            std::env::var("PLEXSPHERE_OIDC_MODULES").unwrap_or_else(|_| DEFAULT_MODULES.into());
        let mut cmd = Command::new("node");
        cmd.arg(&script)
            .args(["--port", "0"])
            .arg("--keys")
            .arg(dir.path().join("keys.json"))
            .args(["--console-client-id", CONSOLE_CLIENT_ID])
            .args(["--console-client-secret", &secret])
            .args(["--cli-client-id", CLI_CLIENT_ID])
            .args(["--modules", &modules]);
        let proc = Proc::spawn(cmd).context("starting node (scripts/deps.sh installs nodejs)")?;
        let line = proc
            .wait_for_line(STARTUP_BOUND, |l| l.starts_with("listening on "))
            .context("the OpenID provider did not start (run scripts/deps.sh)")?;
        let url = line.trim_start_matches("listening on ").trim().to_owned();
        Ok(Self {
            proc,
            url,
            console_client_secret: secret,
            secret_file,
            _dir: dir,
        })
    }

    /// Everything the provider printed so far.
    pub fn output(&self) -> String {
        self.proc.output()
    }

    /// Replaces the provider's signing keys (new kids; the old keys leave its JWKS).
    pub async fn rotate_keys(&self) -> Result<Vec<String>> {
        let v: Value = self
            .test_api("rotate-keys", json!({}))
            .await?
            .json()
            .await?;
        let kids = v["kids"]
            .as_array()
            .context("rotate-keys answered no kids")?;
        Ok(kids
            .iter()
            .filter_map(|k| k.as_str().map(str::to_owned))
            .collect())
    }

    /// A compact JWS over `claims`: `key` is "current" (the provider's own key for
    /// `header.alg`), "foreign" (a key it never published, with its current kid) or "none"
    /// (unsigned, `alg: none`).
    pub async fn sign(&self, header: Value, claims: Value, key: &str) -> Result<String> {
        let r = self
            .test_api(
                "sign",
                json!({ "header": header, "claims": claims, "key": key }),
            )
            .await?;
        Ok(r.text().await?)
    }

    async fn test_api(&self, what: &str, body: Value) -> Result<reqwest::Response> {
        let r = http_client(None, false)?
            .post(format!("{}/test/{what}", self.url))
            .json(&body)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .with_context(|| format!("the provider's /test/{what}"))?;
        if !r.status().is_success() {
            bail!("/test/{what}: {} {}", r.status(), r.text().await?);
        }
        Ok(r)
    }
}

/// One response as the harness saw it (redirects are not followed).
#[derive(Debug, Clone)]
pub struct Page {
    pub url: Url,
    pub status: u16,
    /// The `Location` resolved against `url`, for a redirect.
    pub location: Option<Url>,
    pub body: String,
}

/// A cookie-keeping HTTP client that follows an OpenID sign-in headlessly.
///
/// Its jar is deliberately small: cookies by name, for every host and path (the tests talk
/// to one provider and one control plane on loopback, whose cookie names differ), deleted by
/// `Max-Age=0`.
pub struct Browser {
    http: reqwest::Client,
    jar: BTreeMap<String, String>,
}

impl Browser {
    /// A browser that trusts the lab CA in `ca_file` (for the control plane's HTTPS), if any.
    pub fn new(ca_file: Option<&Path>) -> Result<Self> {
        Ok(Self {
            http: http_client(ca_file, false)?,
            jar: BTreeMap::new(),
        })
    }

    /// A cookie's value, if the jar has it.
    pub fn cookie(&self, name: &str) -> Option<&str> {
        self.jar.get(name).map(String::as_str)
    }

    /// Sets (or with `None` removes) a cookie, e.g. to replay one in another browser.
    pub fn set_cookie(&mut self, name: &str, value: Option<&str>) {
        match value {
            Some(v) => self.jar.insert(name.to_owned(), v.to_owned()),
            None => self.jar.remove(name),
        };
    }

    /// The underlying client (no cookies, no redirects followed).
    pub fn client(&self) -> &reqwest::Client {
        &self.http
    }

    /// `Cookie:` header value for the jar.
    pub fn cookie_header(&self) -> String {
        self.jar
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// GET `url` with the jar; redirects are not followed.
    pub async fn get(&mut self, url: &str) -> Result<Page> {
        let url = Url::parse(url).with_context(|| format!("not a URL: {url}"))?;
        self.request(reqwest::Method::GET, url, None).await
    }

    /// POST a form to `url` with the jar; redirects are not followed.
    pub async fn post_form(&mut self, url: &str, form: &[(String, String)]) -> Result<Page> {
        let url = Url::parse(url).with_context(|| format!("not a URL: {url}"))?;
        self.request(reqwest::Method::POST, url, Some(form)).await
    }

    async fn request(
        &mut self,
        method: reqwest::Method,
        url: Url,
        form: Option<&[(String, String)]>,
    ) -> Result<Page> {
        let mut req = self
            .http
            .request(method.clone(), url.clone())
            .timeout(REQUEST_TIMEOUT);
        if !self.jar.is_empty() {
            req = req.header(reqwest::header::COOKIE, self.cookie_header());
        }
        if let Some(form) = form {
            let body = form_body(form);
            req = req
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .body(body);
        }
        let r = req
            .send()
            .await
            .with_context(|| format!("{method} {url}"))?;
        for sc in r.headers().get_all(reqwest::header::SET_COOKIE) {
            if let Ok(sc) = sc.to_str() {
                self.store(sc);
            }
        }
        let status = r.status().as_u16();
        let location = r
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .and_then(|l| url.join(l).ok());
        let body = r.text().await.unwrap_or_default();
        Ok(Page {
            url,
            status,
            location,
            body,
        })
    }

    fn store(&mut self, set_cookie: &str) {
        let mut parts = set_cookie.split(';');
        let Some((name, value)) = parts.next().and_then(|nv| nv.split_once('=')) else {
            return;
        };
        let gone = parts.any(|a| {
            let a = a.trim().to_ascii_lowercase();
            a == "max-age=0" || a.starts_with("expires=thu, 01 jan 1970")
        });
        if gone || value.is_empty() {
            self.jar.remove(name.trim());
        } else {
            self.jar
                .insert(name.trim().to_owned(), value.trim().to_owned());
        }
    }

    /// Signs `user` in: starts at `start` (e.g. the control plane's `/v1/auth/sign-in`, or an
    /// authorization URL), follows the redirects to the issuer, posts its login and consent
    /// forms, and returns the first redirect that leaves the issuer (the client's callback
    /// with `code` and `state`) WITHOUT requesting it.
    pub async fn sign_in(&mut self, issuer: &str, start: &str, user: &str) -> Result<Url> {
        let issuer = Url::parse(issuer).context("the issuer URL")?;
        let mut page = self.get(start).await?;
        let mut at_issuer = same_origin(&page.url, &issuer);
        for _ in 0..MAX_STEPS {
            if let Some(next) = page.location.clone() {
                if at_issuer && !same_origin(&next, &issuer) {
                    return Ok(next);
                }
                at_issuer |= same_origin(&next, &issuer);
                page = self.request(reqwest::Method::GET, next, None).await?;
                continue;
            }
            page = self.submit(&page, user).await?;
        }
        bail!("the sign-in took more than {MAX_STEPS} steps")
    }

    /// Approves a device authorization as `user`: opens `verification_uri_complete`, confirms
    /// the code, signs in and consents, until the provider's success page.
    pub async fn approve_device(
        &mut self,
        verification_uri_complete: &str,
        user: &str,
    ) -> Result<()> {
        let mut page = self.get(verification_uri_complete).await?;
        for _ in 0..MAX_STEPS {
            if let Some(next) = page.location.clone() {
                page = self.request(reqwest::Method::GET, next, None).await?;
                continue;
            }
            if page.body.contains("id=\"device-success\"") {
                return Ok(());
            }
            page = self.submit(&page, user).await?;
        }
        bail!("the device approval took more than {MAX_STEPS} steps")
    }

    /// Posts the page's first form, filling `login` and `password` for `user`.
    async fn submit(&mut self, page: &Page, user: &str) -> Result<Page> {
        let Some(form) = parse_form(&page.body) else {
            bail!(
                "{} answered {} with no form and no redirect: {}",
                page.url,
                page.status,
                page.body.chars().take(400).collect::<String>()
            );
        };
        let fields = form
            .fields
            .into_iter()
            .map(|(k, v)| match k.as_str() {
                "login" => (k, user.to_owned()),
                "password" => (k, password(user)),
                _ => (k, v),
            })
            .collect::<Vec<_>>();
        let action = page
            .url
            .join(&form.action)
            .with_context(|| format!("the form's action {}", form.action))?;
        self.request(reqwest::Method::POST, action, Some(&fields))
            .await
    }
}

/// An HTTP client for the provider (plain HTTP on loopback) and, with `ca_file`, the control
/// plane's HTTPS under the lab CA; `follow` redirects or not.
pub fn http_client(ca_file: Option<&Path>, follow: bool) -> Result<reqwest::Client> {
    let roots = match ca_file {
        Some(ca) => {
            let trust = plexsphere_tls_client::Trust {
                system_store: false,
                ca_files: vec![ca.to_owned()],
                pin: None,
            };
            return reqwest::Client::builder()
                .redirect(redirect_policy(follow))
                .connect_timeout(Duration::from_secs(5))
                .tls_backend_preconfigured(
                    plexsphere_tls_client::client_config(
                        &trust,
                        plexsphere_tls_client::ALPN_H2_HTTP1,
                    )
                    .context("the lab CA")?,
                )
                .build()
                .context("building an HTTP client");
        }
        None => rustls::RootCertStore::empty(),
    };
    let config = rustls::ClientConfig::builder_with_provider(plexsphere_tls_client::provider())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .redirect(redirect_policy(follow))
        .connect_timeout(Duration::from_secs(5))
        .tls_backend_preconfigured(config)
        .build()
        .context("building an HTTP client")
}

fn redirect_policy(follow: bool) -> reqwest::redirect::Policy {
    if follow {
        reqwest::redirect::Policy::limited(MAX_STEPS)
    } else {
        reqwest::redirect::Policy::none()
    }
}

fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// An `application/x-www-form-urlencoded` body (reqwest here is built without its `form`).
pub fn form_body<K: AsRef<str>, V: AsRef<str>>(fields: &[(K, V)]) -> String {
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", form_encode(k.as_ref()), form_encode(v.as_ref())))
        .collect::<Vec<_>>()
        .join("&")
}

/// POST a form with `http`; the response as it comes.
pub async fn post_form<K: AsRef<str>, V: AsRef<str>>(
    http: &reqwest::Client,
    url: &str,
    basic: Option<(&str, &str)>,
    fields: &[(K, V)],
) -> Result<reqwest::Response> {
    let mut req = http
        .post(url)
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .timeout(REQUEST_TIMEOUT)
        .body(form_body(fields));
    if let Some((user, pass)) = basic {
        req = req.basic_auth(form_encode(user), Some(form_encode(pass)));
    }
    req.send().await.with_context(|| format!("POST {url}"))
}

fn form_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A form's action and its named inputs.
struct Form {
    action: String,
    fields: Vec<(String, String)>,
}

/// The first `<form>` of a page, with its `<input>`s (enough for the provider's plain pages).
fn parse_form(html: &str) -> Option<Form> {
    let start = html.find("<form")?;
    let rest = &html[start..];
    let end = rest.find("</form>").unwrap_or(rest.len());
    let body = &rest[..end];
    let tag_end = body.find('>')?;
    let action = attr(&body[..tag_end], "action").unwrap_or_default();
    let mut fields = Vec::new();
    let mut tail = &body[tag_end..];
    while let Some(i) = tail.find("<input") {
        let t = &tail[i..];
        let close = t.find('>').unwrap_or(t.len());
        let tag = &t[..close];
        if let Some(name) = attr(tag, "name") {
            fields.push((name, attr(tag, "value").unwrap_or_default()));
        }
        tail = &t[close..];
    }
    Some(Form { action, fields })
}

fn attr(tag: &str, name: &str) -> Option<String> {
    let pat = format!(" {name}=\"");
    let i = tag.find(&pat)? + pat.len();
    let j = tag[i..].find('"')? + i;
    Some(unescape(&tag[i..j]))
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        let Some(semi) = after.find(';') else {
            out.push_str(after);
            return out;
        };
        let entity = &after[1..semi];
        let ch = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            e if e.starts_with("#x") => u32::from_str_radix(&e[2..], 16)
                .ok()
                .and_then(char::from_u32),
            e if e.starts_with('#') => e[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match ch {
            Some(c) => {
                out.push(c);
                rest = &after[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

// ---- Calls to the control plane, as a person (cookies, CSRF) or a token ----

/// How a call to the control plane authenticates.
pub enum Auth<'a> {
    Bearer(&'a str),
    Cookie {
        jar: &'a str,
        csrf: Option<&'a str>,
    },
    Origin {
        jar: &'a str,
        csrf: &'a str,
        origin: &'a str,
    },
}

/// One call to the control plane's API: its status and its JSON body (or the text, as a
/// JSON string, when the body is not JSON).
pub async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    auth: Auth<'_>,
    body: Option<Value>,
) -> Result<(u16, Value)> {
    let mut req = http.request(method, url).timeout(REQUEST_TIMEOUT);
    req = match auth {
        Auth::Bearer(t) => req.bearer_auth(t),
        Auth::Cookie { jar, csrf } => {
            let r = req.header("cookie", jar);
            match csrf {
                Some(c) => r.header("x-plexsphere-csrf", c),
                None => r,
            }
        }
        Auth::Origin { jar, csrf, origin } => req
            .header("cookie", jar)
            .header("x-plexsphere-csrf", csrf)
            .header("origin", origin),
    };
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await?;
    let status = r.status().as_u16();
    let text = r.text().await?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

/// A role binding to make (`POST /v1/role-bindings`).
pub struct RoleBinding<'a> {
    pub role: &'a str,
    /// `platform`, `domain` or `project`.
    pub scope: &'a str,
    pub scope_id: Option<&'a str>,
    /// `subject`, `email` or `group`.
    pub kind: &'a str,
    pub who: &'a str,
}

/// Binds a role with the `admin` token of the control plane at `base`; answers the binding's id.
pub async fn bind_role(
    http: &reqwest::Client,
    base: &str,
    admin: &str,
    b: RoleBinding<'_>,
) -> Result<String> {
    let body = json!({"role": b.role, "scope": b.scope, "scope_id": b.scope_id, "principal_kind": b.kind, "principal": b.who});
    let url = format!("{base}/v1/role-bindings");
    let (status, v) = call(
        http,
        reqwest::Method::POST,
        &url,
        Auth::Bearer(admin),
        Some(body),
    )
    .await?;
    anyhow::ensure!(
        status == 201,
        "binding {} as {}: {status} {v}",
        b.who,
        b.role
    );
    Ok(v["id"].as_str().context("a binding id")?.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_device_confirm_form() {
        let html = r#"<form id="op.deviceConfirmForm" method="post" action="http://127.0.0.1:1/device">
<input type="hidden" name="xsrf" value="e9&amp;3"/>
<input type="hidden" name="confirm" value="yes"/>
</form><button type="submit" form="op.deviceConfirmForm">Continue</button>"#;
        let f = parse_form(html).expect("a form");
        assert_eq!(f.action, "http://127.0.0.1:1/device");
        assert_eq!(
            f.fields,
            vec![
                ("xsrf".to_owned(), "e9&3".to_owned()),
                ("confirm".to_owned(), "yes".to_owned())
            ]
        );
    }
}
