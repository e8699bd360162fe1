//! Which servers plexd trusts: the system store, `/etc/plexd/ca.crt` when it exists,
//! `tls.ca_file` / `--ca-file`, and optionally a pinned CA by SHA-256. The rustls setup itself
//! is `plexsphere_tls_client`'s, shared with plexctl and the downloads mirror; this file says
//! where plexd's trust comes from and words the errors for plexd's settings.

use std::path::{Path, PathBuf};

use plexsphere_tls_client::{ALPN_H2_HTTP1, CaFileProblem, Trust, TrustError};
use rustls_pki_types::CertificateDer;

use crate::config::Sha256Pin;

/// Where the trust comes from, besides the system store.
#[derive(Debug, Clone, Default)]
pub struct TrustSources {
    /// Whether to load the system store (tests turn it off to prove a file or pin is what trusts).
    pub system_store: bool,
    /// PEM files of extra CAs; each must exist and hold at least one certificate.
    pub ca_files: Vec<PathBuf>,
    pub pin: Option<Sha256Pin>,
}

impl TrustSources {
    fn trust(&self) -> Trust {
        Trust {
            system_store: self.system_store,
            ca_files: self.ca_files.clone(),
            pin: self.pin.map(|p| p.0),
        }
    }
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

impl From<TrustError> for TlsError {
    fn from(e: TrustError) -> Self {
        match e {
            TrustError::CaFile { path, problem } => match problem {
                CaFileProblem::Unreadable(source) => TlsError::Read { path, source },
                CaFileProblem::NotPem(reason) => TlsError::NotPem { path, reason },
                CaFileProblem::NoCertificate => TlsError::NoCertificate { path },
                CaFileProblem::BadRoot(reason) => TlsError::BadRoot { path, reason },
            },
            TrustError::Setup(reason) => TlsError::Setup(reason),
        }
    }
}

/// Reads every certificate of a PEM file.
pub fn load_pem_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    Ok(plexsphere_tls_client::load_pem_certs(path)?)
}

/// A rustls client config with plexd's trust and ALPN h2 + http/1.1, ready for reqwest's
/// `tls_backend_preconfigured`.
pub fn client_config(sources: &TrustSources) -> Result<rustls::ClientConfig, TlsError> {
    Ok(plexsphere_tls_client::client_config(
        &sources.trust(),
        ALPN_H2_HTTP1,
    )?)
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
        let sources = TrustSources {
            system_store: false,
            ca_files: vec![p],
            pin: None,
        };
        let roots = plexsphere_tls_client::root_store(&sources.trust()).unwrap();
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
