//! Ranges, conditions and resuming on the local artifacts source, checked with curl.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns

mod support;

use reqwest::header;
use support::local::fixture;
use support::{client, sh, sha256_hex, show};

#[tokio::test]
async fn ranges_and_conditions() {
    let f = fixture(false).await;
    let url = f.server.url("/downloads/plexd/linux-amd64");
    let len = f.amd64.len();
    let etag = format!("\"{}\"", sha256_hex(&f.amd64));
    let ranged = |range: &str| {
        client()
            .get(&url)
            .header(header::RANGE, range.to_owned())
            .send()
    };

    let resp = ranged("bytes=100-199").await.unwrap();
    assert_eq!(resp.status(), 206);
    assert_eq!(
        resp.headers()[header::CONTENT_RANGE],
        format!("bytes 100-199/{len}").as_str()
    );
    assert_eq!(resp.headers()[header::CONTENT_LENGTH], "100");
    assert_eq!(resp.bytes().await.unwrap().as_ref(), &f.amd64[100..200]);

    let resp = ranged("bytes=-10").await.unwrap();
    assert_eq!(resp.status(), 206);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), &f.amd64[len - 10..]);

    let resp = ranged(&format!("bytes={}-", len - 70_000)).await.unwrap();
    assert_eq!(resp.status(), 206);
    assert_eq!(
        resp.bytes().await.unwrap().as_ref(),
        &f.amd64[len - 70_000..]
    );

    let resp = ranged(&format!("bytes={len}-")).await.unwrap();
    assert_eq!(resp.status(), 416);
    assert_eq!(
        resp.headers()[header::CONTENT_RANGE],
        format!("bytes */{len}").as_str()
    );

    // Several ranges: the whole file.
    let resp = ranged("bytes=0-1,5-6").await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().len(), len);

    // If-Range with another version's tag: the whole (current) file.
    let resp = client()
        .get(&url)
        .header(header::RANGE, "bytes=10-")
        .header(header::IF_RANGE, "\"0000\"")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = client()
        .get(&url)
        .header(header::RANGE, "bytes=10-")
        .header(header::IF_RANGE, etag.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 206);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), &f.amd64[10..]);

    let resp = client()
        .get(&url)
        .header(header::IF_NONE_MATCH, etag.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 304);
    assert_eq!(resp.headers()[header::ETAG], etag.as_str());
}

#[tokio::test]
async fn curl_resumes_a_partial_download_to_the_exact_bytes() {
    let f = fixture(false).await;
    let url = f.server.url("/downloads/plexd/linux-amd64");
    let work = tempfile::tempdir().unwrap();
    let target = work.path().join("plexd-linux-amd64");
    std::fs::write(&target, &f.amd64[..123_457]).unwrap();
    let out = sh(
        work.path(),
        &format!("curl -fsS -C - -o plexd-linux-amd64 {url}"),
    )
    .await;
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(std::fs::read(&target).unwrap(), f.amd64);

    // Resuming a complete file: the server answers 416, which curl (without -f, which fails
    // on any 4xx) takes as "already complete", leaving the file as it is.
    let out = sh(
        work.path(),
        &format!("curl -sS -C - -o plexd-linux-amd64 {url}"),
    )
    .await;
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(std::fs::read(&target).unwrap(), f.amd64);
}
