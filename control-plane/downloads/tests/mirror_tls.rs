//! The mirror over real TLS: an upstream with a certificate from a test CA is trusted through
//! `MirrorConfig::ca_file` and refused without it; a plain http:// mirror is a configuration
//! error; a redirect to http:// is never followed (one to https is).

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse as _;
use axum::routing::get;
use plexsphere_downloads::{
    ConfigError, Downloads, DownloadsConfig, MirrorConfig, PinnedChecksums, router,
};
use support::tls::{TestCa, TlsServer};
use support::{Server, api_error, client, fake_binary, sha256_hex};

/// An upstream serving `binary` over HTTPS with a certificate from a fresh test CA.
async fn tls_upstream(binary: Vec<u8>) -> TlsServer {
    let app = Router::new().route(
        "/r/{version}/plexd-linux-amd64",
        get(move || {
            let b = binary.clone();
            async move { b }
        }),
    );
    TlsServer::start(app, Arc::new(TestCa::new())).await
}

async fn downloads(template: String, pinned: &str, cache: &Path, ca: Option<&Path>) -> Server {
    let mut mirror = MirrorConfig::new(template, PinnedChecksums::Inline(pinned.to_owned()), cache);
    mirror.ca_file = ca.map(Path::to_path_buf);
    let d = Downloads::open(DownloadsConfig::mirror("2.0.0", mirror), None)
        .await
        .unwrap();
    Server::start(router(Arc::new(d))).await
}

fn template(up: &TlsServer) -> String {
    up.url("/r/{version}/plexd-linux-{arch}")
}

#[tokio::test]
async fn an_https_mirror_is_trusted_through_the_ca_file() {
    let binary = fake_binary(21, 80_000);
    let pinned = format!("{}  plexd-linux-amd64\n", sha256_hex(&binary));
    let up = tls_upstream(binary.clone()).await;
    let work = tempfile::tempdir().unwrap();

    // Without the CA: the certificate is not trusted, so the mirror is unavailable.
    let untrusted = downloads(template(&up), &pinned, &work.path().join("c1"), None).await;
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
    let ca = up.ca.file();
    let trusted = downloads(template(&up), &pinned, &work.path().join("c2"), Some(&ca)).await;
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

#[tokio::test]
async fn a_plain_http_mirror_is_a_configuration_error_at_start() {
    let work = tempfile::tempdir().unwrap();
    let mirror = MirrorConfig::new(
        "http://127.0.0.1:9/{version}/plexd-linux-{arch}",
        PinnedChecksums::Inline(format!("{}  plexd-linux-amd64\n", "00".repeat(32))),
        work.path().join("cache"),
    );
    let err = Downloads::open(DownloadsConfig::mirror("2.0.0", mirror), None)
        .await
        .err()
        .expect("an http:// mirror must be refused");
    assert!(matches!(err, ConfigError::Template { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("https only"), "{text}");
    assert!(text.contains("http://127.0.0.1:9/"), "{text}");
}

#[tokio::test]
async fn an_https_mirror_that_redirects_to_http_is_refused() {
    let binary = fake_binary(22, 50_000);
    let pinned = format!("{}  plexd-linux-amd64\n", sha256_hex(&binary));
    // A plain-http server holding the right bytes: the redirect must not reach it.
    let plain_hits = Arc::new(AtomicUsize::new(0));
    let hits = plain_hits.clone();
    let served = binary.clone();
    let plain = Server::start(Router::new().route(
        "/bin",
        get(move || {
            hits.fetch_add(1, Ordering::SeqCst);
            let b = served.clone();
            async move { b }
        }),
    ))
    .await;
    let to_http = plain.url("/bin");
    let ca = Arc::new(TestCa::new());
    let up = TlsServer::start(
        Router::new()
            .route(
                "/r/{version}/plexd-linux-amd64",
                get(move || {
                    let to = to_http.clone();
                    async move { (StatusCode::FOUND, [(header::LOCATION, to)]).into_response() }
                }),
            )
            .route(
                "/s/{version}/plexd-linux-amd64",
                get(|| async { (StatusCode::FOUND, [(header::LOCATION, "/ok")]).into_response() }),
            )
            .route(
                "/ok",
                get(move || {
                    let b = binary.clone();
                    async move { b }
                }),
            ),
        ca.clone(),
    )
    .await;
    let work = tempfile::tempdir().unwrap();
    let ca_file = ca.file();

    let server = downloads(
        template(&up),
        &pinned,
        &work.path().join("c1"),
        Some(&ca_file),
    )
    .await;
    let (status, code, _) = api_error(
        client()
            .get(server.url("/downloads/plexd/linux-amd64"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, code.as_str()),
        (502, "plexd_download_upstream_unavailable")
    );
    assert_eq!(plain_hits.load(Ordering::SeqCst), 0);

    // A redirect that stays on https is followed.
    let server = downloads(
        up.url("/s/{version}/plexd-linux-{arch}"),
        &pinned,
        &work.path().join("c2"),
        Some(&ca_file),
    )
    .await;
    let resp = client()
        .get(server.url("/downloads/plexd/linux-amd64"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}
