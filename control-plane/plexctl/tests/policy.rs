//! `plexctl policy ...`, `node tag|untag` and `bootstrap-token issue --tag` against a real
//! plexsphere, and `policy test` offline (no server at all).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::*;
use serde_json::Value;

const WEB_TO_DB: &str = "\
rules:
  - name: web-to-db
    src: tag:web
    dst: tag:db
    proto: tcp
    ports: 5432
tests:
  - {src: tag:web, dst: tag:db, port: 5432, proto: tcp, expect: accept}
";

/// plexctl with no server, no token, no config: only what needs none works.
async fn plexctl_alone(home: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(PLEXCTL)
        .args(args)
        .env_clear()
        .env("HOME", home)
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_test_offline_prints_file_line_column_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, WEB_TO_DB).unwrap();
    let good = good.to_str().unwrap();
    let (code, out, err) = plexctl_alone(dir.path(), &["policy", "test", good]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("{good}: ok: 1 rule, 1 test passed (offline")),
        "{out}"
    );

    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "rules:\n  - {src: tag:web, dst: tag:db, proto: tcp, ports: 70000}\n",
    )
    .unwrap();
    let bad = bad.to_str().unwrap();
    let (code, out, err) = plexctl_alone(dir.path(), &["policy", "test", bad]).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains(&format!("\n{bad}:2:")), "{err}");

    let failing = dir.path().join("failing.yaml");
    std::fs::write(
        &failing,
        WEB_TO_DB.replace("expect: accept", "expect: deny"),
    )
    .unwrap();
    let failing = failing.to_str().unwrap();
    let (code, _, err) = plexctl_alone(dir.path(), &["policy", "test", failing]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&format!("\n{failing}:8:")), "{err}");
    assert!(err.contains("failed"), "{err}");

    let (code, _, err) = plexctl_alone(dir.path(), &["policy", "test", "/nonexistent.yaml"]).await;
    assert_eq!(code, 64, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_set_explain_history_and_rollback_through_plexctl() {
    let srv = start().await;
    let (web, db) = (srv.enrol(1).await, srv.enrol(2).await);
    assert_eq!(
        srv.plexctl_ok(&["policy", "get"]).await,
        plexsphere_policy::DEFAULT_DOCUMENT
    );

    // Tags: add, shown in node get and node list; remove.
    let out = srv
        .plexctl_ok(&["node", "tag", "node-1", "web", "tag:edge"])
        .await;
    assert!(
        out.contains("\ntags:") && out.contains("tag:edge,tag:web"),
        "{out}"
    );
    srv.plexctl_ok(&["node", "tag", &db.node_id.to_string(), "db"])
        .await;
    let list = srv.plexctl_ok(&["node", "list"]).await;
    assert!(
        list.lines().next().unwrap().trim_end().ends_with("TAGS"),
        "{list}"
    );
    assert!(
        list.lines()
            .any(|l| l.starts_with(&web.node_id.to_string()) && l.ends_with("tag:edge,tag:web")),
        "{list}"
    );
    let out = srv
        .plexctl_ok(&["node", "untag", "node-1", "edge", "-o", "json"])
        .await;
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tags"], serde_json::json!(["web"]));

    // A document the server refuses: the file's line and column, exit 1, nothing changed.
    let file = srv.dir.path().join("policy.yaml");
    let path = file.to_str().unwrap();
    std::fs::write(&file, "rules:\n  - {src: project:nope, dst: '*'}\n").unwrap();
    let (code, _, err) = srv.plexctl(&["policy", "test", path]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&format!("\n{path}:2:")), "{err}");
    let (code, _, err) = srv.plexctl(&["policy", "set", path, "--yes"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&format!("\n{path}:2:")), "{err}");

    // set without --yes: the diff, and how to apply it; nothing stored.
    std::fs::write(&file, WEB_TO_DB).unwrap();
    let ok = srv.plexctl_ok(&["policy", "test", path]).await;
    assert!(ok.contains("ok: valid for Domain lab"), "{ok}");
    let dry = srv.plexctl_ok(&["policy", "set", path]).await;
    assert!(
        dry.starts_with("dry run: nothing was changed; version 1 stays in force"),
        "{dry}"
    );
    assert!(dry.contains("node-2 -> node-1"), "{dry}");
    assert!(
        dry.trim_end().ends_with("re-run with --yes to apply it"),
        "{dry}"
    );
    let explicit = srv.plexctl_ok(&["policy", "set", path, "--dry-run"]).await;
    assert!(!explicit.contains("--yes"), "{explicit}");
    assert_eq!(
        srv.plexctl_ok(&["policy", "get"]).await,
        plexsphere_policy::DEFAULT_DOCUMENT
    );
    let applied = srv.plexctl_ok(&["policy", "set", path, "--yes"]).await;
    assert!(
        applied.starts_with("applied: policy version 2 is in force (was 1)"),
        "{applied}"
    );
    assert_eq!(srv.plexctl_ok(&["policy", "get"]).await, WEB_TO_DB);
    let json: Value =
        serde_json::from_str(&srv.plexctl_ok(&["policy", "get", "-o", "json"]).await).unwrap();
    assert_eq!(json["version"], 2);

    // explain by name, with and without a port.
    let e = srv
        .plexctl_ok(&["policy", "explain", "node-1", "node-2", "5432/tcp"])
        .await;
    assert!(
        e.starts_with("node-1 -> node-2 tcp/5432: allowed by line 2 (web-to-db)"),
        "{e}"
    );
    let e = srv
        .plexctl_ok(&["policy", "explain", "node-2", "node-1", "22/tcp"])
        .await;
    assert!(e.contains("no rule allows it"), "{e}");
    let (code, _, err) = srv
        .plexctl(&["policy", "explain", "node-1", "nobody"])
        .await;
    assert_eq!(code, 1, "{err}");

    // history and rollback (only with --yes).
    let h = srv.plexctl_ok(&["policy", "history"]).await;
    let rows: Vec<&str> = h.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{h}");
    assert!(
        rows[0].starts_with("2 ") && rows[0].contains("test ("),
        "{h}"
    );
    assert!(
        rows[1].starts_with("1 ") && rows[1].contains("plexsphere"),
        "{h}"
    );
    let dry = srv.plexctl_ok(&["policy", "rollback", "1"]).await;
    assert!(
        dry.starts_with("dry run:") && dry.contains("--yes"),
        "{dry}"
    );
    let done = srv.plexctl_ok(&["policy", "rollback", "1", "--yes"]).await;
    assert!(
        done.starts_with("applied: policy version 3 is in force (was 2)"),
        "{done}"
    );
    assert_eq!(
        srv.plexctl_ok(&["policy", "get"]).await,
        plexsphere_policy::DEFAULT_DOCUMENT
    );

    // A tagged bootstrap token.
    let out = srv
        .plexctl_ok(&[
            "bootstrap-token",
            "issue",
            "--project",
            "lab-nodes",
            "--env-prefix",
            "lab",
            "--tag",
            "ci",
            "--tag",
            "tag:runner",
        ])
        .await;
    assert!(out.contains("\ntags:        tag:ci,tag:runner\n"), "{out}");
    let list = srv
        .plexctl_ok(&["bootstrap-token", "list", "--project", "lab-nodes"])
        .await;
    assert!(list.contains("tag:ci,tag:runner"), "{list}");
    let (code, _, err) = srv
        .plexctl(&[
            "bootstrap-token",
            "issue",
            "--project",
            "lab-nodes",
            "--env-prefix",
            "lab",
            "--tag",
            "a b",
        ])
        .await;
    assert_eq!(code, 64, "{err}");
    srv.stop().await;
}
