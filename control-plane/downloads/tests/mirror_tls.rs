//! The mirror over real TLS: an upstream with a certificate from a test CA is trusted through
//! `MirrorConfig::ca_file` and refused without it.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use axum_server::tls_rustls::RustlsConfig;
use plexsphere_downloads::{Downloads, DownloadsConfig, MirrorConfig, PinnedChecksums, router};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use support::{Server, api_error, client, fake_binary, sha256_hex};

/// A CA (its PEM) and an upstream serving `binary` over HTTPS with a certificate it signed.
async fn tls_upstream(binary: Vec<u8>) -> (SocketAddr, String) {
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

    let app = Router::new().route(
        "/r/{version}/plexd-linux-amd64",
        get(move || {
            let b = binary.clone();
            async move { b }
        }),
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let server =
        axum_server::from_tcp_rustls(listener, RustlsConfig::from_config(Arc::new(server_config)))
            .unwrap();
    tokio::spawn(async move { server.serve(app.into_make_service()).await });
    (addr, ca_cert.pem())
}

async fn downloads(upstream: SocketAddr, pinned: &str, cache: &Path, ca: Option<&Path>) -> Server {
    let mut mirror = MirrorConfig::new(
        format!("https://{upstream}/r/{{version}}/plexd-linux-{{arch}}"),
        PinnedChecksums::Inline(pinned.to_owned()),
        cache,
    );
    mirror.ca_file = ca.map(Path::to_path_buf);
    let d = Downloads::open(DownloadsConfig::mirror("2.0.0", mirror), None)
        .await
        .unwrap();
    Server::start(router(Arc::new(d))).await
}

#[tokio::test]
async fn an_https_mirror_is_trusted_through_the_ca_file() {
    let binary = fake_binary(21, 80_000);
    let pinned = format!("{}  plexd-linux-amd64\n", sha256_hex(&binary));
    let (upstream, ca_pem) = tls_upstream(binary.clone()).await;
    let work = tempfile::tempdir().unwrap();
    let ca_file = work.path().join("mirror-ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();

    // Without the CA: the certificate is not trusted, so the mirror is unavailable.
    let untrusted = downloads(upstream, &pinned, &work.path().join("c1"), None).await;
    let resp = client()
        .get(untrusted.url("/downloads/plexd/linux-amd64"))
        .send()
        .await
        .unwrap();
    let (status, code, _) = api_error(resp).await;
    assert_eq!(
        (status, code.as_str()),
        (502, "plexd_download_upstream_unavailable")
    );

    // With it: fetched, verified, served.
    let trusted = downloads(upstream, &pinned, &work.path().join("c2"), Some(&ca_file)).await;
    let resp = client()
        .get(trusted.url("/downloads/plexd/linux-amd64"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), binary.as_slice());
}

#[tokio::test]
async fn a_bad_ca_file_fails_at_start_with_its_path() {
    let work = tempfile::tempdir().unwrap();
    let ca_file = work.path().join("not-a-ca.pem");
    std::fs::write(&ca_file, "hello\n").unwrap();
    let mut mirror = MirrorConfig::new(
        "https://mirror.invalid/{version}/plexd-linux-{arch}",
        PinnedChecksums::Inline(format!("{}  plexd-linux-amd64\n", "00".repeat(32))),
        work.path().join("cache"),
    );
    mirror.ca_file = Some(ca_file.clone());
    let err = Downloads::open(DownloadsConfig::mirror("2.0.0", mirror), None)
        .await
        .err()
        .unwrap();
    let text = err.to_string();
    assert!(text.contains(&ca_file.display().to_string()), "{text}");
    assert!(text.contains("no CERTIFICATE"), "{text}");
}
