//! The HTTP client plexd talks to the control plane with, and how its failures read.

use std::path::PathBuf;
use std::time::Duration;

use plexsphere_wire::proof::{
    Challenge, REGISTER_CHALLENGE_PATH, RegisterChallengeRequest, prove_register,
};
use plexsphere_wire::secret::BootstrapToken;
use plexsphere_wire::{ApiError, REGISTER_PATH, RegisterRequest, RegisterResponse};

use crate::config::ApiUrl;
use crate::tls::{self, TlsError, TrustSources};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const H2_PING_INTERVAL: Duration = Duration::from_secs(10);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of an unexpected body an error message quotes.
const BODY_QUOTE: usize = 200;

/// A client for one control plane.
#[derive(Debug, Clone)]
pub struct ApiClient {
    base: ApiUrl,
    http: reqwest::Client,
    /// The same trust, without the whole-request timeout: the event stream stays open.
    stream_http: reqwest::Client,
    /// Named in the "not trusted" message (`/etc/plexd/ca.crt`).
    dropped_ca: PathBuf,
}

/// What `POST /v1/register` answered.
#[derive(Debug)]
pub enum RegisterAnswer {
    /// 201 (a new node) or 200 (a replay by the same key).
    Registered {
        status: u16,
        response: RegisterResponse,
    },
    /// Any refusal, with the server's code and message.
    Refused {
        status: u16,
        error: ApiError,
        retry_after: Option<Duration>,
    },
}

/// What one unauthenticated POST answered.
enum Answer<R> {
    Ok {
        status: u16,
        response: R,
    },
    Refused {
        status: u16,
        error: ApiError,
        retry_after: Option<Duration>,
    },
}

/// A control plane without `POST /v1/register/challenge` (404 or 405) is older than this
/// plexd: say so instead of "no such endpoint".
fn older_server(status: u16, error: ApiError) -> ApiError {
    if status == 404 || status == 405 {
        return ApiError::new(
            "challenge_unsupported",
            format!(
                "the control plane has no {REGISTER_CHALLENGE_PATH} ({}): it is older than this plexd, which proves its WireGuard key at registration; upgrade the control plane or use a plexd of its version",
                error.code
            ),
        );
    }
    error
}

/// The API could not be asked at all.
#[derive(Debug, thiserror::Error)]
pub enum ApiClientError {
    #[error(
        "the API at {url} is not trusted: {reason}; install its CA (see {dropped_ca} or --ca-file) or check tls.ca_sha256"
    )]
    NotTrusted {
        url: String,
        reason: String,
        dropped_ca: String,
    },
    #[error(
        "the API at {url} is not reachable: {reason}; check the address, DNS, and that outbound TCP to it is open"
    )]
    Unreachable { url: String, reason: String },
    #[error(
        "the API at {url} answered HTTP {status} with a body plexd does not understand: {reason}"
    )]
    BadAnswer {
        url: String,
        status: u16,
        reason: String,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot build the HTTP client: {0}")]
    Build(String),
}

impl ApiClient {
    pub fn new(
        base: ApiUrl,
        trust: &TrustSources,
        dropped_ca: PathBuf,
    ) -> Result<Self, ApiClientError> {
        let tls = tls::client_config(trust)?;
        let builder = |tls: rustls::ClientConfig| {
            reqwest::Client::builder()
                .tls_backend_preconfigured(tls)
                .connect_timeout(CONNECT_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("plexd/", env!("CARGO_PKG_VERSION")))
        };
        // Calls share one connection (HTTP/2 when offered). Pings find a connection that went
        // silent (a proxy that holds it open without forwarding), so it is dropped instead of
        // stalling every later call until its timeout.
        let http = builder(tls.clone())
            .timeout(REQUEST_TIMEOUT)
            .http2_keep_alive_interval(Some(H2_PING_INTERVAL))
            .http2_keep_alive_timeout(H2_PING_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .build()
            .map_err(|e| ApiClientError::Build(e.to_string()))?;
        // The event stream gets a connection of its own for every attempt (HTTP/1.1, no idle
        // pool): after a stall the next attempt dials afresh instead of reusing a dead
        // connection.
        let stream_tls = plexsphere_tls_client::with_alpn(tls, plexsphere_tls_client::ALPN_HTTP1);
        let stream_http = builder(stream_tls)
            .http1_only()
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| ApiClientError::Build(e.to_string()))?;
        Ok(Self {
            base,
            http,
            stream_http,
            dropped_ca,
        })
    }

    pub fn base(&self) -> &ApiUrl {
        &self.base
    }

    /// The client for bounded calls (30 s per request).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The client for the event stream (no whole-request timeout).
    pub(crate) fn stream_http(&self) -> &reqwest::Client {
        &self.stream_http
    }

    /// `POST /v1/register/challenge` then `POST /v1/register` with the proof that this node
    /// holds `secret`, the WireGuard private key of `req.wireguard_public_key` (the request's
    /// `nonce` and `proof` are filled here). A refusal of either is an answer, not an error.
    pub async fn register(
        &self,
        req: &RegisterRequest,
        secret: &[u8; 32],
    ) -> Result<RegisterAnswer, ApiClientError> {
        let ask = RegisterChallengeRequest {
            bootstrap_token: req.bootstrap_token.clone(),
        };
        let challenge: Challenge = match self.post_public(REGISTER_CHALLENGE_PATH, &ask).await? {
            Answer::Ok { response, .. } => response,
            Answer::Refused {
                status,
                error,
                retry_after,
            } => {
                return Ok(RegisterAnswer::Refused {
                    status,
                    error: older_server(status, error),
                    retry_after,
                });
            }
        };
        let server = plexsphere_wire::key::PublicKey::from_base64(&challenge.server_public_key)
            .map_err(|_| ApiClientError::BadAnswer {
                url: self.base.to_string(),
                status: 200,
                reason: "the challenge's server_public_key is not base64 of 32 bytes".into(),
            })?;
        let token_id = BootstrapToken::parse(&req.bootstrap_token)
            .map(|t| t.id)
            .unwrap_or_default();
        let mut proved = req.clone();
        proved.proof = Some(prove_register(secret, &server, &token_id, &challenge.nonce));
        proved.nonce = Some(challenge.nonce);
        Ok(match self.post_public(REGISTER_PATH, &proved).await? {
            Answer::Ok { status, response } => RegisterAnswer::Registered { status, response },
            Answer::Refused {
                status,
                error,
                retry_after,
            } => RegisterAnswer::Refused {
                status,
                error,
                retry_after,
            },
        })
    }

    /// One unauthenticated POST: 200/201 with its JSON, or a refusal with its code.
    async fn post_public<B: serde::Serialize, R: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<Answer<R>, ApiClientError> {
        let resp = self
            .http
            .post(self.base.join(path))
            .json(body)
            .send()
            .await
            .map_err(|e| self.classify(&e))?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let body = resp.bytes().await.map_err(|e| self.classify(&e))?;
        if status == 200 || status == 201 {
            let response =
                serde_json::from_slice(&body).map_err(|e| ApiClientError::BadAnswer {
                    url: self.base.to_string(),
                    status,
                    reason: e.to_string(),
                })?;
            return Ok(Answer::Ok { status, response });
        }
        let error = serde_json::from_slice::<ApiError>(&body).unwrap_or_else(|_| {
            ApiError::new(
                "unexpected_answer",
                format!("HTTP {status}: {}", quote(&body)),
            )
        });
        Ok(Answer::Refused {
            status,
            error,
            retry_after,
        })
    }

    pub fn classify(&self, e: &reqwest::Error) -> ApiClientError {
        let url = self.base.to_string();
        if let Some(tls) = find_rustls_error(e) {
            return ApiClientError::NotTrusted {
                url,
                reason: tls.to_string(),
                dropped_ca: self.dropped_ca.display().to_string(),
            };
        }
        let reason = if e.is_timeout() {
            "the connection timed out".to_owned()
        } else {
            innermost_message(e)
        };
        ApiClientError::Unreachable { url, reason }
    }
}

/// The rustls error somewhere in an error's source chain (also inside an `io::Error`).
pub fn find_rustls_error<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        // `io::Error::source` skips the error it wraps; descend into it explicitly
        // (hyper-util wraps tokio-rustls' io::Error in another io::Error).
        cur = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    None
}

/// The message of the deepest error in the chain ("Connection refused (os error 111)").
fn innermost_message(e: &reqwest::Error) -> String {
    let mut last: &(dyn std::error::Error + 'static) = e;
    while let Some(next) = last.source() {
        last = next;
    }
    let msg = last.to_string();
    if msg.is_empty() { e.to_string() } else { msg }
}

/// `Retry-After` in seconds (the form plexsphere sends); an HTTP date is not parsed.
pub(crate) fn parse_retry_after(v: &str) -> Option<Duration> {
    v.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// A short, printable quote of a body.
pub fn quote(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut q: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(BODY_QUOTE)
        .collect();
    if text.chars().count() > BODY_QUOTE {
        q.push('…');
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds() {
        assert_eq!(parse_retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after(" 10 "), Some(Duration::from_secs(10)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }

    #[test]
    fn quotes_are_short_and_single_line() {
        let q = quote(b"line1\nline2");
        assert_eq!(q, "line1 line2");
        let long = vec![b'a'; 500];
        assert_eq!(quote(&long).chars().count(), BODY_QUOTE + 1);
    }

    #[test]
    fn rustls_errors_are_found_inside_io_errors() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls.clone());
        assert_eq!(find_rustls_error(&io), Some(&tls));
        let nested = std::io::Error::other(io);
        assert_eq!(find_rustls_error(&nested), Some(&tls));
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(find_rustls_error(&plain), None);
    }
}
