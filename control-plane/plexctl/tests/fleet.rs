//! plexctl's autoscaling and naming features against a real plexsphere: a reusable ephemeral
//! token (issue, list with uses and the nodes made), nodes by name (list, get, ambiguous and
//! unknown names), projects by slug, and the hint for `http://` on the TLS port.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::*;
use serde_json::{Value, json};

fn field<'a>(text: &'a str, label: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{label}:")))
        .map(str::trim)
}

/// Registers a node with `token` as `hostname`, optionally with a resource handle.
async fn register(srv: &Server, token: &str, n: u8, hostname: &str, handle: Option<&str>) -> Value {
    let mut secret = [9u8; 32];
    secret[1] = n; // not byte 0: X25519 clears its low 3 bits
    let mut body = json!({
        "bootstrap_token": token,
        "hostname": hostname,
        "arch": "amd64",
        "plexd_version": "0.1.0",
    });
    if let Some(h) = handle {
        body["resource_handle"] = h.into();
    }
    let body = srv.proved(body, secret).await;
    let r = srv
        .client
        .post(format!("{}/v1/register", srv.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, reqwest::StatusCode::CREATED, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reusable_ephemeral_token_and_nodes_by_name() {
    let srv = start().await;
    // By slug, with three uses, ephemeral after 10 minutes offline.
    let out = srv
        .plexctl_ok(&[
            "bootstrap-token",
            "issue",
            "--project",
            "lab-nodes",
            "--env-prefix",
            "asg",
            "--uses",
            "3",
            "--ephemeral",
            "--ephemeral-offline",
            "10m",
        ])
        .await;
    let token = out.lines().next().unwrap().to_owned();
    assert!(token.starts_with("pxbt_asg_node_"), "{out}");
    assert_eq!(field(&out, "uses"), Some("up to 3 nodes"), "{out}");
    assert_eq!(
        field(&out, "ephemeral"),
        Some("yes: its nodes are removed after 10m offline"),
        "{out}"
    );
    let a = register(&srv, &token, 1, "ip-10-0-0-1", Some("web-1")).await;
    let b = register(&srv, &token, 2, "web-2", None).await;

    let list = srv
        .plexctl_ok(&["bootstrap-token", "list", "--project", "lab-nodes"])
        .await;
    let header = list.lines().next().unwrap();
    assert!(
        header.starts_with("ID") && header.contains("USES") && header.contains("EPHEMERAL"),
        "{list}"
    );
    let row = list.lines().find(|l| l.contains("asg")).unwrap();
    assert!(
        row.contains(" active ") && row.contains(" 2/3 ") && row.contains(" 10m "),
        "{list}"
    );
    assert!(row.contains(a["node_id"].as_str().unwrap()), "{list}");
    assert!(row.contains(b["node_id"].as_str().unwrap()), "{list}");

    // node list: the NAME column is the handle, else the hostname; ephemeral is flagged.
    let nodes = srv
        .plexctl_ok(&["node", "list", "--project", "lab-nodes"])
        .await;
    assert!(nodes.lines().next().unwrap().starts_with("ID  "), "{nodes}");
    let line_a = nodes
        .lines()
        .find(|l| l.contains(a["node_id"].as_str().unwrap()))
        .unwrap();
    let cols: Vec<&str> = line_a.split_whitespace().collect();
    assert_eq!(&cols[1..3], ["web-1", "ip-10-0-0-1"], "{nodes}");
    assert!(cols[4].ends_with("+ephemeral"), "{nodes}");

    // node get by name, with the same answer as by id.
    let by_name = srv.plexctl_ok(&["node", "get", "web-1"]).await;
    assert_eq!(field(&by_name, "id"), a["node_id"].as_str(), "{by_name}");
    assert_eq!(field(&by_name, "name"), Some("web-1"));
    assert_eq!(
        field(&by_name, "ephemeral"),
        Some("removed after 10m offline")
    );
    let by_id = srv
        .plexctl_ok(&["node", "get", a["node_id"].as_str().unwrap()])
        .await;
    assert_eq!(by_name, by_id);

    // A third node takes the last use with a host name that is already a name: it is named
    // uniquely (names are unique among the live nodes of a Domain), so nothing is ambiguous.
    let c = register(&srv, &token, 3, "web-2", None).await;
    let by_name = srv.plexctl_ok(&["node", "get", "web-2-2"]).await;
    assert_eq!(field(&by_name, "id"), c["node_id"].as_str(), "{by_name}");
    let by_name = srv.plexctl_ok(&["node", "get", "web-2"]).await;
    assert_eq!(field(&by_name, "id"), b["node_id"].as_str(), "{by_name}");
    let (code, _, err) = srv.plexctl(&["node", "rotate-key", "web-9"]).await;
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        err.trim_end(),
        "plexctl: no node is named `web-9` (names that start the same: web-1, web-2, web-2-2); see `plexctl node list`"
    );
    // The token is used up now.
    let list = srv
        .plexctl_ok(&["bootstrap-token", "list", "--project", "lab-nodes"])
        .await;
    let row = list.lines().find(|l| l.contains("asg")).unwrap();
    assert!(
        row.contains(" consumed ") && row.contains(" 3/3 "),
        "{list}"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_on_the_tls_port_says_to_use_https() {
    let srv = start().await;
    let http = srv.base.replacen("https://", "http://", 1);
    let token_file = srv.dir.path().join("operator-token");
    let out = tokio::process::Command::new(PLEXCTL)
        .args(["node", "list", "--server", &http, "--token-file"])
        .arg(&token_file)
        .env_clear()
        .env("HOME", srv.dir.path())
        .output()
        .await
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        err.trim_end(),
        format!(
            "plexctl: the server at {http} speaks HTTPS, not plain HTTP; use {} as the server URL",
            srv.base
        )
    );
    // The same server over https answers (the hint is not a guess about every failure).
    srv.plexctl_ok(&["node", "list"]).await;
    srv.stop().await;
}
