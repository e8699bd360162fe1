//! `plexctl login` / `logout` (docs/auth.md): a person signs in through the server's OpenID
//! issuer — the device authorization grant when the issuer offers it, else a loopback
//! redirect (127.0.0.1, PKCE S256, state, nonce) — and plexctl exchanges the ID token at
//! `POST /v1/auth/session` for a bearer session (`pxss_...`), kept in plexctl's config
//! directory (mode 0600) and used instead of the operator token while it is there.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::client::{Api, tls_config};
use crate::config::Settings;
use crate::failure::Failure;
use crate::secret::Secret;

/// The session file's name, beside the config file.
pub const SESSION_FILE: &str = "session.json";
/// The longest a login waits for the person (device code or browser), whatever the issuer says.
pub const MAX_LOGIN_WAIT: Duration = Duration::from_secs(15 * 60);
/// The device grant's polling interval when the issuer names none (RFC 8628: 5 s).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// How much `slow_down` adds to the interval (RFC 8628 3.5).
pub const SLOW_DOWN_STEP: Duration = Duration::from_secs(5);
/// One request to the issuer may take this long.
pub const ISSUER_TIMEOUT: Duration = Duration::from_secs(20);

/// What `plexctl login` keeps.
#[derive(Debug, Serialize, Deserialize)]
pub struct SavedSession {
    /// The server the session is for (it is used only against that server).
    pub server: String,
    pub session: String,
    pub id: String,
    pub expires_at: String,
}

/// Where the session is kept: beside the config file.
pub fn session_path(settings: &Settings) -> Option<PathBuf> {
    settings.session_file.clone()
}

/// The saved session for the configured server, if there is one.
pub fn saved(settings: &Settings) -> Option<SavedSession> {
    let path = session_path(settings)?;
    let text = std::fs::read_to_string(path).ok()?;
    let s: SavedSession = serde_json::from_str(&text).ok()?;
    let server = settings.server_url().ok()?;
    (s.server == server.as_str()).then_some(s)
}

fn write_private(path: &Path, text: &str) -> Result<(), Failure> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Failure::Usage(format!("cannot create {}: {e}", dir.display())))?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| Failure::Usage(format!("cannot write {}: {e}", tmp.display())))?;
    f.write_all(text.as_bytes())
        .map_err(|e| Failure::Usage(format!("cannot write {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| Failure::Usage(format!("cannot write {}: {e}", path.display())))
}

fn login_failed(msg: impl std::fmt::Display) -> Failure {
    Failure::Login(format!("login failed: {msg}"))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn random(n: usize) -> Result<String, Failure> {
    use ring::rand::SecureRandom as _;
    let mut bytes = vec![0u8; n];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| login_failed("the system's random number generator failed"))?;
    Ok(b64(&bytes))
}

fn form(fields: &[(&str, &str)]) -> String {
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

async fn post_form(
    http: &reqwest::Client,
    url: &str,
    fields: &[(&str, &str)],
) -> Result<(u16, Value), Failure> {
    let r = http
        .post(url)
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .body(form(fields))
        .timeout(ISSUER_TIMEOUT)
        .send()
        .await
        .map_err(|e| login_failed(format!("the issuer at {url} did not answer: {e}")))?;
    let status = r.status().as_u16();
    let v = r.json().await.unwrap_or(Value::Null);
    Ok((status, v))
}

/// `plexctl login`: prints where to sign in, waits, and saves the session.
pub async fn login(settings: &Settings, no_device: bool) -> Result<String, Failure> {
    let server = settings.server_url()?;
    let ca_file = settings.ca_file.as_ref().map(|(p, _)| p.as_path());
    let public = Api::new(server.clone(), None, ca_file)?;
    let cfg: Value = public.get(&["v1", "auth", "config"], &[]).await?;
    let (Some(issuer), Some(client_id)) = (cfg["issuer"].as_str(), cfg["cli_client_id"].as_str())
    else {
        return Err(login_failed(format!(
            "{server} has no sign-in for plexctl (no --oidc-issuer or no --oidc-cli-client-id); use an operator token"
        )));
    };
    let http = reqwest::Client::builder()
        .tls_backend_preconfigured(tls_config(ca_file)?)
        .redirect(reqwest::redirect::Policy::none())
        .timeout(ISSUER_TIMEOUT)
        .build()
        .map_err(|e| login_failed(format!("the issuer's HTTP client: {e}")))?;
    let discovery: Value = http
        .get(format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        ))
        .send()
        .await
        .map_err(|e| login_failed(format!("the issuer {issuer} did not answer: {e}")))?
        .json()
        .await
        .map_err(|e| login_failed(format!("the issuer's discovery document: {e}")))?;
    let token_endpoint = discovery["token_endpoint"]
        .as_str()
        .ok_or_else(|| login_failed("the issuer's discovery document has no token_endpoint"))?;
    let id_token = match discovery["device_authorization_endpoint"].as_str() {
        Some(device) if !no_device => {
            device_grant(&http, device, token_endpoint, client_id).await?
        }
        _ => {
            let auth = discovery["authorization_endpoint"]
                .as_str()
                .ok_or_else(|| {
                    login_failed("the issuer's discovery document has no authorization_endpoint")
                })?;
            loopback(&http, auth, token_endpoint, client_id).await?
        }
    };
    let answer: Value = public
        .post(
            &["v1", "auth", "session"],
            Some(&json!({ "id_token": id_token })),
        )
        .await?;
    let saved = SavedSession {
        server: server.to_string(),
        session: answer["session"]
            .as_str()
            .ok_or_else(|| login_failed("the server answered no session"))?
            .to_owned(),
        id: answer["id"].as_str().unwrap_or_default().to_owned(),
        expires_at: answer["expires_at"].as_str().unwrap_or_default().to_owned(),
    };
    let path = session_path(settings).ok_or_else(|| {
        Failure::Usage(
            "no config directory to keep the session in (set HOME or PLEXCTL_CONFIG)".into(),
        )
    })?;
    write_private(&path, &serde_json::to_string(&saved)?)?;
    Ok(format!(
        "signed in: session {} until {} (kept in {}; `plexctl logout` ends it)\n",
        saved.id,
        saved.expires_at,
        path.display()
    ))
}

/// RFC 8628: prints the verification URI and code, polls with the interval, honours
/// `slow_down`, stops at the code's expiry (at most [`MAX_LOGIN_WAIT`]).
async fn device_grant(
    http: &reqwest::Client,
    device: &str,
    token: &str,
    client_id: &str,
) -> Result<String, Failure> {
    let (status, v) = post_form(
        http,
        device,
        &[
            ("client_id", client_id),
            ("scope", "openid email profile groups"),
        ],
    )
    .await?;
    if status != 200 {
        return Err(login_failed(format!(
            "the issuer refused the device authorization ({status}): {v}"
        )));
    }
    let device_code = v["device_code"]
        .as_str()
        .ok_or_else(|| login_failed("no device_code"))?;
    let user_code = v["user_code"].as_str().unwrap_or_default();
    let uri = v["verification_uri"].as_str().unwrap_or_default();
    eprintln!("To sign in, open {uri} and enter the code {user_code}");
    if let Some(complete) = v["verification_uri_complete"].as_str() {
        eprintln!("or open: {complete}");
    }
    let expires = Duration::from_secs(v["expires_in"].as_u64().unwrap_or(600)).min(MAX_LOGIN_WAIT);
    let mut interval = v["interval"]
        .as_u64()
        .map_or(DEFAULT_POLL_INTERVAL, Duration::from_secs);
    let deadline = Instant::now() + expires;
    loop {
        if Instant::now() + interval > deadline {
            return Err(login_failed(
                "the device code expired before it was approved; run `plexctl login` again",
            ));
        }
        tokio::time::sleep(interval).await;
        let (status, v) = post_form(
            http,
            token,
            &[
                ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
                ("device_code", device_code),
                ("client_id", client_id),
            ],
        )
        .await?;
        if status == 200 {
            return v["id_token"]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| login_failed("the issuer answered no id_token"));
        }
        match v["error"].as_str() {
            Some("authorization_pending") => {}
            Some("slow_down") => interval += SLOW_DOWN_STEP,
            Some("access_denied") => {
                return Err(login_failed("the sign-in was denied at the issuer"));
            }
            Some("expired_token") => {
                return Err(login_failed(
                    "the device code expired; run `plexctl login` again",
                ));
            }
            _ => return Err(login_failed(format!("the issuer answered {status}: {v}"))),
        }
    }
}

/// RFC 8252: a loopback redirect on 127.0.0.1:0 with PKCE S256, state and nonce.
async fn loopback(
    http: &reqwest::Client,
    auth: &str,
    token: &str,
    client_id: &str,
) -> Result<String, Failure> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| login_failed(format!("cannot listen on 127.0.0.1 for the redirect: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| login_failed(e.to_string()))?
        .port();
    let redirect = format!("http://127.0.0.1:{port}/callback");
    let (state, nonce, verifier) = (random(32)?, random(32)?, random(48)?);
    let challenge = b64(ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes()).as_ref());
    let sep = if auth.contains('?') { '&' } else { '?' };
    let url = format!(
        "{auth}{sep}{}",
        form(&[
            ("response_type", "code"),
            ("client_id", client_id),
            ("redirect_uri", &redirect),
            ("scope", "openid email profile groups"),
            ("state", &state),
            ("nonce", &nonce),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
        ])
    );
    eprintln!("To sign in, open: {url}");
    let code = tokio::time::timeout(MAX_LOGIN_WAIT, async {
        loop {
            let (mut conn, _) = listener.accept().await.map_err(|e| login_failed(e.to_string()))?;
            let mut buf = vec![0u8; 8192];
            let n = conn.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            let target = head.split_whitespace().nth(1).unwrap_or_default().to_owned();
            let query: Vec<(String, String)> = target
                .split_once('?')
                .map(|(_, q)| {
                    q.split('&')
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (k.to_owned(), unenc(v)))
                        .collect()
                })
                .unwrap_or_default();
            let get = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            let ok = get("state").as_deref() == Some(state.as_str()) && get("code").is_some();
            let body = if ok { "Signed in; you can close this page." } else { "This is not the sign-in plexctl started." };
            let _ = conn
                .write_all(format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()).as_bytes())
                .await;
            if ok {
                return get("code").ok_or_else(|| login_failed("no code"));
            }
            if let Some(e) = get("error") {
                return Err(login_failed(format!("the issuer refused the sign-in: {e}")));
            }
        }
    })
    .await
    .map_err(|_| login_failed("nobody signed in within 15 minutes"))??;
    let (status, v) = post_form(
        http,
        token,
        &[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("redirect_uri", &redirect),
            ("client_id", client_id),
            ("code_verifier", &verifier),
        ],
    )
    .await?;
    let id_token = v["id_token"]
        .as_str()
        .ok_or_else(|| login_failed(format!("the issuer answered {status}: {v}")))?;
    // The server verifies the signature; the nonce only plexctl knows.
    let payload = id_token.split('.').nth(1).unwrap_or_default();
    let claims: Value = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    if claims["nonce"].as_str() != Some(nonce.as_str()) {
        return Err(login_failed("the ID token's nonce is not this sign-in's"));
    }
    Ok(id_token.to_owned())
}

fn unenc(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `plexctl logout`: revokes the session at the server and deletes the file.
pub async fn logout(settings: &Settings) -> Result<String, Failure> {
    let Some(path) = session_path(settings) else {
        return Ok("not signed in\n".into());
    };
    let Some(s) = saved(settings) else {
        let _ = std::fs::remove_file(&path);
        return Ok("not signed in\n".into());
    };
    let server = settings.server_url()?;
    let ca_file = settings.ca_file.as_ref().map(|(p, _)| p.as_path());
    let api = Api::new(server, Some(Secret::new(s.session.clone())), ca_file)?;
    let revoked: Result<Value, _> = api
        .post::<(), Value>(&["v1", "auth", "sign-out"], None)
        .await;
    std::fs::remove_file(&path)
        .map_err(|e| Failure::Usage(format!("cannot delete {}: {e}", path.display())))?;
    match revoked {
        Ok(_) => Ok(format!("signed out: session {} revoked\n", s.id)),
        Err(e) => Ok(format!("session file deleted; the server said: {e}\n")),
    }
}
