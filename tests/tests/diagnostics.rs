//! The diagnostics and enrolment that survives boot, across processes: `plexd join` retrying
//! a control plane that is not listening yet (and giving up at `--max-wait`), `plexd status
//! --output json` with no daemon, and `plexd bugreport` of a real enrolled node, whose tarball
//! must not hold a byte of its token, credential or private key.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::process::Command;
use std::time::Duration;

use plexsphere_e2e::{ControlPlane, Host, LAB_NODES_PROJECT, Proc, wait_until};

/// How long a join may take once its control plane listens (its retries are at most 30 s apart).
const JOIN_BOUND: Duration = Duration::from_secs(90);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A host configured against `url` (trusting `cp`'s CA) with a fresh token of `cp`.
fn host_for(cp: &ControlPlane, root: &std::path::Path, url: &str) -> Host {
    let host = Host::new(root).unwrap();
    host.write_config(url, &cp.ca_file(), LAB_NODES_PROJECT, "diag-1", "")
        .unwrap();
    host.write_token(&cp.issue_token(LAB_NODES_PROJECT).unwrap())
        .unwrap();
    host
}

#[test]
fn join_started_before_the_control_plane_listens_succeeds_once_it_does() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("cp");
    let mut cp = ControlPlane::start_dev(&data).unwrap();
    let listen = cp.addr().unwrap().to_string();
    let host = host_for(&cp, &tmp.path().join("host"), &cp.url);
    // The control plane goes away (its data dir, CA and token stay) before the node joins.
    cp.proc.terminate(Duration::from_secs(30)).unwrap();
    drop(cp);

    let mut cmd = host.command().unwrap();
    cmd.args(["join", "--max-wait", "120s"]);
    let mut join = Proc::spawn(cmd).unwrap();
    // It retries, saying why and when it tries next.
    let line = join
        .wait_for_line(Duration::from_secs(30), |l| l.contains("retrying in"))
        .unwrap();
    assert!(line.contains("is not reachable"), "{line}");
    // And again (the first line was taken above).
    join.wait_for_line(Duration::from_secs(30), |l| l.contains("retrying in"))
        .unwrap();

    let _cp = ControlPlane::start_dev_on(&data, &listen, &[]).unwrap();
    let status = wait_until(JOIN_BOUND, "the join finishes", || join.try_exit()).unwrap();
    let out = join.output();
    println!("--- join output:\n{out}");
    assert!(status.success(), "join failed:\n{out}");
    assert!(
        out.contains("node_id: ") && out.contains("mesh_ip: "),
        "{out}"
    );
    assert!(host.state_dir().join("identity.json").is_file());
}

#[test]
fn join_against_a_port_that_never_opens_gives_up_at_max_wait_with_13() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev(&tmp.path().join("cp")).unwrap();
    // A port nothing listens on: bound once to find it free, then released.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let host = host_for(&cp, &tmp.path().join("host"), &format!("https://{closed}"));
    let out = host
        .plexd(&["join", "--max-wait", "4s", "--output", "json"])
        .unwrap();
    let err = text(&out.stderr);
    println!("--- join stderr:\n{err}");
    assert_eq!(out.status.code(), Some(13), "{err}");
    assert!(err.matches("retrying in").count() >= 2, "{err}");
    assert!(
        err.contains(&format!("the API at https://{closed} is not reachable"))
            && err.contains("attempts over 4s, --max-wait)"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exit_code"], 13);
    assert_eq!(v["error"], "api_unreachable");
    assert!(!host.state_dir().join("identity.json").exists());
    // The token was not spent: it is still there for the next attempt.
    assert!(host.token_file().is_file());
}

#[test]
fn status_in_json_with_the_daemon_down_says_so_with_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    let host = Host::new(&tmp.path().join("host")).unwrap();
    let out = host.plexd(&["status", "--output", "json"]).unwrap();
    println!("--- stdout:\n{}", text(&out.stdout));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["error"], "not_running");
    assert_eq!(v["exit_code"], 3);
    assert!(
        v["message"]
            .as_str()
            .unwrap_or_default()
            .contains("plexd is not running"),
        "{v}"
    );
    // The same for a rotation, which needs the daemon too.
    let out = host.plexd(&["rotate-key", "-o", "json"]).unwrap();
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"], "not_running");
    let out = host.plexd(&["version", "-o", "json"]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["plexd_version"].is_string(), "{v}");
}

#[test]
fn bugreport_of_an_enrolled_node_holds_none_of_its_secrets() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev(&tmp.path().join("cp")).unwrap();
    let host = host_for(&cp, &tmp.path().join("host"), &cp.url);
    let out = host.plexd(&["join", "--output", "json"]).unwrap();
    assert!(out.status.success(), "join: {}", text(&out.stderr));
    let joined: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(joined["already_enrolled"], false, "{joined}");
    // A fresh token waits in the token file (as after `plexd leave` and a new token).
    let token = cp.issue_token(LAB_NODES_PROJECT).unwrap();
    host.write_token(&token).unwrap();
    let identity: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(host.state_dir().join("identity.json")).unwrap(),
    )
    .unwrap();
    let credential = identity["node_credential"].as_str().unwrap().to_owned();
    let key = std::fs::read_to_string(host.state_dir().join("wireguard.key"))
        .unwrap()
        .trim()
        .to_owned();
    assert!(
        credential.starts_with("pxnk_") && key.len() == 44,
        "{credential} {key}"
    );
    // The secrets also sit in a file plexd reads for the report (a config comment): a report
    // that copied the file as it is would leak them.
    let mut config = std::fs::read_to_string(host.config()).unwrap();
    config.push_str(&format!("# {token} {credential} {key}\n"));
    std::fs::write(host.config(), config).unwrap();

    let report = tmp.path().join("report.tar.gz");
    let out = host
        .plexd(&["bugreport", "--out", report.to_str().unwrap(), "-o", "json"])
        .unwrap();
    println!("--- bugreport:\n{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let entries: Vec<&str> = summary["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str())
        .collect();
    for want in [
        "summary.json",
        "config.yaml",
        "identity.json",
        "status.json",
        "versions.txt",
        "interface.txt",
        "journal.txt",
        "netcheck.json",
    ] {
        assert!(entries.contains(&want), "{want} missing: {entries:?}");
    }

    // The same for people: one summary line naming the file and the entries.
    let report2 = tmp.path().join("report2.tar.gz");
    let out = host
        .plexd(&[
            "bugreport",
            "--out",
            report2.to_str().unwrap(),
            "--no-netcheck",
        ])
        .unwrap();
    let table = text(&out.stdout);
    println!("--- plexd bugreport --no-netcheck:\n{table}");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        table.starts_with(&format!("wrote {} (", report2.display()))
            && table.contains("secrets replaced with <redacted>")
            && !table.contains("netcheck.json"),
        "{table}"
    );

    let unpacked = tmp.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    let tar = Command::new("tar")
        .args([
            "-xzf",
            report.to_str().unwrap(),
            "-C",
            unpacked.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(tar.status.success(), "tar: {}", text(&tar.stderr));
    let listing = Command::new("tar")
        .args(["-tzvf", report.to_str().unwrap()])
        .output()
        .unwrap();
    println!("--- tar -tzvf:\n{}", text(&listing.stdout));
    let raw_key = base64_decode(&key);
    let mut files = 0;
    for entry in walk(&unpacked) {
        let bytes = std::fs::read(&entry).unwrap();
        files += 1;
        for (what, secret) in [
            ("token", token.as_bytes()),
            ("credential", credential.as_bytes()),
            ("private key", key.as_bytes()),
            ("raw private key", raw_key.as_slice()),
        ] {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret),
                "the {what} is in {}",
                entry.display()
            );
        }
        // Nor the secret part of any token or credential. The secret is base64url and may
        // itself hold '_', so it is cut after the fixed fields (`pxbt_<env>_<kind>_<id>_`,
        // `pxnk_<node id>_`), not after the last '_' (a short fragment would match anything).
        for (secret, fields) in [(&token, 5), (&credential, 3)] {
            let tail = secret.splitn(fields, '_').nth(fields - 1).unwrap();
            assert!(tail.len() >= 40, "{secret}: secret part {tail:?}");
            assert!(
                !bytes.windows(tail.len()).any(|w| w == tail.as_bytes()),
                "a secret's tail is in {}",
                entry.display()
            );
        }
    }
    assert_eq!(files, entries.len());
    let identity_out =
        std::fs::read_to_string(unpacked.join("plexd-bugreport/identity.json")).unwrap();
    assert!(
        identity_out.contains(identity["node_id"].as_str().unwrap()),
        "{identity_out}"
    );
    assert_eq!(joined["node_id"], identity["node_id"]);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Standard base64 (the key file's form), decoded by hand: the e2e crate has no base64 crate.
fn base64_decode(s: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c).unwrap() as u32;
        bits = (bits << 6) | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
            bits &= (1 << n) - 1;
        }
    }
    out
}
