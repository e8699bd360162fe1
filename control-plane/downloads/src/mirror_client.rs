//! The HTTP client the mirror is fetched with, and how its failures and URLs are shown.

use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;

use crate::config::{ConfigError, MirrorConfig};

/// The mirror client: the system's roots plus the optional CA file, rustls with ring.
pub(crate) fn http_client(config: &MirrorConfig) -> Result<reqwest::Client, ConfigError> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::warn!(error = %e, "a certificate of the system store could not be loaded");
    }
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = &config.ca_file {
        let ca_err = |reason: String| ConfigError::CaFile {
            path: path.clone(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| ca_err(e.to_string()))?;
        let certs = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ca_err(e.to_string()))?;
        if certs.is_empty() {
            return Err(ca_err("it holds no CERTIFICATE block".to_owned()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| ca_err(e.to_string()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::Client(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(config.connect_timeout)
        .read_timeout(config.read_timeout)
        .user_agent(concat!("plexsphere/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ConfigError::Client(describe(&e)))
}

/// An error and its causes in one line (`error sending request: ...: Connection refused`).
pub(crate) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

/// A template as logs show it: placeholders kept, credentials dropped.
pub(crate) fn redact_template(template: &str) -> String {
    let Some((scheme, rest)) = template.split_once("://") else {
        return template.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => template.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_lose_credentials_in_logs() {
        assert_eq!(
            redact_template("https://u:p@m.example/{version}/{arch}"),
            "https://m.example/{version}/{arch}"
        );
        assert_eq!(
            redact_template("https://m.example/{version}/a@b/{arch}"),
            "https://m.example/{version}/a@b/{arch}"
        );
    }
}
