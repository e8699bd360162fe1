//! The local artifacts source over a real socket, checked with the tools operators use:
//! sha256sum and openssl (the signature); ranges and curl's resume are `local_ranges.rs`'s.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns

mod support;

use std::path::Path;
use std::sync::Arc;

use plexsphere_downloads::{ChecksumSigner, Downloads, DownloadsConfig, router};
use plexsphere_wire::signed::DomainSigner;
use reqwest::header;
use support::local::{VERSION, fixture};
use support::{Server, api_error, client, fake_binary, get, sh, sha256_hex, show};

#[tokio::test]
async fn both_binaries_and_checksums_that_sha256sum_accepts() {
    let f = fixture(false).await;
    for (arch, bytes) in [("amd64", &f.amd64), ("arm64", &f.arm64)] {
        let resp = get(&f.server.url(&format!("/downloads/plexd/linux-{arch}"))).await;
        assert_eq!(resp.status(), 200);
        let h = resp.headers().clone();
        assert_eq!(h[header::CONTENT_TYPE], "application/octet-stream");
        assert_eq!(
            h[header::CONTENT_DISPOSITION],
            format!("attachment; filename=\"plexd-linux-{arch}\"").as_str()
        );
        assert_eq!(
            h[header::ETAG],
            format!("\"{}\"", sha256_hex(bytes)).as_str()
        );
        assert_eq!(h[header::ACCEPT_RANGES], "bytes");
        assert_eq!(h["x-plexd-version"], VERSION);
        assert_eq!(h[header::CONTENT_LENGTH], bytes.len().to_string().as_str());
        assert_eq!(resp.bytes().await.unwrap().as_ref(), bytes.as_slice());
    }

    let resp = get(&f.server.url("/downloads/plexd/checksums.sha256")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()[header::CONTENT_TYPE],
        "text/plain; charset=utf-8"
    );
    let text = resp.text().await.unwrap();
    assert_eq!(
        text,
        format!(
            "{}  plexd-linux-amd64\n{}  plexd-linux-arm64\n",
            sha256_hex(&f.amd64),
            sha256_hex(&f.arm64)
        )
    );

    // The runbook, step by step, with the real tools.
    let work = tempfile::tempdir().unwrap();
    let base = f.server.url("/downloads/plexd");
    for arch in ["amd64", "arm64"] {
        let out = sh(
            work.path(),
            &format!(
                "set -e; arch={arch}; base={base}
                 curl -fsSLo \"plexd-linux-$arch\" \"$base/linux-$arch\"
                 curl -fsSLo checksums.sha256 \"$base/checksums.sha256\"
                 grep \" plexd-linux-$arch\\$\" checksums.sha256 | sha256sum -c -"
            ),
        )
        .await;
        assert!(out.status.success(), "{}", show(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("plexd-linux-{arch}: OK\n")
        );
    }
    let out = sh(work.path(), "sha256sum -c checksums.sha256").await;
    assert!(out.status.success(), "{}", show(&out));
    // A damaged download is caught.
    let mut damaged = f.arm64.clone();
    damaged[1000] ^= 0x01;
    std::fs::write(work.path().join("plexd-linux-arm64"), damaged).unwrap();
    let out = sh(
        work.path(),
        "grep ' plexd-linux-arm64$' checksums.sha256 | sha256sum -c -",
    )
    .await;
    assert!(!out.status.success(), "{}", show(&out));
}

#[tokio::test]
async fn head_has_the_length_and_no_body() {
    let f = fixture(false).await;
    let url = f.server.url("/downloads/plexd/linux-amd64");
    let resp = client().head(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()[header::CONTENT_LENGTH],
        f.amd64.len().to_string().as_str()
    );
    assert_eq!(
        resp.headers()[header::ETAG],
        format!("\"{}\"", sha256_hex(&f.amd64)).as_str()
    );
    assert!(resp.bytes().await.unwrap().is_empty());

    // The same through curl: headers only, and nothing written as a body.
    let work = tempfile::tempdir().unwrap();
    let out = sh(work.path(), &format!("curl -fsSI -o body {url}")).await;
    assert!(out.status.success(), "{}", show(&out));
    let head = std::fs::read_to_string(work.path().join("body")).unwrap();
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("content-length: {}", f.amd64.len())),
        "{head}"
    );

    let resp = client()
        .head(f.server.url("/downloads/plexd/checksums.sha256"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Two lines of 64 hex digits, two spaces, the 17-character name and a newline.
    assert_eq!(resp.headers()[header::CONTENT_LENGTH], "168");
    assert!(resp.bytes().await.unwrap().is_empty());
}

#[tokio::test]
async fn unknown_and_missing_platforms_are_404_unknown_platform() {
    let f = fixture(false).await;
    for slug in ["linux-riscv64", "windows-amd64", "plexd-linux-amd64"] {
        let resp = get(&f.server.url(&format!("/downloads/plexd/{slug}"))).await;
        let (status, code, message) = api_error(resp).await;
        assert_eq!((status, code.as_str()), (404, "unknown_platform"), "{slug}");
        assert!(message.contains(slug), "{message}");
    }

    // A known platform this release lacks: 404 unknown_platform, and out of the checksums.
    std::fs::remove_file(f.artifacts.path().join("plexd-linux-arm64")).unwrap();
    let (status, code, message) =
        api_error(get(&f.server.url("/downloads/plexd/linux-arm64")).await).await;
    assert_eq!((status, code.as_str()), (404, "unknown_platform"));
    assert!(message.contains("plexd-linux-arm64"), "{message}");
    let text = get(&f.server.url("/downloads/plexd/checksums.sha256"))
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(
        text,
        format!("{}  plexd-linux-amd64\n", sha256_hex(&f.amd64))
    );

    // Writing is refused with a JSON 405.
    let resp = client()
        .post(f.server.url("/downloads/plexd/linux-amd64"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()[header::ALLOW], "GET, HEAD");
    let (status, code, _) = api_error(resp).await;
    assert_eq!((status, code.as_str()), (405, "invalid_request"));

    // Without a signer there is no signature and no key.
    for path in ["checksums.sha256.sig", "signing-key.pem"] {
        let (status, code, _) =
            api_error(get(&f.server.url(&format!("/downloads/plexd/{path}"))).await).await;
        assert_eq!((status, code.as_str()), (404, "not_found"), "{path}");
    }
}

#[tokio::test]
async fn a_replaced_binary_is_served_with_new_checksums() {
    let f = fixture(false).await;
    let before = get(&f.server.url("/downloads/plexd/checksums.sha256"))
        .await
        .text()
        .await
        .unwrap();
    let rebuilt = fake_binary(3, 250_000);
    let staged = f.artifacts.path().join(".plexd-linux-amd64.new");
    std::fs::write(&staged, &rebuilt).unwrap();
    std::fs::rename(&staged, f.artifacts.path().join("plexd-linux-amd64")).unwrap();

    let after = get(&f.server.url("/downloads/plexd/checksums.sha256"))
        .await
        .text()
        .await
        .unwrap();
    assert_ne!(before, after);
    assert!(after.starts_with(&format!("{}  plexd-linux-amd64\n", sha256_hex(&rebuilt))));
    let resp = get(&f.server.url("/downloads/plexd/linux-amd64")).await;
    assert_eq!(
        resp.headers()[header::ETAG],
        format!("\"{}\"", sha256_hex(&rebuilt)).as_str()
    );
    assert_eq!(resp.bytes().await.unwrap().as_ref(), rebuilt.as_slice());
}

#[tokio::test]
async fn the_signature_verifies_with_openssl_and_fails_on_a_flipped_byte() {
    let f = fixture(true).await;
    let work = tempfile::tempdir().unwrap();
    let base = f.server.url("/downloads/plexd");
    let out = sh(
        work.path(),
        &format!(
            "set -e
             curl -fsSo checksums.sha256 {base}/checksums.sha256
             curl -fsSo checksums.sha256.sig {base}/checksums.sha256.sig
             curl -fsSo signing-key.pem {base}/signing-key.pem"
        ),
    )
    .await;
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(
        std::fs::metadata(work.path().join("checksums.sha256.sig"))
            .unwrap()
            .len(),
        64
    );
    let verify = |dir: &Path| {
        let dir = dir.to_owned();
        async move {
            sh(
                &dir,
                "openssl pkeyutl -verify -pubin -inkey signing-key.pem -rawin \
                 -in checksums.sha256 -sigfile checksums.sha256.sig",
            )
            .await
        }
    };
    let out = verify(work.path()).await;
    assert!(out.status.success(), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Signature Verified Successfully"));

    // One flipped byte in the checksums: refused.
    let path = work.path().join("checksums.sha256");
    let good = std::fs::read(&path).unwrap();
    let mut bad = good.clone();
    bad[5] ^= 0x01;
    std::fs::write(&path, &bad).unwrap();
    let out = verify(work.path()).await;
    assert!(!out.status.success(), "{}", show(&out));

    // One flipped byte in the signature: refused.
    std::fs::write(&path, &good).unwrap();
    let sig_path = work.path().join("checksums.sha256.sig");
    let mut sig = std::fs::read(&sig_path).unwrap();
    sig[10] ^= 0x80;
    std::fs::write(&sig_path, &sig).unwrap();
    let out = verify(work.path()).await;
    assert!(!out.status.success(), "{}", show(&out));

    // The key is the Domain's.
    let pem = std::fs::read_to_string(work.path().join("signing-key.pem")).unwrap();
    let domain = DomainSigner::from_seed(&[42u8; 32]).unwrap();
    let signer = ChecksumSigner::from_domain(Arc::new(domain)).unwrap();
    assert_eq!(pem, signer.public_key_pem());
}

#[tokio::test]
async fn the_index_offers_the_version_and_paths() {
    let f = fixture(true).await;
    let resp = get(&f.server.url("/downloads/plexd")).await;
    assert_eq!(resp.status(), 200);
    let index: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(
        index,
        serde_json::json!({
            "name": "plexd",
            "version": VERSION,
            "source": "local",
            "platforms": [
                {"platform": "linux-amd64", "file": "plexd-linux-amd64",
                 "path": "/downloads/plexd/linux-amd64", "sha256": sha256_hex(&f.amd64)},
                {"platform": "linux-arm64", "file": "plexd-linux-arm64",
                 "path": "/downloads/plexd/linux-arm64", "sha256": sha256_hex(&f.arm64)},
            ],
            "checksums": "/downloads/plexd/checksums.sha256",
            "signature": "/downloads/plexd/checksums.sha256.sig",
            "signing_key": "/downloads/plexd/signing-key.pem",
        })
    );
}

#[tokio::test]
async fn merges_into_a_server_router_that_has_its_own_fallbacks() {
    use axum::Router;
    use axum::http::StatusCode;

    let artifacts = tempfile::tempdir().unwrap();
    let amd64 = fake_binary(5, 10_000);
    std::fs::write(artifacts.path().join("plexd-linux-amd64"), &amd64).unwrap();
    let downloads = Arc::new(
        Downloads::open(DownloadsConfig::local(VERSION, artifacts.path()), None)
            .await
            .unwrap(),
    );
    // The shape of the plexsphere API router: its own routes, fallback and 405 fallback.
    let api = Router::new()
        .route("/v1/version", axum::routing::get(|| async { "api" }))
        .fallback(|| async { (StatusCode::NOT_FOUND, "api fallback") })
        .method_not_allowed_fallback(|| async { (StatusCode::METHOD_NOT_ALLOWED, "api 405") });
    let server = Server::start(api.merge(router(downloads))).await;

    let resp = get(&server.url("/downloads/plexd/linux-amd64")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), amd64.as_slice());
    assert_eq!(
        get(&server.url("/v1/version")).await.text().await.unwrap(),
        "api"
    );
    assert_eq!(
        get(&server.url("/downloads/other"))
            .await
            .text()
            .await
            .unwrap(),
        "api fallback"
    );
    let (status, code, _) = api_error(
        client()
            .delete(server.url("/downloads/plexd/checksums.sha256"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, code.as_str()), (405, "invalid_request"));
}
