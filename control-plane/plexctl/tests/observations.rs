//! `plexctl node observations` against a real plexsphere: the server's router, store (a SQLite
//! file) and TLS (its dev CA) in this process on 127.0.0.1:0; the plexctl binary in a child
//! process; a node registered and its ingest batch sent over HTTPS as plexd would. Also
//! `plexctl node get`, which shows the node's last heartbeat and its dropped-observation count,
//! and its candidates by kind, home relay and NAT from its last endpoint report.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::*;
use serde_json::{Value, json};
fn columns(line: &str) -> Vec<&str> {
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_observations_prints_a_table_and_json() {
    let srv = start().await;
    let a = srv.enrol(1).await;
    let b = srv.enrol(2).await;
    let (a_id, b_id) = (a.node_id.to_string(), b.node_id.to_string());
    srv.node_post(
        &a,
        "ingest",
        json!({"batch_id": "5f0c7a4e-2b1d-4c3e-9a8b-7d6e5f4a3b2c", "dropped": 7, "observations": [
            {"at": 1796032800, "type": "handshake", "peer_node_id": b.node_id, "endpoint": "192.0.2.7:51820"},
            {"at": 1796032801, "type": "traffic", "peer_node_id": b.node_id, "rx_bytes": 2048, "tx_bytes": 10},
            {"at": 1796032802, "type": "error", "message": "\u{1b}[2Jboom\nfake"},
        ]}),
        reqwest::StatusCode::ACCEPTED,
    )
    .await;

    let table = srv.plexctl_ok(&["node", "observations", &a_id]).await;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 5, "{table}");
    assert_eq!(columns(lines[0]), ["TIME", "KIND", "PEER", "DETAIL"]);
    assert_eq!(
        columns(lines[1]),
        [
            "2026-11-30T10:00:02Z",
            "error",
            "-",
            "\\u{1b}[2Jboom\\nfake"
        ]
    );
    assert_eq!(
        columns(lines[2]),
        [
            "2026-11-30T10:00:01Z",
            "traffic",
            b_id.as_str(),
            "rx 2.0 KiB tx 10 B"
        ]
    );
    assert_eq!(
        columns(lines[3]),
        [
            "2026-11-30T10:00:00Z",
            "handshake",
            b_id.as_str(),
            "endpoint 192.0.2.7:51820"
        ]
    );
    assert_eq!(lines[4], "dropped by the node before sending: 7");
    assert!(!table.contains('\u{1b}'), "{table:?}");

    let filtered = srv
        .plexctl_ok(&[
            "node",
            "observations",
            &a_id,
            "--kind",
            "handshake",
            "--limit",
            "5",
        ])
        .await;
    assert_eq!(filtered.lines().count(), 3, "{filtered}");
    assert!(
        filtered.lines().nth(1).unwrap().contains("handshake"),
        "{filtered}"
    );

    let json: Value = serde_json::from_str(
        &srv.plexctl_ok(&[
            "node",
            "observations",
            &a_id,
            "--output",
            "json",
            "--limit",
            "2",
        ])
        .await,
    )
    .unwrap();
    assert_eq!(json["node_id"], a_id.as_str());
    assert_eq!(json["dropped"], 7);
    let items = json["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["type"], "error");
    assert_eq!(items[0]["message"], "\u{1b}[2Jboom\nfake");
    assert_eq!(items[1]["type"], "traffic");
    assert_eq!(items[1]["peer_node_id"], b_id.as_str());
    assert_eq!(items[1]["rx_bytes"], 2048);

    // An unknown node: the server's 404 (exit 1); a bad limit: usage (exit 64).
    let unknown = "019a0816-0000-7000-8000-0000000000ff";
    let (code, stdout, stderr) = srv.plexctl(&["node", "observations", unknown]).await;
    assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
    assert!(
        stderr.contains(unknown) && stderr.contains("not_found"),
        "{stderr}"
    );
    // Not an id, so a name: no node has it (exit 1, naming it).
    let (code, _, stderr) = srv.plexctl(&["node", "observations", "nope"]).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no node is named `nope`"), "{stderr}");
    let (code, _, stderr) = srv
        .plexctl(&["node", "observations", &a_id, "--limit", "501"])
        .await;
    assert_eq!(code, 64, "{stderr}");
    srv.stop().await;
}

/// The value of a `label:  value` line of `node get`.
fn field<'a>(text: &'a str, label: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(label)?.strip_prefix(':'))
        .map(str::trim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_get_shows_the_last_heartbeat_and_dropped_observations() {
    let srv = start().await;
    let a = srv.enrol(3).await;
    let id = a.node_id.to_string();

    let before = srv.plexctl_ok(&["node", "get", &id]).await;
    for label in ["last heartbeat", "uptime", "state applied", "peers"] {
        assert_eq!(field(&before, label), Some("-"), "{label}: {before}");
    }
    assert_eq!(field(&before, "observations dropped"), None, "{before}");

    srv.node_post(
        &a,
        "heartbeat",
        json!({"uptime_secs": 3723, "plexd_version": "0.3.0", "state_version": 1,
               "peers": {"configured": 3, "connected": 2}}),
        reqwest::StatusCode::OK,
    )
    .await;
    srv.node_post(
        &a,
        "ingest",
        json!({"batch_id": "6a1d8b5f-3c2e-4d4f-8b9c-8e7f6a5b4c3d", "dropped": 9, "observations": []}),
        reqwest::StatusCode::ACCEPTED,
    )
    .await;

    let after = srv.plexctl_ok(&["node", "get", &id]).await;
    let at = field(&after, "last heartbeat").unwrap();
    time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).unwrap();
    assert_eq!(field(&after, "uptime"), Some("1h 2m 3s"), "{after}");
    assert_eq!(field(&after, "state applied"), Some("1"), "{after}");
    assert_eq!(field(&after, "peers"), Some("2 of 3 connected"), "{after}");
    assert_eq!(field(&after, "observations dropped"), Some("9"), "{after}");
    assert_eq!(field(&after, "version"), Some("0.3.0"), "{after}");

    let json: Value =
        serde_json::from_str(&srv.plexctl_ok(&["node", "get", &id, "-o", "json"]).await).unwrap();
    assert_eq!(json["last_heartbeat_at"], at);
    assert_eq!(json["uptime_secs"], 3723);
    assert_eq!(json["applied_state_version"], 1);
    assert_eq!(json["peers_configured"], 3);
    assert_eq!(json["peers_connected"], 2);
    assert_eq!(json["observations_dropped"], 9);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_get_shows_candidates_by_kind_home_relay_and_nat() {
    let srv = start().await;
    let a = srv.enrol(4).await;
    let id = a.node_id.to_string();
    let before = srv.plexctl_ok(&["node", "get", &id]).await;
    for label in ["local", "reflexive", "observed", "home relay", "nat"] {
        assert_eq!(field(&before, label), Some("-"), "{label}: {before}");
    }

    srv.node_post(
        &a,
        "endpoints",
        json!({"listen_port": 51820, "addresses": ["192.168.7.2", "2001:db8::7"],
               "reflexive": ["198.51.100.7:40001"], "home_relay": "r1",
               "nat": {"mapping": "endpoint_dependent", "udp_blocked": false}}),
        reqwest::StatusCode::OK,
    )
    .await;
    let after = srv.plexctl_ok(&["node", "get", &id]).await;
    assert_eq!(
        field(&after, "local"),
        Some("192.168.7.2:51820, [2001:db8::7]:51820"),
        "{after}"
    );
    assert_eq!(
        field(&after, "reflexive"),
        Some("198.51.100.7:40001"),
        "{after}"
    );
    // The report came over loopback: not a candidate peers could use.
    assert_eq!(field(&after, "observed"), Some("-"), "{after}");
    assert_eq!(field(&after, "home relay"), Some("r1"), "{after}");
    assert_eq!(
        field(&after, "nat"),
        Some("endpoint-dependent mapping (peers behind NAT reach it through a relay)"),
        "{after}"
    );

    let json: Value =
        serde_json::from_str(&srv.plexctl_ok(&["node", "get", &id, "-o", "json"]).await).unwrap();
    assert_eq!(
        json["candidates"],
        json!([
            {"kind": "local", "address": "192.168.7.2:51820"},
            {"kind": "local", "address": "[2001:db8::7]:51820"},
            {"kind": "reflexive", "address": "198.51.100.7:40001"},
        ])
    );
    assert_eq!(json["home_relay"], "r1");
    assert_eq!(
        json["nat"],
        json!({"mapping": "endpoint_dependent", "udp_blocked": false})
    );
    srv.stop().await;
}
