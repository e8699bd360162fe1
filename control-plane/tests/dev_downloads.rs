//! `plexsphere dev` serves the plexd downloads: checksums.sha256 for the artifacts directory,
//! signed by the lab Domain's key, and the binary itself.
#![allow(clippy::unwrap_used)]

mod common;

use common::dev;

use reqwest::StatusCode;

#[tokio::test]
async fn dev_serves_checksums_of_its_artifacts_signed_by_the_lab_domain() {
    let dir = tempfile::tempdir().unwrap();
    let artifacts = dir.path().join("artifacts-in");
    std::fs::create_dir_all(&artifacts).unwrap();
    let binary = b"#!/bin/sh\necho plexd stand-in\n".to_vec();
    std::fs::write(artifacts.join("plexd-linux-amd64"), &binary).unwrap();
    let data = dir.path().join("data");
    let (child, lines) = dev::start_dev(
        &[
            "--plexd-artifacts",
            artifacts.to_str().unwrap(),
            "--plexd-version",
            "9.9.9",
        ],
        &data,
    );
    let base = lines
        .last()
        .and_then(|l| l.strip_prefix("listening on "))
        .unwrap_or_else(|| panic!("no listening line in {lines:?}"))
        .to_owned();
    let text = lines.join("\n");
    assert!(text.contains("plexd downloads: "), "{text}");
    assert!(text.contains("(version 9.9.9)"), "{text}");
    let ca = std::fs::read_to_string(data.join("tls/ca.crt")).unwrap();
    let client = common::client_for(&ca);

    let r = client
        .get(format!("{base}/downloads/plexd/checksums.sha256"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let checksums = r.bytes().await.unwrap();
    let digest = hex::encode(ring::digest::digest(&ring::digest::SHA256, &binary));
    assert_eq!(
        std::str::from_utf8(&checksums).unwrap(),
        format!("{digest}  plexd-linux-amd64\n")
    );

    // The signature verifies with the lab Domain's public key (as /v1/domains lists it).
    let sig = client
        .get(format!("{base}/downloads/plexd/checksums.sha256.sig"))
        .send()
        .await
        .unwrap();
    assert_eq!(sig.status(), StatusCode::OK);
    let sig = sig.bytes().await.unwrap();
    let token = std::fs::read_to_string(data.join("operator-token")).unwrap();
    let domains: serde_json::Value = client
        .get(format!("{base}/v1/domains"))
        .bearer_auth(token.trim())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    use base64::Engine as _;
    let key = base64::engine::general_purpose::STANDARD
        .decode(domains["items"][0]["signing_public_key"].as_str().unwrap())
        .unwrap();
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key)
        .verify(&checksums, &sig)
        .unwrap();

    let got = client
        .get(format!("{base}/downloads/plexd/linux-amd64"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), StatusCode::OK);
    assert_eq!(got.bytes().await.unwrap().as_ref(), binary.as_slice());
    // The API's own fallback still answers unknown paths.
    let missing = client.get(format!("{base}/v1/nope")).send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    dev::stop(child);
}

#[test]
fn dev_stages_the_sibling_plexd_when_it_exists() {
    let sibling = std::path::Path::new(dev::BIN)
        .parent()
        .unwrap()
        .join("plexd");
    let dir = tempfile::tempdir().unwrap();
    let (child, lines) = dev::start_dev(&[], dir.path());
    let text = lines.join("\n");
    let staged = dir.path().join("artifacts").join(format!(
        "plexd-linux-{}",
        match std::env::consts::ARCH {
            "aarch64" => "arm64",
            _ => "amd64",
        }
    ));
    if sibling.is_file() {
        assert!(text.contains("plexd artifact: "), "{text}");
        assert_eq!(
            std::fs::read(&staged).unwrap(),
            std::fs::read(&sibling).unwrap()
        );
    } else {
        assert!(!text.contains("plexd artifact: "), "{text}");
        assert!(!staged.exists());
    }
    dev::stop(child);
}
