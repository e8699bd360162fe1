//! Which servers plexd trusts: the system store, `/etc/plexd/ca.crt` when it exists,
//! `tls.ca_file` / `--ca-file`, and optionally a pinned CA by SHA-256.

mod pin;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::config::Sha256Pin;
pub use pin::PinnedVerifier;

/// Where the trust comes from, besides the system store.
#[derive(Debug, Clone, Default)]
pub struct TrustSources {
    /// Whether to load the system store (tests turn it off to prove a file or pin is what trusts).
    pub system_store: bool,
    /// PEM files of extra CAs; each must exist and hold at least one certificate.
    pub ca_files: Vec<PathBuf>,
    pub pin: Option<Sha256Pin>,
}

/// Why the trust could not be set up. Names the file and the next step.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the CA file {path}: {source}; check the path in tls.ca_file / --ca-file")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the CA file {path} is not PEM ({reason}); it must hold -----BEGIN CERTIFICATE----- blocks"
    )]
    NotPem { path: PathBuf, reason: String },
    #[error(
        "the CA file {path} holds no certificate; it must hold -----BEGIN CERTIFICATE----- blocks"
    )]
    NoCertificate { path: PathBuf },
    #[error("the CA file {path} holds a certificate rustls refuses as a root: {reason}")]
    BadRoot { path: PathBuf, reason: String },
    #[error("cannot set up TLS: {0}")]
    Setup(String),
}

/// The ring provider plexd uses everywhere.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate of a PEM file.
pub fn load_pem_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::NotPem {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The root store: the system's certificates (single bad ones are warnings) plus the files.
pub fn root_store(sources: &TrustSources) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    if sources.system_store {
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
    for path in &sources.ca_files {
        for cert in load_pem_certs(path)? {
            roots.add(cert).map_err(|e| TlsError::BadRoot {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        }
        tracing::debug!(path = %path.display(), "trusting the CA file");
    }
    Ok(roots)
}

/// A rustls client config with plexd's trust and ALPN h2 + http/1.1, ready for reqwest's
/// `tls_backend_preconfigured`.
pub fn client_config(sources: &TrustSources) -> Result<rustls::ClientConfig, TlsError> {
    let provider = provider();
    let roots = Arc::new(root_store(sources)?);
    let normal = if roots.is_empty() {
        None
    } else {
        Some(
            WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| TlsError::Setup(e.to_string()))?,
        )
    };
    let verifier: Arc<dyn rustls::client::danger::ServerCertVerifier> =
        Arc::new(PinnedVerifier::new(sources.pin, normal, provider.clone()));
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The SHA-256 of a certificate's DER, as `tls.ca_sha256` pins it.
pub fn fingerprint(cert: &CertificateDer<'_>) -> [u8; 32] {
    plexsphere_wire::secret::sha256(cert.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_file_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let e = load_pem_certs(&missing).unwrap_err().to_string();
        assert!(
            e.contains("missing.pem") && e.contains("cannot read"),
            "{e}"
        );

        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "hello, not a certificate\n").unwrap();
        let e = load_pem_certs(&junk).unwrap_err().to_string();
        assert!(
            e.contains("junk.pem") && e.contains("no certificate"),
            "{e}"
        );

        let broken = dir.path().join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = load_pem_certs(&broken).unwrap_err().to_string();
        assert!(e.contains("broken.pem") && e.contains("not PEM"), "{e}");
    }

    #[test]
    fn a_ca_file_becomes_a_root() {
        let ca = test_ca();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ca.pem");
        std::fs::write(&p, ca.cert.pem()).unwrap();
        let roots = root_store(&TrustSources {
            system_store: false,
            ca_files: vec![p],
            pin: None,
        })
        .unwrap();
        assert_eq!(roots.len(), 1);
        assert!(client_config(&TrustSources::default()).is_ok());
    }

    fn test_ca() -> rcgen::CertifiedKey<rcgen::KeyPair> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        rcgen::CertifiedKey {
            cert,
            signing_key: key,
        }
    }
}
