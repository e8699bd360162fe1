//! HTTPS servers for the mirror tests: a test CA (its PEM in a file, for
//! `MirrorConfig::ca_file`) and axum servers on 127.0.0.1:0 with a certificate it signed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum_server::Handle;
use axum_server::tls_rustls::RustlsConfig;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::task::JoinHandle;

/// A CA whose PEM is in a file, and the server config of a certificate for 127.0.0.1 it signed.
pub struct TestCa {
    dir: tempfile::TempDir,
    server_config: Arc<rustls::ServerConfig>,
}

impl TestCa {
    pub fn new() -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server_config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
            )
            .unwrap();
        server_config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mirror-ca.pem"), ca_cert.pem()).unwrap();
        Self {
            dir,
            server_config: Arc::new(server_config),
        }
    }

    /// The CA's PEM file.
    pub fn file(&self) -> PathBuf {
        self.dir.path().join("mirror-ca.pem")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// An HTTPS server; `stop` closes its listener and every connection.
pub struct TlsServer {
    pub addr: SocketAddr,
    pub ca: Arc<TestCa>,
    handle: Handle<SocketAddr>,
    task: JoinHandle<()>,
}

impl TlsServer {
    pub async fn start(app: Router, ca: Arc<TestCa>) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = Handle::new();
        let server = axum_server::from_tcp_rustls(
            listener,
            RustlsConfig::from_config(ca.server_config.clone()),
        )
        .unwrap()
        .handle(handle.clone());
        let task = tokio::spawn(async move {
            server.serve(app.into_make_service()).await.unwrap();
        });
        Self {
            addr,
            ca,
            handle,
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    /// Stops at once (open connections too) and waits until the listener is closed.
    pub async fn stop(self) {
        self.handle.shutdown();
        self.task.await.unwrap();
    }
}
