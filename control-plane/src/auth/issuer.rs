//! The OpenID issuer as this server sees it: discovery (cached, refreshed), its JWKS (fetched
//! again on an unknown `kid`, at most every [`JWKS_REFETCH_MIN`]), the code exchange.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

use super::jwt::{self, Claims, Expect, Jwks, TokenError};

/// How long a fetched discovery document is used before it is fetched again.
pub(crate) const DISCOVERY_REFRESH: Duration = Duration::from_secs(3600);
/// The JWKS is fetched again for an unknown `kid` at most this often (a flood of tokens with
/// made-up kids cannot make this server hammer the issuer).
pub(crate) const JWKS_REFETCH_MIN: Duration = Duration::from_secs(30);
/// One request to the issuer may take this long.
pub(crate) const ISSUER_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest discovery, JWKS or token response read from the issuer.
pub(crate) const MAX_ISSUER_RESPONSE: usize = 256 * 1024;

/// A failure talking to the issuer or of its answers.
#[derive(Debug, thiserror::Error)]
pub enum IssuerError {
    #[error("the OpenID issuer {url} could not be reached: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("the OpenID issuer answered {url} with {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("the OpenID issuer's answer from {url} is not what OpenID Connect specifies: {reason}")]
    BadAnswer { url: String, reason: String },
    #[error("{0}")]
    Token(#[from] TokenError),
}

/// The fields of the discovery document this server uses.
#[derive(Debug, Clone, Deserialize)]
pub struct Discovery {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub jwks_uri: String,
    #[serde(default)]
    pub device_authorization_endpoint: Option<String>,
    #[serde(default)]
    pub code_challenge_methods_supported: Option<Vec<String>>,
}

#[derive(Default)]
struct Cache {
    discovery: Option<(Discovery, Instant)>,
    jwks: Option<Jwks>,
    /// The last fetch for an unknown `kid` (the first fetch does not count).
    jwks_refetched: Option<Instant>,
}

/// Whether a URL may be used for the issuer: https, or http on loopback only.
pub(crate) fn allowed_url(url: &str) -> bool {
    if url.starts_with("https://") {
        return true;
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    matches!(host, "127.0.0.1" | "localhost" | "[::1]")
}

/// The issuer client.
pub struct IssuerClient {
    pub issuer: String,
    http: reqwest::Client,
    cache: Mutex<Cache>,
}

impl IssuerClient {
    pub fn new(issuer: String, http: reqwest::Client) -> Self {
        Self {
            issuer: issuer.trim_end_matches('/').to_owned(),
            http,
            cache: Mutex::new(Cache::default()),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn get_json(&self, url: &str) -> Result<Value, IssuerError> {
        let r = self
            .http
            .get(url)
            .timeout(ISSUER_TIMEOUT)
            .send()
            .await
            .map_err(|e| IssuerError::Unreachable {
                url: url.into(),
                reason: e.to_string(),
            })?;
        read_json(url, r).await
    }

    /// The discovery document (cached for [`DISCOVERY_REFRESH`]); its `issuer` must be the
    /// configured one and every endpoint https (or http on loopback).
    pub(crate) async fn discovery(&self) -> Result<Discovery, IssuerError> {
        if let Some((d, at)) = &self.cache().discovery
            && at.elapsed() < DISCOVERY_REFRESH
        {
            return Ok(d.clone());
        }
        let url = format!("{}/.well-known/openid-configuration", self.issuer);
        let v = self.get_json(&url).await?;
        let d: Discovery = serde_json::from_value(v).map_err(|e| IssuerError::BadAnswer {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        if d.issuer.trim_end_matches('/') != self.issuer {
            return Err(IssuerError::BadAnswer {
                url,
                reason: format!("it names the issuer {:?}, not {:?}", d.issuer, self.issuer),
            });
        }
        for e in [&d.authorization_endpoint, &d.token_endpoint, &d.jwks_uri] {
            if !allowed_url(e) {
                return Err(IssuerError::BadAnswer {
                    url,
                    reason: format!("endpoint {e:?} is neither https nor http on loopback"),
                });
            }
        }
        self.cache().discovery = Some((d.clone(), Instant::now()));
        Ok(d)
    }

    async fn fetch_jwks(&self, refetch: bool) -> Result<Jwks, IssuerError> {
        let d = self.discovery().await?;
        let v = self.get_json(&d.jwks_uri).await?;
        let jwks: Jwks = serde_json::from_value(v).map_err(|e| IssuerError::BadAnswer {
            url: d.jwks_uri.clone(),
            reason: e.to_string(),
        })?;
        let mut c = self.cache();
        c.jwks = Some(jwks.clone());
        if refetch {
            c.jwks_refetched = Some(Instant::now());
        }
        Ok(jwks)
    }

    /// Verifies an ID token with the issuer's keys; an unknown `kid` fetches the JWKS again
    /// (rotation), at most every [`JWKS_REFETCH_MIN`].
    pub async fn verify(
        &self,
        token: &str,
        client_id: &str,
        nonce: Option<&str>,
        now: i64,
    ) -> Result<Claims, IssuerError> {
        let expect = Expect {
            issuer: &self.issuer,
            client_id,
            nonce,
            now,
        };
        let cached = self.cache().jwks.clone();
        let jwks = match cached {
            Some(j) => j,
            None => self.fetch_jwks(false).await?,
        };
        match jwt::verify(token, &jwks, &expect) {
            Err(TokenError::UnknownKey(kid)) => {
                let may_refetch = self
                    .cache()
                    .jwks_refetched
                    .is_none_or(|at| at.elapsed() >= JWKS_REFETCH_MIN);
                if !may_refetch {
                    return Err(TokenError::UnknownKey(kid).into());
                }
                let jwks = self.fetch_jwks(true).await?;
                Ok(jwt::verify(token, &jwks, &expect)?)
            }
            other => Ok(other?),
        }
    }

    /// Exchanges an authorization code (with its PKCE verifier) for the ID token.
    pub(crate) async fn exchange_code(
        &self,
        code: &str,
        verifier: &str,
        redirect_uri: &str,
        client_id: &str,
        client_secret: &str,
    ) -> Result<String, IssuerError> {
        let d = self.discovery().await?;
        let form = [
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect_uri),
            ("code_verifier", verifier),
        ];
        let body = form
            .iter()
            .map(|(k, v)| format!("{}={}", url_encode(k), url_encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let r = self
            .http
            .post(&d.token_endpoint)
            .basic_auth(url_encode(client_id), Some(url_encode(client_secret)))
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .timeout(ISSUER_TIMEOUT)
            .send()
            .await
            .map_err(|e| IssuerError::Unreachable {
                url: d.token_endpoint.clone(),
                reason: e.to_string(),
            })?;
        let v = read_json(&d.token_endpoint, r).await?;
        v.get("id_token")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| IssuerError::BadAnswer {
                url: d.token_endpoint.clone(),
                reason: "the token response has no id_token (is `openid` in the client's scopes?)"
                    .into(),
            })
    }
}

async fn read_json(url: &str, r: reqwest::Response) -> Result<Value, IssuerError> {
    let status = r.status();
    if r.content_length()
        .is_some_and(|n| n > MAX_ISSUER_RESPONSE as u64)
    {
        return Err(IssuerError::BadAnswer {
            url: url.into(),
            reason: format!("larger than {MAX_ISSUER_RESPONSE} bytes"),
        });
    }
    let bytes = r.bytes().await.map_err(|e| IssuerError::Unreachable {
        url: url.into(),
        reason: e.to_string(),
    })?;
    if bytes.len() > MAX_ISSUER_RESPONSE {
        return Err(IssuerError::BadAnswer {
            url: url.into(),
            reason: format!("larger than {MAX_ISSUER_RESPONSE} bytes"),
        });
    }
    if !status.is_success() {
        return Err(IssuerError::Status {
            url: url.into(),
            status: status.as_u16(),
            body: String::from_utf8_lossy(&bytes).chars().take(300).collect(),
        });
    }
    serde_json::from_slice(&bytes).map_err(|e| IssuerError::BadAnswer {
        url: url.into(),
        reason: e.to_string(),
    })
}

/// Percent-encoding of a form or query value (RFC 3986 unreserved kept).
pub(crate) fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char);
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_or_loopback_http_issuers() {
        assert!(allowed_url("https://dex.example/dex"));
        assert!(allowed_url("http://127.0.0.1:5556/x"));
        assert!(allowed_url("http://localhost"));
        assert!(!allowed_url("http://dex.example"));
        assert!(!allowed_url("http://127.0.0.1.evil.test/"));
        assert!(!allowed_url("ftp://127.0.0.1"));
    }
}
