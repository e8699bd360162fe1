//! The audit log end to end: a real `plexsphere dev`, changes made through `plexctl` (and
//! one through the host's `plexsphere operator-token create`), listed with who, how and what;
//! then the database is tampered with directly (`sqlite3`, as a database-only attacker would)
//! and `plexctl audit verify` must name each kind of tampering by its seq: a removed row,
//! two swapped rows, an altered detail, a row inserted with a correct SHA-256 chain link, and
//! a cut tail. Between cases the rows are put back and the chain verifies clean again.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::process::Command;

use plexsphere_e2e::ControlPlane;
use plexsphere_e2e::process::bin;
use serde_json::Value;

const COLUMNS: &str = "at, actor_kind, actor_ref, actor_name, actor_subject, actor_email, how, \
     action, target, detail, prev_hash, hash, mac";

fn sqlite(db: &Path, sql: &str) -> String {
    let out = Command::new("sqlite3")
        .args(["-cmd", ".timeout 10000", "-json"])
        .arg(db)
        .arg(sql)
        .output()
        .expect("sqlite3 runs (scripts/deps.sh installs it)");
    assert!(
        out.status.success(),
        "sqlite3 {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn rows(db: &Path, sql: &str) -> Vec<Value> {
    let text = sqlite(db, sql);
    if text.trim().is_empty() {
        return Vec::new();
    }
    serde_json::from_str(&text).unwrap()
}

/// `plexctl audit verify`: Ok(stdout) when clean, Err(stderr) when it exits non-zero.
fn verify(cp: &ControlPlane, domain: Option<&str>) -> Result<String, String> {
    let mut args = vec!["audit", "verify"];
    if let Some(d) = domain {
        args.extend(["--domain", d]);
    }
    let out = cp.plexctl(&args).unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        assert_eq!(out.status.code(), Some(1), "verify exits 1 on problems");
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn has_line(text: &str, prefix: &str) -> bool {
    text.lines()
        .any(|l| l.trim_start_matches("plexctl: ").starts_with(prefix))
}

/// SHA-256 over the encoding docs/audit.md gives, as an auditor recomputes it.
fn recompute(row: &Value, seq: i64) -> String {
    let s = |k: &str| match &row[k] {
        Value::String(v) => v.clone(),
        Value::Number(n) => n.to_string(),
        other => panic!("{k}: {other}"),
    };
    let mut text = String::from("plexsphere-audit-v1\n");
    for f in [
        s("chain_id"),
        seq.to_string(),
        s("at"),
        s("actor_kind"),
        s("actor_ref"),
        s("actor_name"),
        s("actor_subject"),
        s("actor_email"),
        s("how"),
        s("action"),
        s("target"),
        s("detail"),
        s("prev_hash"),
    ] {
        text.push_str(&format!("{}:{f}\n", f.len()));
    }
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn changes_are_listed_and_each_kind_of_tampering_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev(dir.path()).unwrap();
    let db = dir.path().join("plexsphere.db");

    // A fresh chain verifies clean.
    let clean = verify(&cp, Some("lab")).unwrap();
    assert!(clean.contains("0 rows, all as written"), "{clean}");

    // Changes through plexctl (the dev admin token "dev").
    let mut token_ids = Vec::new();
    for _ in 0..3 {
        let out = cp
            .plexctl_ok(&plexsphere_e2e::control_plane::issue_token_args(
                "lab-nodes",
            ))
            .unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        token_ids.push(v["id"].as_str().unwrap().to_owned());
    }
    cp.plexctl_ok(&["bootstrap-token", "revoke", &token_ids[0]])
        .unwrap();
    cp.plexctl_ok(&["dns", "suffix", "set", "corp.internal", "--domain", "lab"])
        .unwrap();
    cp.plexctl_ok(&["domain", "rotate-key", "lab", "--overlap", "0s"])
        .unwrap();
    cp.plexctl_ok(&[
        "operator-token",
        "create",
        "--name",
        "ci",
        "--scope",
        "read-only",
    ])
    .unwrap();
    cp.plexctl_ok(&[
        "cloud-credential",
        "create",
        "--name",
        "lab",
        "--provider",
        "local",
        "--payload",
        "{\"secret\":\"never-in-the-log\"}",
    ])
    .unwrap();
    // The host's own command.
    let host = Command::new(bin("plexsphere").unwrap())
        .args([
            "operator-token",
            "create",
            "--name",
            "backup",
            "--scope",
            "read-only",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        host.status.success(),
        "{}",
        String::from_utf8_lossy(&host.stderr)
    );

    // The Domain's chain: who, how and what, in order.
    let listed: Vec<Value> = serde_json::from_str(
        &cp.plexctl_ok(&["audit", "list", "--domain", "lab", "--output", "json"])
            .unwrap(),
    )
    .unwrap();
    let actions: Vec<&str> = listed
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "token.issue",
            "token.issue",
            "token.issue",
            "token.revoke",
            "domain.dns-suffix",
            "domain.signing-key-rotate"
        ],
        "{listed:#?}"
    );
    for (i, r) in listed.iter().enumerate() {
        assert_eq!(r["seq"], i as i64 + 1);
        assert_eq!(r["actor"]["kind"], "token");
        assert_eq!(r["actor"]["how"], "token");
        assert_eq!(r["actor"]["name"], "dev");
    }
    assert_eq!(
        listed[3]["target"],
        format!("bootstrap-token/{}", token_ids[0])
    );
    assert_eq!(listed[4]["detail"]["suffix"], "corp.internal");
    // The table shows the same.
    let table = cp
        .plexctl_ok(&["audit", "list", "--domain", "lab"])
        .unwrap();
    assert!(
        table.contains("token.revoke") && table.contains("SEQ"),
        "{table}"
    );
    // --since in the future lists nothing.
    let later = cp
        .plexctl_ok(&[
            "audit",
            "list",
            "--domain",
            "lab",
            "--since",
            "2999-01-01T00:00:00Z",
            "--output",
            "json",
        ])
        .unwrap();
    assert_eq!(later.trim(), "[]");

    // The platform chain: the API's operator token and credential, then the host's token.
    let platform: Vec<Value> = serde_json::from_str(
        &cp.plexctl_ok(&["audit", "list", "--output", "json"])
            .unwrap(),
    )
    .unwrap();
    let who: Vec<(&str, &str)> = platform
        .iter()
        .map(|r| {
            (
                r["action"].as_str().unwrap(),
                r["actor"]["kind"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        who,
        [
            ("operator-token.create", "token"),
            ("cloud-credential.create", "token"),
            ("operator-token.create", "host-cli"),
        ]
    );
    assert!(verify(&cp, None).is_ok());
    // No secret reached the log.
    let dump = sqlite(&db, "SELECT * FROM audit_log");
    assert!(!dump.contains("never-in-the-log"), "{dump}");

    // Tampering, one kind at a time, each on the clean chain.
    assert!(verify(&cp, Some("lab")).is_ok());
    let chain = rows(
        &db,
        "SELECT chain_id FROM audit_chains WHERE chain_id != 'platform'",
    )[0]["chain_id"]
        .as_str()
        .unwrap()
        .to_owned();
    sqlite(
        &db,
        "CREATE TABLE saved_log AS SELECT * FROM audit_log; \
         CREATE TABLE saved_chains AS SELECT * FROM audit_chains;",
    );
    let restore = || {
        sqlite(
            &db,
            "DELETE FROM audit_log; INSERT INTO audit_log SELECT * FROM saved_log; \
             DELETE FROM audit_chains; INSERT INTO audit_chains SELECT * FROM saved_chains;",
        );
        assert!(verify(&cp, Some("lab")).is_ok(), "restored chain verifies");
    };
    let w = format!("chain_id = '{chain}'");

    // A removed row.
    sqlite(&db, &format!("DELETE FROM audit_log WHERE {w} AND seq = 2"));
    let e = verify(&cp, Some("lab")).unwrap_err();
    assert!(has_line(&e, "seq 2: removed"), "{e}");
    restore();

    // Two rows swapped (each keeps its seq, the contents trade places).
    sqlite(
        &db,
        &format!(
            "UPDATE audit_log SET ({COLUMNS}) = (SELECT {COLUMNS} FROM saved_log s \
             WHERE s.chain_id = audit_log.chain_id AND s.seq = 5 - audit_log.seq) \
             WHERE {w} AND seq IN (2, 3)"
        ),
    );
    let e = verify(&cp, Some("lab")).unwrap_err();
    assert!(has_line(&e, "seq 2: reordered"), "{e}");
    assert!(has_line(&e, "seq 3: reordered"), "{e}");
    restore();

    // An altered detail.
    sqlite(
        &db,
        &format!("UPDATE audit_log SET detail = '{{\"suffix\":\"evil\"}}' WHERE {w} AND seq = 5"),
    );
    let e = verify(&cp, Some("lab")).unwrap_err();
    assert!(has_line(&e, "seq 5: altered"), "{e}");
    restore();

    // An inserted row with a correct SHA-256 link, the head moved to it: only the keyed MACs
    // give it away.
    let last = rows(
        &db,
        &format!("SELECT * FROM audit_log WHERE {w} AND seq = 6"),
    )
    .remove(0);
    let mut forged = last.clone();
    forged["prev_hash"] = last["hash"].clone();
    forged["target"] = Value::String("bootstrap-token/forged".into());
    let hash = recompute(&forged, 7);
    assert_eq!(
        recompute(&last, 6),
        last["hash"].as_str().unwrap(),
        "the documented encoding"
    );
    sqlite(
        &db,
        &format!(
            "INSERT INTO audit_log SELECT chain_id, 7, {cols} FROM audit_log WHERE {w} AND seq = 6; \
             UPDATE audit_log SET prev_hash = '{prev}', target = 'bootstrap-token/forged', hash = '{hash}' \
             WHERE {w} AND seq = 7; \
             UPDATE audit_chains SET seq = 7, head_hash = '{hash}' WHERE {w};",
            cols = COLUMNS,
            prev = last["hash"].as_str().unwrap(),
        ),
    );
    let e = verify(&cp, Some("lab")).unwrap_err();
    assert!(has_line(&e, "seq 7: inserted"), "{e}");
    restore();

    // A cut tail.
    sqlite(
        &db,
        &format!("DELETE FROM audit_log WHERE {w} AND seq >= 5"),
    );
    let e = verify(&cp, Some("lab")).unwrap_err();
    assert!(has_line(&e, "seq 5: removed"), "{e}");
    assert!(e.contains("tail"), "{e}");
    restore();

    // The other chain was never touched.
    assert!(verify(&cp, None).is_ok());
}
