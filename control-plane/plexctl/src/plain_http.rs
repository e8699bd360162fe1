//! Telling an operator who typed `http://` for a port that speaks TLS to use `https://`.
//!
//! Two shapes reveal it. plexsphere (rustls) answers a plain HTTP request with a TLS alert
//! record, which the HTTP client reports as an unreadable response; [`speaks_tls`] confirms it
//! by sending one plain request itself and reading the first bytes of the answer. A reverse
//! proxy such as nginx answers `400` with "The plain HTTP request was sent to HTTPS port"
//! ([`proxy_says_https`]).

use std::time::Duration;

use reqwest::Url;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// How long the probe may take in all (connect, write, read): it only runs after a failure.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The first bytes of a TLS alert record: content type 21, protocol version 3.x.
const TLS_ALERT_START: [u8; 2] = [0x15, 0x03];

/// Whether the server at `url` (an `http://` URL) answers plain HTTP with a TLS alert.
pub async fn speaks_tls(url: &Url) -> bool {
    if url.scheme() != "http" {
        return false;
    }
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        stream.write_all(b"GET / HTTP/1.0\r\n\r\n").await.ok()?;
        let mut first = [0u8; 2];
        stream.read_exact(&mut first).await.ok()?;
        Some(first == TLS_ALERT_START)
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, probe).await,
        Ok(Some(true))
    )
}

/// Whether an answer is a proxy's "plain HTTP to an HTTPS port" refusal.
pub fn proxy_says_https(url: &Url, status: reqwest::StatusCode, body: &[u8]) -> bool {
    const NGINX: &[u8] = b"plain HTTP request was sent to HTTPS port";
    url.scheme() == "http"
        && status == reqwest::StatusCode::BAD_REQUEST
        && body.windows(NGINX.len()).any(|w| w == NGINX)
}

/// `url`'s origin with `https` instead of `http`, for the message (same host and port; a URL
/// without a port gets https's default one).
pub fn https_origin(url: &Url) -> String {
    let mut https = url.clone();
    if https.set_scheme("https").is_err() {
        return url.origin().ascii_serialization();
    }
    https.origin().ascii_serialization()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        match Url::parse(text) {
            Ok(u) => u,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    #[test]
    fn a_proxy_refusal_is_recognised_only_for_http_and_400() {
        let body = b"<html><center>The plain HTTP request was sent to HTTPS port</center></html>";
        let http = url("http://cp.example:443/v1/nodes");
        assert!(proxy_says_https(
            &http,
            reqwest::StatusCode::BAD_REQUEST,
            body
        ));
        assert!(!proxy_says_https(
            &http,
            reqwest::StatusCode::NOT_FOUND,
            body
        ));
        assert!(!proxy_says_https(
            &http,
            reqwest::StatusCode::BAD_REQUEST,
            b"bad request"
        ));
        let https = url("https://cp.example/v1/nodes");
        assert!(!proxy_says_https(
            &https,
            reqwest::StatusCode::BAD_REQUEST,
            body
        ));
    }

    #[test]
    fn the_https_origin_keeps_host_and_port() {
        assert_eq!(
            https_origin(&url("http://localhost:8443/v1/x")),
            "https://localhost:8443"
        );
        assert_eq!(
            https_origin(&url("http://cp.example/")),
            "https://cp.example"
        );
    }

    #[tokio::test]
    async fn the_probe_reads_a_tls_alert_and_nothing_else() {
        // A listener that answers like rustls does to plain HTTP, and one that speaks HTTP.
        async fn serve(answer: &'static [u8]) -> Url {
            let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
                Ok(l) => l,
                Err(e) => panic!("bind: {e}"),
            };
            let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
            tokio::spawn(async move {
                if let Ok((mut s, _)) = listener.accept().await {
                    let mut buf = [0u8; 64];
                    let _ = s.read(&mut buf).await;
                    let _ = s.write_all(answer).await;
                }
            });
            url(&format!("http://127.0.0.1:{port}/"))
        }
        let tls = serve(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]).await;
        assert!(speaks_tls(&tls).await);
        let http = serve(b"HTTP/1.1 200 OK\r\n\r\n").await;
        assert!(!speaks_tls(&http).await);
        // Nothing listens: not TLS either (the caller reports it unreachable).
        let closed = url("http://127.0.0.1:1/");
        assert!(!speaks_tls(&closed).await);
    }
}
