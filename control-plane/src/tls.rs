//! TLS: the rustls server config (ring provider) from PEM files, and the `dev` lab CA.
//!
//! `dev` keeps a lab CA in `<data-dir>/tls/ca.crt` + `ca.key` and a server certificate signed
//! by it in `server.crt` (leaf, then the CA) + `server.key`; keys are 0600. Existing files are
//! reused, so nodes that trust the CA keep trusting the server across restarts.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use time::{Duration, OffsetDateTime};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} holds no usable PEM {what}: {detail}; pass a PEM file (e.g. the output of certbot or openssl)"
    )]
    Pem {
        path: PathBuf,
        what: &'static str,
        detail: String,
    },
    #[error("the certificate and key are not usable together: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("generating the lab certificates failed: {0}")]
    Generate(#[from] rcgen::Error),
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> TlsError {
    let path = path.to_owned();
    move |source| TlsError::Io {
        action,
        path,
        source,
    }
}

/// Makes ring the process-wide rustls provider (a no-op when one is installed already).
pub fn install_ring_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A rustls server config (ring, TLS 1.2 + 1.3, ALPN h2 and http/1.1) from PEM files.
pub fn server_config(
    cert_path: &Path,
    key_path: &Path,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Pem {
            path: cert_path.to_owned(),
            what: "certificate chain",
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: cert_path.to_owned(),
            what: "certificate chain",
            detail: "no CERTIFICATE block".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| TlsError::Pem {
        path: key_path.to_owned(),
        what: "private key",
        detail: e.to_string(),
    })?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The files of the `dev` lab CA and server certificate.
#[derive(Debug, Clone)]
pub struct DevCerts {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub ca_pem: String,
    /// SHA-256 of the CA's DER, `AB:CD:...` like `openssl x509 -fingerprint -sha256`.
    pub ca_fingerprint: String,
}

const CA_NAME: &str = "plexsphere lab CA";

fn ca_params() -> Result<CertificateParams, TlsError> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name.push(DnType::CommonName, CA_NAME);
    p.distinguished_name
        .push(DnType::OrganizationName, "plexsphere");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    p.not_before = now - Duration::days(1);
    p.not_after = now + Duration::days(3650);
    Ok(p)
}

/// Creates (or reuses) the lab CA and a server certificate for `localhost`, `127.0.0.1`,
/// `::1` and `extra_sans` in `dir`.
pub fn ensure_dev_certs(dir: &Path, extra_sans: &[String]) -> Result<DevCerts, TlsError> {
    fs::create_dir_all(dir).map_err(io("create", dir))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(io("set the mode of", dir))?;
    let (ca_cert, ca_key) = (dir.join("ca.crt"), dir.join("ca.key"));
    let (server_cert, server_key) = (dir.join("server.crt"), dir.join("server.key"));

    let (ca_pem, issuer) = if ca_cert.exists() && ca_key.exists() {
        let key_pem = fs::read_to_string(&ca_key).map_err(io("read", &ca_key))?;
        let key = KeyPair::from_pem(&key_pem)?;
        let pem = fs::read_to_string(&ca_cert).map_err(io("read", &ca_cert))?;
        (pem, Issuer::new(ca_params()?, key))
    } else {
        let key = KeyPair::generate()?;
        let params = ca_params()?;
        let cert = params.self_signed(&key)?;
        write_private(&ca_key, key.serialize_pem().as_bytes())?;
        write_public(&ca_cert, cert.pem().as_bytes())?;
        // A new CA invalidates any old server certificate.
        let _ = fs::remove_file(&server_cert);
        (cert.pem(), Issuer::new(params, key))
    };

    if !(server_cert.exists() && server_key.exists()) {
        let mut sans = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ];
        for s in extra_sans {
            if !sans.contains(s) {
                sans.push(s.clone());
            }
        }
        let mut p = CertificateParams::new(sans)?;
        p.distinguished_name.push(DnType::CommonName, "plexsphere");
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let now = OffsetDateTime::now_utc();
        p.not_before = now - Duration::days(1);
        p.not_after = now + Duration::days(825);
        let key = KeyPair::generate()?;
        let cert = p.signed_by(&key, &issuer)?;
        write_private(&server_key, key.serialize_pem().as_bytes())?;
        write_public(&server_cert, format!("{}{}", cert.pem(), ca_pem).as_bytes())?;
    }

    let ca_der = CertificateDer::from_pem_slice(ca_pem.as_bytes()).map_err(|e| TlsError::Pem {
        path: ca_cert.clone(),
        what: "certificate",
        detail: e.to_string(),
    })?;
    Ok(DevCerts {
        ca_fingerprint: fingerprint(&ca_der),
        ca_cert,
        server_cert,
        server_key,
        ca_pem,
    })
}

/// SHA-256 of a DER certificate, uppercase hex pairs joined by colons.
pub(crate) fn fingerprint(der: &[u8]) -> String {
    plexsphere_wire::secret::sha256(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Writes a secret file with mode 0600 (replacing any old one).
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io("create", &tmp))?;
    f.write_all(bytes).map_err(io("write", &tmp))?;
    f.sync_all().map_err(io("sync", &tmp))?;
    fs::rename(&tmp, path).map_err(io("rename into place", path))
}

fn write_public(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    fs::write(path, bytes).map_err(io("write", path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))
        .map_err(io("set the mode of", path))
}
