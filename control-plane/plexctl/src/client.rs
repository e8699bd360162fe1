//! The HTTP client for the plexsphere operator API: rustls (ring) trusting the system store
//! plus an optional CA file, one method per verb, and failures sorted into what the operator
//! has to fix: the server's answer, the trust in its certificate, or the route to it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use plexsphere_tls_client::{ALPN_H2_HTTP1, Trust, TrustError};
use plexsphere_wire::ApiError;
use reqwest::header::{AUTHORIZATION, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::plain_http;
use crate::secret::Secret;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a call failed. `exit_code` says how plexctl exits for each.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with its error body: printed as the brief's one line.
    #[error("{} ({}, HTTP {})", .error.message, .error.code, .status.as_u16())]
    Api { status: StatusCode, error: ApiError },
    #[error("{url} answered HTTP {} without a plexsphere error body; check that the server URL points at plexsphere", .status.as_u16())]
    UnexpectedStatus { url: Url, status: StatusCode },
    #[error("{url} answered HTTP {} with a body plexctl cannot read ({detail}); compare `plexctl version` with the server's", .status.as_u16())]
    BadBody {
        url: Url,
        status: StatusCode,
        detail: String,
    },
    #[error("the server at {origin} is not trusted: {detail}; {hint}")]
    NotTrusted {
        origin: String,
        detail: String,
        hint: &'static str,
    },
    #[error("the TLS handshake with the server at {origin} failed: {detail}; {hint}")]
    TlsFailed {
        origin: String,
        detail: String,
        hint: &'static str,
    },
    #[error(
        "cannot reach the server at {origin}: {detail}; check the host and port of the server URL and that plexsphere is running there"
    )]
    NotReachable { origin: String, detail: String },
    #[error("the server at {origin} did not answer within {}s; check that plexsphere is running and reachable", REQUEST_TIMEOUT.as_secs())]
    Timeout { origin: String },
    #[error("the request to {origin} failed: {detail}")]
    Transport { origin: String, detail: String },
    /// `http://` for a port that speaks TLS (plexsphere's, or a proxy's HTTPS port).
    #[error("the server at {origin} speaks HTTPS, not plain HTTP; use {https} as the server URL")]
    PlainHttpToTls { origin: String, https: String },
    #[error("cannot use the CA file {}: {detail}; give a PEM file of the CA that signed the server's certificate", .path.display())]
    CaFile { path: PathBuf, detail: String },
    #[error("cannot set up the HTTPS client: {0}")]
    Setup(String),
}

impl ClientError {
    /// 1: the server refused or answered oddly; 2: no trusted connection; 64: bad local input.
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Api { .. }
            | ClientError::UnexpectedStatus { .. }
            | ClientError::BadBody { .. } => 1,
            ClientError::NotTrusted { .. }
            | ClientError::TlsFailed { .. }
            | ClientError::NotReachable { .. }
            | ClientError::Timeout { .. }
            | ClientError::Transport { .. }
            | ClientError::PlainHttpToTls { .. }
            | ClientError::Setup(_) => 2,
            ClientError::CaFile { .. } => 64,
        }
    }
}

/// The operator API at one base URL, optionally authenticated with an operator token.
pub struct Api {
    http: reqwest::Client,
    base: Url,
    token: Option<Secret>,
}

impl Api {
    pub fn new(
        base: Url,
        token: Option<Secret>,
        ca_file: Option<&Path>,
    ) -> Result<Self, ClientError> {
        let tls = tls_config(ca_file)?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .user_agent(concat!("plexctl/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            // The token must never follow a redirect to another place.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ClientError::Setup(chain(&e)))?;
        Ok(Self { http, base, token })
    }

    /// `GET <base>/<segments...>?<query>`, answering a `T`.
    pub async fn get<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> Result<T, ClientError> {
        self.call::<(), T>(Method::GET, segments, query, None).await
    }

    /// `POST <base>/<segments...>` with an optional JSON body, answering a `T`.
    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        segments: &[&str],
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        self.call(Method::POST, segments, &[], body).await
    }

    /// `PUT <base>/<segments...>` with a JSON body, answering a `T`.
    pub async fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        segments: &[&str],
        body: &B,
    ) -> Result<T, ClientError> {
        self.call(Method::PUT, segments, &[], Some(body)).await
    }

    /// `DELETE <base>/<segments...>`, answering a `T`.
    pub async fn delete<T: DeserializeOwned>(&self, segments: &[&str]) -> Result<T, ClientError> {
        self.call::<(), T>(Method::DELETE, segments, &[], None)
            .await
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, &str)],
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let url = endpoint(&self.base, segments, query);
        let mut request = self.http.request(method, url.clone());
        if let Some(token) = &self.token {
            let mut value =
                HeaderValue::from_str(&format!("Bearer {}", token.expose())).map_err(|_| {
                    ClientError::Setup(
                        "the operator token holds characters a header cannot carry".into(),
                    )
                })?;
            value.set_sensitive(true);
            request = request.header(AUTHORIZATION, value);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let origin = origin_of(&url);
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => return Err(explain(&url, classify(&origin, &e)).await),
        };
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| classify(&origin, &e))?;
        if plain_http::proxy_says_https(&url, status, &bytes) {
            return Err(plain_http_error(&url));
        }
        decode(&url, status, &bytes)
    }
}

/// A transport failure on an `http://` URL whose port answers with TLS becomes the hint to
/// use `https://`; any other failure stays as it is.
async fn explain(url: &Url, err: ClientError) -> ClientError {
    if matches!(err, ClientError::Transport { .. }) && plain_http::speaks_tls(url).await {
        return plain_http_error(url);
    }
    err
}

fn plain_http_error(url: &Url) -> ClientError {
    ClientError::PlainHttpToTls {
        origin: origin_of(url),
        https: plain_http::https_origin(url),
    }
}

/// The base URL with path segments appended (each percent-encoded) and a query.
pub fn endpoint(base: &Url, segments: &[&str], query: &[(&str, &str)]) -> Url {
    let mut url = base.clone();
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty().extend(segments);
    }
    if !query.is_empty() {
        url.query_pairs_mut().extend_pairs(query);
    }
    url
}

/// Turns an answer into a `T` or the error it carries.
pub fn decode<T: DeserializeOwned>(
    url: &Url,
    status: StatusCode,
    body: &[u8],
) -> Result<T, ClientError> {
    if status.is_success() {
        return serde_json::from_slice(body).map_err(|e| ClientError::BadBody {
            url: url.clone(),
            status,
            detail: e.to_string(),
        });
    }
    match serde_json::from_slice::<ApiError>(body) {
        Ok(error) => Err(ClientError::Api { status, error }),
        Err(_) => Err(ClientError::UnexpectedStatus {
            url: url.clone(),
            status,
        }),
    }
}

/// The rustls client configuration (`plexsphere_tls_client`): the system store, plus the CA
/// file, ALPN h2 and http/1.1.
pub fn tls_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, ClientError> {
    let trust = Trust::system_and(ca_file.map(Path::to_path_buf));
    plexsphere_tls_client::client_config(&trust, ALPN_H2_HTTP1).map_err(|e| match e {
        TrustError::CaFile { path, problem } => ClientError::CaFile {
            path,
            detail: problem.to_string(),
        },
        TrustError::Setup(detail) => ClientError::Setup(detail),
    })
}

/// `scheme://host:port` of a URL, for messages.
fn origin_of(url: &Url) -> String {
    url.origin().ascii_serialization()
}

/// Sorts a transport failure into not trusted / not reachable / timed out.
pub fn classify(origin: &str, err: &reqwest::Error) -> ClientError {
    if let Some(tls) = find_rustls_error(err) {
        let (origin, detail, hint) = (origin.to_owned(), tls.to_string(), trust_hint(tls));
        return match tls {
            rustls::Error::InvalidCertificate(_) => ClientError::NotTrusted {
                origin,
                detail,
                hint,
            },
            _ => ClientError::TlsFailed {
                origin,
                detail,
                hint,
            },
        };
    }
    if err.is_timeout() {
        return ClientError::Timeout {
            origin: origin.to_owned(),
        };
    }
    let detail = root_cause(err);
    if err.is_connect() {
        return ClientError::NotReachable {
            origin: origin.to_owned(),
            detail,
        };
    }
    ClientError::Transport {
        origin: origin.to_owned(),
        detail,
    }
}

/// What to do about a TLS failure.
fn trust_hint(err: &rustls::Error) -> &'static str {
    use rustls::CertificateError as C;
    match err {
        rustls::Error::InvalidCertificate(C::UnknownIssuer) => {
            "its certificate is signed by a CA this machine does not trust; pass that CA's PEM with --ca-file (or PLEXCTL_CA_FILE, or ca_file in the config)"
        }
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => {
            "its certificate does not name this host; use the host name the certificate was issued for in the server URL"
        }
        rustls::Error::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        ) => "check the dates of the server's certificate and this machine's clock",
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            "the port may not speak TLS; check the scheme (https or http) and port of the server URL"
        }
        _ => "check the server's certificate and the CA given with --ca-file",
    }
}

/// The rustls error somewhere in the chain, including inside `io::Error`s (whose `source()`
/// skips the error they wrap).
fn find_rustls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(tls) = find_rustls_error(inner)
        {
            return Some(tls);
        }
        current = e.source();
    }
    None
}

/// The innermost message of an error chain ("Connection refused (os error 111)").
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut last = err;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

/// The whole chain on one line, for setup errors.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut current = err.source();
    while let Some(e) = current {
        text.push_str(": ");
        text.push_str(&e.to_string());
        current = e.source();
    }
    text
}

#[cfg(test)]
#[path = "client_tests.rs"]
pub(crate) mod tests;
