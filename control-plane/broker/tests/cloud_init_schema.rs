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

#[test]
fn runcmd_stops_at_the_first_failing_command() {
    // cloud-init's own shellify (the code that writes /var/lib/cloud/instance/scripts/runcmd)
    // turns our runcmd into a script; run it where /etc/plexd/install-plexd.sh does not exist:
    // it must stop there (127), never reaching `plexd join` or `systemctl`.
    if !common::require("cloud-init", HINT) {
        return;
    }
    let v: serde_yaml::Value = serde_yaml::from_str(common::document().as_str()).unwrap();
    let runcmd = serde_json::to_string(&v["runcmd"]).unwrap();
    let py = format!(
        "import json, sys\nfrom cloudinit import util\nsys.stdout.write(util.shellify(json.loads({runcmd:?})))"
    );
    let out = Command::new("/usr/bin/python3")
        .args(["-c", &py])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let script = String::from_utf8(out.stdout).unwrap();
    assert!(
        script.starts_with("#!/bin/sh\nset -e\n'/etc/plexd/install-plexd.sh'\n'plexd' 'join' '--result-file' '/run/plexd/join-result.json'\n"),
        "{script}"
    );
    if std::path::Path::new("/etc/plexd/install-plexd.sh").exists() {
        eprintln!("SKIPPED the run: this host has /etc/plexd/install-plexd.sh");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("reached");
    // `plexd` and `systemctl` leave a marker if anything after the failure runs.
    let script = script.replace("'plexd'", &format!("touch {} && echo", marker.display()));
    let script = script.replace(
        "'systemctl'",
        &format!("touch {} && echo", marker.display()),
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert!(!marker.exists(), "a command after the failing one ran");

    // A failing `plexd join` (exit 11, a refused token) stops it too, with join's status:
    // neither `plexd install` nor `systemctl` runs.
    let join_fails = script
        .replace("'/etc/plexd/install-plexd.sh'", "true")
        .replacen(
            &format!("touch {} && echo 'join'", marker.display()),
            "sh -c 'exit 11' join",
            1,
        );
    assert!(join_fails.contains("sh -c 'exit 11' join"), "{join_fails}");
    let out = Command::new("sh")
        .args(["-c", &join_fails])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(11), "{out:?}");
    assert!(!marker.exists(), "a command after the failed join ran");
}
