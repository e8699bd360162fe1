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
fn runcmd_stops_at_a_failed_install_and_starts_the_unit_after_any_join() {
    // cloud-init's own shellify (the code that writes /var/lib/cloud/instance/scripts/runcmd)
    // turns our runcmd into a script; run it where /etc/plexd/install-plexd.sh does not exist:
    // it must stop there (127), never reaching `plexd` or `systemctl`.
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
        script.starts_with(
            "#!/bin/sh\nset -e\n'/etc/plexd/install-plexd.sh'\n'plexd' 'install' '--api-url' "
        ),
        "{script}"
    );
    assert!(
        script.contains("\n'systemctl' 'enable' 'plexd'\n'sh' '-c' 'rc=0; plexd join --result-file /run/plexd/join-result.json || rc=$?; case $rc in 0|12|13|14) systemctl start --no-block plexd; exit 0;; esac; exit $rc'\n"),
        "{script}"
    );
    assert!(
        plexsphere_broker::cloudinit::JOIN_THEN_START
            .contains(plexsphere_broker::cloudinit::JOIN_RESULT_PATH)
    );
    if std::path::Path::new("/etc/plexd/install-plexd.sh").exists() {
        eprintln!("SKIPPED the run: this host has /etc/plexd/install-plexd.sh");
        return;
    }
    // Stand-ins for plexd and systemctl on PATH log every call; `plexd join` exits with
    // $JOIN_EXIT.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for (name, body) in [
        (
            "plexd",
            "echo \"plexd $*\" >> \"$CALLS\"; [ \"$1\" = join ] && exit \"$JOIN_EXIT\"; exit 0",
        ),
        ("systemctl", "echo \"systemctl $*\" >> \"$CALLS\""),
    ] {
        let path = bin.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let run = |script: &str, join_exit: &str| {
        let _ = std::fs::remove_file(&log);
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = Command::new("sh")
            .args(["-c", script])
            .env("PATH", path)
            .env("CALLS", &log)
            .env("JOIN_EXIT", join_exit)
            .output()
            .unwrap();
        (
            out.status.code(),
            std::fs::read_to_string(&log).unwrap_or_default(),
        )
    };
    // The install script is missing: runcmd stops there (127), nothing after it runs.
    let (code, calls) = run(&script, "0");
    assert_eq!(code, Some(127), "{calls}");
    assert_eq!(calls, "", "a command after the failing one ran");

    // The unit is enabled before the join. A join that worked, or failed in a way the unit's
    // restarts may fix (12, 13 the API stayed unreachable, 14), starts it and ends runcmd well:
    // `plexd run` finishes the join under systemd. A refusal no restart fixes (10, 11, 16) is
    // cloud-init's result, with join's status, and leaves the unit enabled but not started.
    let with_script = script.replace("'/etc/plexd/install-plexd.sh'", "true");
    for (join_exit, status, started) in [
        ("0", 0, true),
        ("12", 0, true),
        ("13", 0, true),
        ("14", 0, true),
        ("10", 10, false),
        ("11", 11, false),
        ("16", 16, false),
    ] {
        let (code, calls) = run(&with_script, join_exit);
        assert_eq!(code, Some(status), "join exit {join_exit}: {calls}");
        let calls: Vec<&str> = calls.lines().collect();
        assert!(
            calls
                .first()
                .is_some_and(|c| c.starts_with("plexd install --api-url https://")),
            "{calls:?}"
        );
        let mut want = vec![
            "systemctl enable plexd",
            "plexd join --result-file /run/plexd/join-result.json",
        ];
        if started {
            want.push("systemctl start --no-block plexd");
        }
        assert_eq!(&calls[1..], want.as_slice(), "join exit {join_exit}");
    }
}
