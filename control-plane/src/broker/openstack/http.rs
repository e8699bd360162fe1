//! The HTTP side of the OpenStack client: one reqwest client per cloud credential (rustls over
//! ring, the system's roots or the credential's `ca_pem`, no redirects) with every bound
//! explicit, and a send that reads the answer whole up to a size cap.

use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// How long a TCP and TLS connect may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take from sending to the end of the answer's body.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer body read; a longer one is an error (a hostile or broken endpoint
/// cannot make the broker hold more). A Keystone catalog or a page of 1000 images fits.
pub(crate) const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// The client for one cloud: trusts the credential's CA when it has one, else the system's.
pub(crate) fn client(ca_pem: Option<&str>) -> Result<reqwest::Client, String> {
    let trust = plexsphere_tls_client::Trust {
        system_store: ca_pem.is_none(),
        ..Default::default()
    };
    let mut roots = plexsphere_tls_client::root_store(&trust).map_err(|e| e.to_string())?;
    if let Some(pem) = ca_pem {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert = cert.map_err(|e| format!("the credential's ca_pem is not PEM: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("the credential's ca_pem is not a usable CA: {e}"))?;
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(plexsphere_tls_client::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tls = plexsphere_tls_client::with_alpn(tls, plexsphere_tls_client::ALPN_H2_HTTP1);
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("plexsphere-broker/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot set up the HTTP client: {e}"))
}

/// An answer read whole.
pub(crate) struct Reply {
    pub status: u16,
    /// Keystone's `X-Subject-Token`, when the answer has one.
    pub subject_token: Option<String>,
    pub body: Vec<u8>,
}

/// Sends the request and reads the answer's body up to [`MAX_BODY_BYTES`]. `Err`: no answer
/// (the reason, for an `Unreachable` line).
pub(crate) async fn send(request: reqwest::RequestBuilder) -> Result<Reply, String> {
    let mut response = request.send().await.map_err(describe)?;
    let status = response.status().as_u16();
    let subject_token = response
        .headers()
        .get("x-subject-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if response
        .content_length()
        .is_some_and(|n| n > MAX_BODY_BYTES as u64)
    {
        return Err(format!(
            "the answer's body is larger than the {MAX_BODY_BYTES} bytes read"
        ));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(describe)? {
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(format!(
                "the answer's body is larger than the {MAX_BODY_BYTES} bytes read"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Reply {
        status,
        subject_token,
        body,
    })
}

/// A reqwest error with its causes, as one line.
fn describe(e: reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    let mut line = format!("{kind}: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        line.push_str(&format!(": {s}"));
        source = s.source();
    }
    line
}
