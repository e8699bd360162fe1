//! The rendered document passes the REAL `cloud-init schema` (Debian 12's cloud-init 22.4).
//! Under CI a missing cloud-init fails the test; elsewhere it is skipped with a message.
//! Install: `mkdir -p /etc/cloud && touch /etc/cloud/cloud-init.disabled &&
//! apt-get install -y --no-install-recommends cloud-init` (the marker keeps it from acting on
//! the host).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::process::Command;

fn schema_check(path: &std::path::Path) -> (bool, String) {
    let out = Command::new("cloud-init")
        .args(["schema", "--config-file"])
        .arg(path)
        .output()
        .expect("run cloud-init schema");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

const HINT: &str = "mkdir -p /etc/cloud && touch /etc/cloud/cloud-init.disabled && apt-get install -y --no-install-recommends cloud-init";

#[test]
fn rendered_document_passes_cloud_init_schema() {
    if !common::require("cloud-init", HINT) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("user-data");
    std::fs::write(&path, common::document().as_str()).unwrap();
    let (ok, text) = schema_check(&path);
    assert!(ok, "cloud-init schema refused the document:\n{text}");
    assert!(text.contains("Valid cloud-config"), "{text}");
}

#[test]
fn cloud_init_schema_does_refuse_a_broken_document() {
    // The check above can fail: the same tool refuses a document with a misspelt ca_certs key.
    if !common::require("cloud-init", HINT) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("user-data");
    let broken = common::document()
        .as_str()
        .replacen("  trusted:", "  trustd:", 1);
    std::fs::write(&path, broken).unwrap();
    let (ok, text) = schema_check(&path);
    assert!(!ok, "cloud-init schema accepted a broken document:\n{text}");
}
