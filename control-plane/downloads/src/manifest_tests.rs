use ring::signature::{Ed25519KeyPair, KeyPair as _};

use super::*;
use crate::checksums::sha256;

fn pair(seed: u8) -> Ed25519KeyPair {
    Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).unwrap()
}

fn key(p: &Ed25519KeyPair) -> ReleaseKey {
    p.public_key().as_ref().try_into().unwrap()
}

fn files() -> BTreeMap<Platform, ReleaseFile> {
    let mut f = BTreeMap::new();
    f.insert(
        Platform::LinuxAmd64,
        ReleaseFile {
            sha256: sha256(b"amd"),
            size: 3,
        },
    );
    f
}

/// An envelope around hand-written manifest JSON, signed like `envelope` signs.
fn raw_envelope(manifest: &str, signer: &Ed25519KeyPair) -> Vec<u8> {
    envelope(manifest.as_bytes(), &[signer])
}

#[test]
fn a_signed_manifest_verifies_and_its_json_is_pinned() {
    let k = pair(1);
    let bytes = manifest_bytes("1.2.3", &files());
    assert_eq!(
        String::from_utf8(bytes.clone()).unwrap(),
        format!(
            r#"{{"format":"plexsphere-release-manifest/v1","name":"plexd","version":"1.2.3","platforms":{{"linux-amd64":{{"file":"plexd-linux-amd64","sha256":"{}","size":3}}}}}}"#,
            hex::encode(sha256(b"amd"))
        )
    );
    let release = verify(&envelope(&bytes, &[&k]), &[key(&k)], "1.2.3").unwrap();
    assert_eq!(release.version, "1.2.3");
    assert_eq!(release.signed_by, key(&k));
    assert_eq!(release.files, files());
}

#[test]
fn another_key_or_no_signature_is_untrusted() {
    let (good, other) = (pair(1), pair(2));
    let bytes = manifest_bytes("1.2.3", &files());
    let err = verify(&envelope(&bytes, &[&other]), &[key(&good)], "1.2.3").unwrap_err();
    assert!(
        matches!(&err, ManifestError::Untrusted { found } if found.contains(&STANDARD.encode(key(&other)))),
        "{err}"
    );
    let err = verify(&envelope(&bytes, &[]), &[key(&good)], "1.2.3").unwrap_err();
    assert_eq!(
        err,
        ManifestError::Untrusted {
            found: "no signature".into()
        }
    );
}

#[test]
fn a_rotation_envelope_with_two_signatures_verifies_with_either_key() {
    let (old, new) = (pair(1), pair(2));
    let env = envelope(&manifest_bytes("1.2.3", &files()), &[&old, &new]);
    assert!(verify(&env, &[key(&old)], "1.2.3").is_ok());
    assert_eq!(
        verify(&env, &[key(&new)], "1.2.3").unwrap().signed_by,
        key(&new)
    );
}

#[test]
fn a_changed_manifest_under_a_trusted_key_is_refused() {
    let k = pair(1);
    let env = envelope(&manifest_bytes("1.2.3", &files()), &[&k]);
    let mut v: serde_json::Value = serde_json::from_slice(&env).unwrap();
    let swapped = manifest_bytes(
        "1.2.3",
        &BTreeMap::from([(
            Platform::LinuxAmd64,
            ReleaseFile {
                sha256: sha256(b"evil"),
                size: 4,
            },
        )]),
    );
    v["manifest"] = STANDARD.encode(swapped).into();
    let err = verify(&serde_json::to_vec(&v).unwrap(), &[key(&k)], "1.2.3").unwrap_err();
    assert!(
        matches!(&err, ManifestError::Untrusted { found } if found.contains("does not verify")),
        "{err}"
    );
}

#[test]
fn a_signature_without_the_prefix_is_refused() {
    // What a Domain key signs for checksums.sha256 (no tag): never a manifest signature.
    let k = pair(1);
    let bytes = manifest_bytes("1.2.3", &files());
    let env = serde_json::json!({
        "manifest": STANDARD.encode(&bytes),
        "signatures": [{"key": STANDARD.encode(key(&k)), "signature": STANDARD.encode(k.sign(&bytes).as_ref())}],
    });
    assert!(matches!(
        verify(&serde_json::to_vec(&env).unwrap(), &[key(&k)], "1.2.3"),
        Err(ManifestError::Untrusted { .. })
    ));
}

#[test]
fn another_version_is_refused() {
    let k = pair(1);
    let env = envelope(&manifest_bytes("1.2.2", &files()), &[&k]);
    assert_eq!(
        verify(&env, &[key(&k)], "1.2.3").unwrap_err(),
        ManifestError::OtherVersion {
            found: "1.2.2".into(),
            pinned: "1.2.3".into()
        }
    );
}

#[test]
fn malformed_manifests_are_refused() {
    let k = pair(1);
    let digest = hex::encode(sha256(b"amd"));
    for (json, what) in [
        (
            format!(
                r#"{{"format":"other/v9","name":"plexd","version":"1.2.3","platforms":{{"linux-amd64":{{"file":"plexd-linux-amd64","sha256":"{digest}","size":3}}}}}}"#
            ),
            "format",
        ),
        (
            format!(
                r#"{{"format":"{FORMAT}","name":"plexd","version":"1.2.3","platforms":{{"linux-amd64":{{"file":"plexd-linux-arm64","sha256":"{digest}","size":3}}}}}}"#
            ),
            "names the file",
        ),
        (
            format!(
                r#"{{"format":"{FORMAT}","name":"plexd","version":"1.2.3","platforms":{{"linux-amd64":{{"file":"plexd-linux-amd64","sha256":"abc","size":3}}}}}}"#
            ),
            "sha256",
        ),
        (
            format!(
                r#"{{"format":"{FORMAT}","name":"plexd","version":"1.2.3","platforms":{{"linux-riscv64":{{"file":"plexd-linux-riscv64","sha256":"{digest}","size":3}}}}}}"#
            ),
            "none of",
        ),
        (
            format!(
                r#"{{"format":"{FORMAT}","name":"plexd","version":"1.2.3","extra":1,"platforms":{{}}}}"#
            ),
            "unknown field",
        ),
    ] {
        let err = verify(&raw_envelope(&json, &k), &[key(&k)], "1.2.3").unwrap_err();
        assert!(
            matches!(&err, ManifestError::Malformed(m) if m.contains(what)),
            "{what}: {err}"
        );
    }
    assert!(matches!(
        verify(b"not json", &[key(&k)], "1.2.3"),
        Err(ManifestError::Envelope(_))
    ));
    let huge = vec![b' '; MAX_ENVELOPE_BYTES as usize + 1];
    assert_eq!(
        verify(&huge, &[key(&k)], "1.2.3"),
        Err(ManifestError::TooLarge)
    );
    let many: Vec<Ed25519KeyPair> = (0..=MAX_SIGNATURES as u8).map(pair).collect();
    let refs: Vec<&Ed25519KeyPair> = many.iter().collect();
    let env = envelope(&manifest_bytes("1.2.3", &files()), &refs);
    assert_eq!(
        verify(&env, &[key(&k)], "1.2.3"),
        Err(ManifestError::TooManySignatures(MAX_SIGNATURES + 1))
    );
}
