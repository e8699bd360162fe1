//! The one rustls client configuration of plexd, plexctl and the downloads mirror client:
//! which servers they trust (the system store, extra CA files, optionally a pinned CA) and the
//! ALPN each asks for, over the ring provider. No I/O beyond reading the CA files, and no
//! server crates: the agent depends on this crate.
//!
//! Errors are structured ([`CaFileProblem`]) so each caller names its own setting in the
//! message (`tls.ca_file`, `--ca-file`, the mirror's CA file).

mod pin;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

pub use pin::{PinnedVerifier, fingerprint};

/// HTTP/2 with a fallback to HTTP/1.1: calls over one shared connection.
pub const ALPN_H2_HTTP1: &[&[u8]] = &[b"h2", b"http/1.1"];
/// HTTP/1.1 only (plexd's event stream: a fresh connection per attempt).
pub const ALPN_HTTP1: &[&[u8]] = &[b"http/1.1"];

/// Where the trust comes from.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    /// Whether to load the system store (tests turn it off to prove a file or pin is what trusts).
    pub system_store: bool,
    /// PEM files of extra CAs; each must exist and hold at least one certificate.
    pub ca_files: Vec<PathBuf>,
    /// The SHA-256 of a CA's DER: a server presenting it verifies against it alone.
    pub pin: Option<[u8; 32]>,
}

impl Trust {
    /// The system store plus these CA files, no pin.
    pub fn system_and(ca_files: impl IntoIterator<Item = PathBuf>) -> Self {
        Self {
            system_store: true,
            ca_files: ca_files.into_iter().collect(),
            pin: None,
        }
    }
}

/// Why the trust could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("cannot use the CA file {}: {problem}", .path.display())]
    CaFile {
        path: PathBuf,
        #[source]
        problem: CaFileProblem,
    },
    #[error("cannot set up TLS: {0}")]
    Setup(String),
}

/// What is wrong with a CA file, without its path (the caller's message names it).
#[derive(Debug, thiserror::Error)]
pub enum CaFileProblem {
    #[error("{0}")]
    Unreadable(std::io::Error),
    #[error("it is not PEM ({0})")]
    NotPem(String),
    #[error("it holds no PEM certificate (no CERTIFICATE block)")]
    NoCertificate,
    #[error("rustls refuses a certificate of it as a root: {0}")]
    BadRoot(String),
}

/// The ring provider, everywhere.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate of a PEM file; a file without one is an error.
pub fn load_pem_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TrustError> {
    let fail = |problem| TrustError::CaFile {
        path: path.to_path_buf(),
        problem,
    };
    let bytes = std::fs::read(path).map_err(|e| fail(CaFileProblem::Unreadable(e)))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(CaFileProblem::NotPem(e.to_string())))?;
    if certs.is_empty() {
        return Err(fail(CaFileProblem::NoCertificate));
    }
    Ok(certs)
}

/// The root store: the system's certificates (single bad ones are warnings) plus the files.
pub fn root_store(trust: &Trust) -> Result<RootCertStore, TrustError> {
    let mut roots = RootCertStore::empty();
    if trust.system_store {
        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            tracing::warn!(error = %e, "a certificate of the system store could not be loaded");
        }
        let (added, ignored) = roots.add_parsable_certificates(native.certs);
        if ignored > 0 {
            tracing::warn!(
                ignored,
                "system store certificates that rustls cannot use were skipped"
            );
        }
        tracing::debug!(added, "loaded the system certificate store");
    }
    for path in &trust.ca_files {
        for cert in load_pem_certs(path)? {
            roots.add(cert).map_err(|e| TrustError::CaFile {
                path: path.clone(),
                problem: CaFileProblem::BadRoot(e.to_string()),
            })?;
        }
        tracing::debug!(path = %path.display(), "trusting the CA file");
    }
    Ok(roots)
}

/// A rustls client config with this trust and ALPN, ready for reqwest's
/// `tls_backend_preconfigured`. Without a pin (or when the server does not present the pinned
/// CA) the roots decide, as webpki verifies; with no roots at all nothing is trusted.
pub fn client_config(trust: &Trust, alpn: &[&[u8]]) -> Result<rustls::ClientConfig, TrustError> {
    let provider = provider();
    let roots = Arc::new(root_store(trust)?);
    let normal = if roots.is_empty() {
        None
    } else {
        Some(
            WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| TrustError::Setup(e.to_string()))?,
        )
    };
    let verifier: Arc<dyn rustls::client::danger::ServerCertVerifier> =
        Arc::new(PinnedVerifier::new(trust.pin, normal, provider.clone()));
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TrustError::Setup(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(with_alpn(config, alpn))
}

/// The same trust offering another ALPN (plexd's event stream: HTTP/1.1 only).
pub fn with_alpn(mut config: rustls::ClientConfig, alpn: &[&[u8]]) -> rustls::ClientConfig {
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

#[cfg(test)]
mod tests;
