//! `plexctl whoami` and `plexctl operator-token list|create|revoke` against a real plexsphere:
//! scope, project, expiry and last use as the server records them; a read-only token is
//! refused what it may not do, with the server's code in the message.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::*;
use serde_json::Value;

fn field<'a>(text: &'a str, label: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{label}:")))
        .map(str::trim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoami_and_operator_token_list_show_scope_project_expiry_and_last_use() {
    let srv = start().await;
    // The test's own token is an admin token for every project with the default expiry.
    let me = srv.plexctl_ok(&["whoami"]).await;
    assert_eq!(field(&me, "scope"), Some("admin"), "{me}");
    assert_eq!(field(&me, "project"), Some("(all)"), "{me}");
    assert!(
        field(&me, "expires at").is_some_and(|e| e.starts_with("20")),
        "{me}"
    );

    // An admin creates a read-only token bound to the lab project.
    let out = srv
        .plexctl_ok(&[
            "operator-token",
            "create",
            "--name",
            "dashboards",
            "--scope",
            "read-only",
            "--project",
            "lab-nodes",
            "--expires-in",
            "30d",
            "-o",
            "json",
        ])
        .await;
    let created: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(created["scope"], "read-only");
    assert_eq!(created["project_id"], LAB_NODES);
    let ro_file = srv.dir.path().join("ro-token");
    std::fs::write(&ro_file, created["token"].as_str().unwrap()).unwrap();

    // whoami with it: its scope, project, expiry; and its last use once used.
    let (code, me, err) = srv.plexctl_as(&ro_file, &["whoami"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(field(&me, "scope"), Some("read-only"), "{me}");
    assert_eq!(field(&me, "project"), Some(LAB_NODES), "{me}");
    assert_eq!(field(&me, "name"), Some("dashboards"), "{me}");
    let id = created["id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let list = srv.plexctl_ok(&["operator-token", "list"]).await;
        let row = list
            .lines()
            .find(|l| l.starts_with(&id))
            .unwrap()
            .to_owned();
        assert!(
            row.contains("read-only") && row.contains(LAB_NODES),
            "{list}"
        );
        if !row.trim_end().ends_with("never") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "last use never recorded: {list}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // The read-only token cannot issue bootstrap tokens nor list operator tokens.
    let (code, _, err) = srv
        .plexctl_as(
            &ro_file,
            &[
                "bootstrap-token",
                "issue",
                "--project",
                LAB_NODES,
                "--env-prefix",
                "lab",
            ],
        )
        .await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("insufficient_scope") && err.contains("HTTP 403"),
        "{err}"
    );
    let (code, _, err) = srv.plexctl_as(&ro_file, &["operator-token", "list"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("insufficient_scope"), "{err}");

    // Revoked, it stops working.
    srv.plexctl_ok(&["operator-token", "revoke", &id]).await;
    let (code, _, err) = srv.plexctl_as(&ro_file, &["whoami"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unauthorized"), "{err}");
    srv.stop().await;
}
