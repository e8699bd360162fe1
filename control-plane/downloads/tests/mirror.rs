//! The mirror source against a real upstream: a small axum server over HTTPS (a test CA) on
//! 127.0.0.1:0 serving a fake release, which counts its hits and can be held, corrupted,
//! swapped or stopped.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns

mod support;

use std::sync::atomic::Ordering;

use plexsphere_downloads::PinnedChecksums;
use reqwest::header;
use support::upstream::{
    Mirror, VERSION, attacker_pair, cached_names, checksums_of, downloads, envelope_of,
    manifest_config, mirror_config, ok_text, release, release_pair, upstream,
};
use support::{api_error, client, get, sh, sha256_hex, show, wait_until};

#[tokio::test]
async fn first_request_fetches_then_the_cache_serves_also_with_the_upstream_stopped() {
    let r = release();
    let (up, u, _open) = upstream(&r, true).await;
    let cache = tempfile::tempdir().unwrap();
    let config = mirror_config(
        &up,
        PinnedChecksums::Inline(r.checksums.clone()),
        cache.path(),
    );
    let (server, _) = downloads(config.clone()).await;
    let url = server.url("/downloads/plexd/linux-amd64");

    let resp = get(&url).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()[header::ETAG],
        format!("\"{}\"", sha256_hex(&r.amd64)).as_str()
    );
    assert_eq!(resp.bytes().await.unwrap().as_ref(), r.amd64.as_slice());
    assert_eq!(u.hits("plexd-linux-amd64"), 1);
    assert_eq!(cached_names(cache.path()), vec!["plexd-linux-amd64"]);

    let resp = get(&url).await;
    assert_eq!(resp.bytes().await.unwrap().as_ref(), r.amd64.as_slice());
    assert_eq!(u.hits("plexd-linux-amd64"), 1);

    up.stop().await;
    let resp = get(&url).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), r.amd64.as_slice());
    // Ranges and the checksums work from the cache too.
    let resp = client()
        .get(&url)
        .header(header::RANGE, "bytes=1000-1999")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 206);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), &r.amd64[1000..2000]);
    let text = ok_text(&server.url("/downloads/plexd/checksums.sha256")).await;
    assert_eq!(text, r.checksums);
    // The platform never fetched: 502 with the code, while the upstream is down.
    let (status, code, _) = api_error(get(&server.url("/downloads/plexd/linux-arm64")).await).await;
    assert_eq!(
        (status, code.as_str()),
        (502, "plexd_download_upstream_unavailable")
    );
    assert_eq!(u.hits("plexd-linux-amd64"), 1);

    // A restarted server finds the verified cache on disk.
    let (restarted, _) = downloads(config).await;
    let resp = get(&restarted.url("/downloads/plexd/linux-amd64")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), r.amd64.as_slice());
}

#[tokio::test]
async fn an_unreachable_upstream_and_an_empty_cache_is_502_with_the_code() {
    let r = release();
    let (up, u, _open) = upstream(&r, true).await;
    let addr = Mirror::from(&up);
    up.stop().await;
    let cache = tempfile::tempdir().unwrap();
    let (server, _) = downloads(mirror_config(
        addr,
        PinnedChecksums::Inline(r.checksums.clone()),
        cache.path(),
    ))
    .await;
    for arch in ["amd64", "arm64"] {
        let resp = get(&server.url(&format!("/downloads/plexd/linux-{arch}"))).await;
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
        let (status, code, message) = api_error(resp).await;
        assert_eq!(
            (status, code.as_str()),
            (502, "plexd_download_upstream_unavailable")
        );
        assert!(!message.contains("127.0.0.1"), "{message}");
    }
    // What curl shows an operator following the runbook.
    let work = tempfile::tempdir().unwrap();
    let out = sh(
        work.path(),
        &format!(
            "curl -fsSLo plexd {}",
            server.url("/downloads/plexd/linux-amd64")
        ),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("502"),
        "{}",
        show(&out)
    );
    assert_eq!(cached_names(cache.path()), Vec::<String>::new());
    assert_eq!(u.hits("plexd-linux-amd64"), 0);
    // The pinned checksums are still served: they are configuration.
    let text = ok_text(&server.url("/downloads/plexd/checksums.sha256")).await;
    assert_eq!(text, r.checksums);
}

#[tokio::test]
async fn a_corrupted_upstream_binary_is_502_and_never_cached() {
    let r = release();
    let (up, u, _open) = upstream(&r, true).await;
    let mut corrupt = r.amd64.clone();
    corrupt[12_345] ^= 0x40;
    u.put("plexd-linux-amd64", corrupt);
    let cache = tempfile::tempdir().unwrap();
    let (server, _) = downloads(mirror_config(
        &up,
        PinnedChecksums::Inline(r.checksums.clone()),
        cache.path(),
    ))
    .await;
    let url = server.url("/downloads/plexd/linux-amd64");

    let (status, code, message) = api_error(get(&url).await).await;
    assert_eq!(
        (status, code.as_str()),
        (502, "plexd_download_checksum_mismatch")
    );
    assert!(message.contains("plexd-linux-amd64"), "{message}");
    assert_eq!(u.hits("plexd-linux-amd64"), 1);
    // Nothing kept: no binary, no temporary file.
    assert_eq!(cached_names(cache.path()), Vec::<String>::new());

    // Not cached: the next request asks the upstream again.
    let (status, code, _) = api_error(get(&url).await).await;
    assert_eq!(
        (status, code.as_str()),
        (502, "plexd_download_checksum_mismatch")
    );
    assert_eq!(u.hits("plexd-linux-amd64"), 2);

    // Once the mirror is fixed, the right binary is served and cached.
    u.put("plexd-linux-amd64", r.amd64.clone());
    let resp = get(&url).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), r.amd64.as_slice());
    assert_eq!(u.hits("plexd-linux-amd64"), 3);
    assert_eq!(cached_names(cache.path()), vec!["plexd-linux-amd64"]);
}

#[tokio::test]
async fn ten_concurrent_first_requests_fetch_once() {
    let r = release();
    let (up, u, open) = upstream(&r, false).await;
    let cache = tempfile::tempdir().unwrap();
    let (server, seen) = downloads(mirror_config(
        &up,
        PinnedChecksums::Inline(r.checksums.clone()),
        cache.path(),
    ))
    .await;
    let url = server.url("/downloads/plexd/linux-arm64");
    let requests: Vec<_> = (0..10)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let resp = get(&url).await;
                (resp.status().as_u16(), resp.bytes().await.unwrap().to_vec())
            })
        })
        .collect();
    // All ten are inside the server while the one upstream fetch is held open.
    wait_until(
        "ten requests reached the server and one reached the upstream",
        || seen.load(Ordering::SeqCst) == 10 && u.hits("plexd-linux-arm64") == 1,
    )
    .await;
    open.send(true).unwrap();
    for r2 in requests {
        let (status, body) = r2.await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(body, r.arm64);
    }
    assert_eq!(u.hits("plexd-linux-arm64"), 1);
}

#[tokio::test]
async fn concurrent_requests_share_one_failed_fetch() {
    let r = release();
    let (up, u, open) = upstream(&r, false).await;
    u.put("plexd-linux-arm64", b"not plexd".to_vec());
    let cache = tempfile::tempdir().unwrap();
    let (server, seen) = downloads(mirror_config(
        &up,
        PinnedChecksums::Inline(r.checksums.clone()),
        cache.path(),
    ))
    .await;
    let url = server.url("/downloads/plexd/linux-arm64");
    let requests: Vec<_> = (0..5)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { api_error(get(&url).await).await })
        })
        .collect();
    wait_until("five requests reached the server", || {
        seen.load(Ordering::SeqCst) == 5 && u.hits("plexd-linux-arm64") == 1
    })
    .await;
    open.send(true).unwrap();
    for r2 in requests {
        let (status, code, _) = r2.await.unwrap();
        assert_eq!(
            (status, code.as_str()),
            (502, "plexd_download_checksum_mismatch")
        );
    }
    // The four that queued behind the failed fetch did not each retry it.
    assert_eq!(u.hits("plexd-linux-arm64"), 1);
}

#[tokio::test]
async fn a_signed_manifest_is_fetched_once_verified_and_kept_on_disk() {
    let r = release();
    let (up, u, _open) = upstream(&r, true).await;
    let cache = tempfile::tempdir().unwrap();
    let config = manifest_config(&up, cache.path());
    let (server, _) = downloads(config.clone()).await;
    for _ in 0..2 {
        let text = ok_text(&server.url("/downloads/plexd/checksums.sha256")).await;
        assert_eq!(text, r.checksums);
    }
    assert_eq!(u.hits("plexd-release.json"), 1);
    // The mirror's own sha256sum list is never read.
    assert_eq!(u.hits("checksums.sha256"), 0);
    let resp = get(&server.url("/downloads/plexd/linux-amd64")).await;
    assert_eq!(resp.bytes().await.unwrap().as_ref(), r.amd64.as_slice());
    assert_eq!(
        cached_names(cache.path()),
        vec!["plexd-linux-amd64", "plexd-release.json"]
    );

    // Restarted with the upstream gone: the kept manifest (verified again) and binary serve.
    up.stop().await;
    let (restarted, _) = downloads(config).await;
    let text = ok_text(&restarted.url("/downloads/plexd/checksums.sha256")).await;
    assert_eq!(text, r.checksums);
    let resp = get(&restarted.url("/downloads/plexd/linux-amd64")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), r.amd64.as_slice());
    let index: serde_json::Value = get(&restarted.url("/downloads/plexd"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(index["source"], "mirror");
    assert_eq!(index["version"], VERSION);
    assert_eq!(index["platforms"].as_array().map(Vec::len), Some(2));
}

/// The attack of issue 12: whoever controls the mirror swaps the binaries and publishes
/// checksums (and a manifest) that match them. Nothing of it is served or cached.
#[tokio::test]
async fn a_swapped_binary_with_matching_swapped_checksums_is_refused() {
    let r = release();
    let (up, u, _open) = upstream(&r, true).await;
    let evil_amd64 = support::fake_binary(99, 400_000);
    let evil_arm64 = support::fake_binary(98, 150_001);
    u.put("plexd-linux-amd64", evil_amd64.clone());
    u.put("plexd-linux-arm64", evil_arm64.clone());
    u.put(
        "checksums.sha256",
        checksums_of(&evil_amd64, &evil_arm64).into_bytes(),
    );
    let attacker = attacker_pair();
    let evil_signed = envelope_of(VERSION, &evil_amd64, &evil_arm64, &[&attacker]);
    let evil_unsigned = envelope_of(VERSION, &evil_amd64, &evil_arm64, &[]);
    // Signed by the trusted key, but the manifest of another version.
    let other_version = envelope_of("1.2.2", &evil_amd64, &evil_arm64, &[&release_pair()]);
    // Signed by the trusted key, but not a manifest.
    let malformed = plexsphere_downloads::manifest::envelope(b"not json", &[&release_pair()]);

    for (what, body) in [
        ("signed by another key", evil_signed),
        ("unsigned", evil_unsigned),
        ("for another version", other_version),
        ("malformed", malformed),
        ("not an envelope", b"garbage".to_vec()),
    ] {
        u.put("plexd-release.json", body);
        let cache = tempfile::tempdir().unwrap();
        let (server, _) = downloads(manifest_config(&up, cache.path())).await;
        for path in [
            "/downloads/plexd/linux-amd64",
            "/downloads/plexd/checksums.sha256",
        ] {
            let (status, code, message) = api_error(get(&server.url(path)).await).await;
            assert_eq!(
                (status, code.as_str()),
                (502, "plexd_download_release_unverified"),
                "{what}: {path}: {message}"
            );
        }
        let index: serde_json::Value = get(&server.url("/downloads/plexd"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(index["platforms"], serde_json::json!([]), "{what}");
        assert_eq!(
            index["problem"]["code"],
            "plexd_download_release_unverified"
        );
        // Nothing kept, and no binary was even asked for.
        assert_eq!(cached_names(cache.path()), Vec::<String>::new(), "{what}");
        assert_eq!(u.hits("plexd-linux-amd64"), 0, "{what}");
    }
    assert_eq!(u.hits("checksums.sha256"), 0);
}

/// A release verified once stays: a mirror swapped later (binaries and a manifest signed by
/// another key) changes nothing a restarted server serves, and a cached binary that was
/// tampered with is fetched again and refused, never replaced by the swapped one.
#[tokio::test]
async fn a_verified_release_stays_when_the_mirror_is_swapped_later() {
    let r = release();
    let (up, u, _open) = upstream(&r, true).await;
    let cache = tempfile::tempdir().unwrap();
    let config = manifest_config(&up, cache.path());
    let (server, _) = downloads(config.clone()).await;
    let resp = get(&server.url("/downloads/plexd/linux-amd64")).await;
    assert_eq!(resp.bytes().await.unwrap().as_ref(), r.amd64.as_slice());

    let evil = support::fake_binary(99, 400_000);
    u.put("plexd-linux-amd64", evil.clone());
    u.put(
        "plexd-release.json",
        envelope_of(VERSION, &evil, &r.arm64, &[&attacker_pair()]),
    );
    let (restarted, _) = downloads(config.clone()).await;
    let text = ok_text(&restarted.url("/downloads/plexd/checksums.sha256")).await;
    assert_eq!(text, r.checksums);
    let resp = get(&restarted.url("/downloads/plexd/linux-amd64")).await;
    assert_eq!(resp.bytes().await.unwrap().as_ref(), r.amd64.as_slice());
    assert_eq!(u.hits("plexd-release.json"), 1);

    // Someone replaces the cached binary: it no longer matches the signed manifest, is
    // discarded, fetched again from the swapped mirror, and refused.
    let cached = cache.path().join(VERSION).join("plexd-linux-amd64");
    let staged = cache.path().join(VERSION).join("tampered");
    std::fs::write(&staged, &evil).unwrap();
    std::fs::rename(&staged, &cached).unwrap();
    let (status, code, _) =
        api_error(get(&restarted.url("/downloads/plexd/linux-amd64")).await).await;
    assert_eq!(
        (status, code.as_str()),
        (502, "plexd_download_checksum_mismatch")
    );
    assert!(!cached.exists());
}

#[tokio::test]
async fn without_checksums_the_index_still_offers_the_version() {
    let r = release();
    let (up, _u, _open) = upstream(&r, true).await;
    let addr = Mirror::from(&up);
    up.stop().await;
    let cache = tempfile::tempdir().unwrap();
    let (server, _) = downloads(manifest_config(addr, cache.path())).await;
    let (status, code, _) =
        api_error(get(&server.url("/downloads/plexd/checksums.sha256")).await).await;
    assert_eq!(
        (status, code.as_str()),
        (502, "plexd_download_upstream_unavailable")
    );
    let index: serde_json::Value = get(&server.url("/downloads/plexd"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(index["version"], VERSION);
    assert_eq!(index["platforms"], serde_json::json!([]));
    assert_eq!(
        index["problem"]["code"],
        "plexd_download_upstream_unavailable"
    );
}

#[tokio::test]
async fn a_platform_the_pinned_checksums_lack_is_404_without_asking_the_upstream() {
    let r = release();
    let (up, u, _open) = upstream(&r, true).await;
    let only_amd64 = format!("{}  plexd-linux-amd64\n", sha256_hex(&r.amd64));
    let cache = tempfile::tempdir().unwrap();
    let (server, _) = downloads(mirror_config(
        &up,
        PinnedChecksums::Inline(only_amd64),
        cache.path(),
    ))
    .await;
    let (status, code, _) = api_error(get(&server.url("/downloads/plexd/linux-arm64")).await).await;
    assert_eq!((status, code.as_str()), (404, "unknown_platform"));
    assert_eq!(u.hits("plexd-linux-arm64"), 0);
}

#[tokio::test]
async fn a_tampered_cache_file_is_discarded_and_fetched_again() {
    let r = release();
    let (up, u, _open) = upstream(&r, true).await;
    let cache = tempfile::tempdir().unwrap();
    let config = mirror_config(
        &up,
        PinnedChecksums::Inline(r.checksums.clone()),
        cache.path(),
    );
    let (server, _) = downloads(config).await;
    let url = server.url("/downloads/plexd/linux-amd64");
    assert_eq!(get(&url).await.status(), 200);
    let cached = cache.path().join(VERSION).join("plexd-linux-amd64");
    let mut bytes = std::fs::read(&cached).unwrap();
    bytes[0] ^= 0xff;
    // Replaced (a new inode), as a restore or a tampering tool would; an in-place rewrite
    // within the file system's timestamp tick would keep the same fstat.
    let staged = cache.path().join(VERSION).join("tampered");
    std::fs::write(&staged, bytes).unwrap();
    std::fs::rename(&staged, &cached).unwrap();

    let resp = get(&url).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), r.amd64.as_slice());
    assert_eq!(u.hits("plexd-linux-amd64"), 2);
    assert_eq!(std::fs::read(&cached).unwrap(), r.amd64);
}
