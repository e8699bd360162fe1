//! The GSO path probe end to end (root): the real control plane on the host and two plexd
//! nodes (embedded userspace data plane) in network namespaces. After their first handshake
//! each node probes the other: 8 echo requests near the MTU through the tunnel as one UDP GSO
//! send, and the same one by one.
//!
//! - The path to node B loses segmented datagrams (an nftables rule in B's namespace drops UDP
//!   longer than 1600 bytes as it comes in; only a GSO send makes one on these 1500-byte
//!   links, and the veth hands it over whole): node A says `segmented_lost` for B in `plexd
//!   status`, and the control plane holds A's `error` observation naming the fix
//!   (`plexctl node set NODE --udp-offload off`).
//! - A clean path: `ok`, and no such observation; `plexd status --probe-gso` runs one more
//!   round at once and answers when it is done.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use plexsphere_e2e::netns::{self, Lab};
use plexsphere_e2e::{ControlPlane, Host, Proc, wait_until};

const BOUND: Duration = Duration::from_secs(45);

fn config_extra(iface: &str) -> String {
    format!(
        "wireguard:\n  backend: userspace\n  interface: {iface}\ndaemon:\n  backoff_initial_ms: 200\n  backoff_cap_secs: 2\n  intervals:\n    heartbeat_secs: 1\n    endpoint_report_secs: 5\n    state_poll_secs: 5\n    ingest_secs: 1\n"
    )
}

/// A node namespace with its host files; `before` runs in the namespace before plexd starts.
fn node(
    lab: &mut Lab,
    cp: &ControlPlane,
    root: &std::path::Path,
    before: impl FnOnce(&str),
) -> (String, Host, Proc) {
    let (ns, host, _) = netns::prepare_node(lab, cp, root, "node", config_extra).unwrap();
    before(&ns);
    let proc = netns::start_daemon(&ns, &host).unwrap();
    (ns, host, proc)
}

/// Drops UDP above 1600 bytes coming into `ns`, silently (the sender gets no error).
fn drop_large_udp(ns: &str) {
    let rules = "table inet gsprobe {\n chain pre {\n  type filter hook prerouting priority -300;\n  meta l4proto udp meta length > 1600 counter drop\n }\n}\n";
    let path = std::env::temp_dir().join(format!("gs-gso-probe-{}.nft", std::process::id()));
    std::fs::write(&path, rules).unwrap();
    let out = netns::exec(ns, "nft", &["-f", path.to_str().unwrap()]).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "nft (apt-get install nftables): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Pings `peer`'s mesh IP from `ns` until one answers: the first handshake, which starts the
/// first probe round.
fn first_handshake(ns: &str, peer: &Host, out: &dyn Fn() -> String) {
    wait_until(BOUND, "a ping through the mesh is answered", || {
        let Ok((_, ip)) = peer.identity() else {
            return Ok(None);
        };
        let ping = netns::exec(ns, "ping", &["-n", "-c", "1", "-W", "1", &ip])?;
        Ok(ping.status.success().then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", out()));
}

/// Waits until `host`'s status holds a probe result for its peer; answers it.
fn probe_result(host: &Host, out: &dyn Fn() -> String) -> serde_json::Value {
    wait_until(BOUND, "plexd status shows a GSO probe result", || {
        Ok(host.status()?.and_then(|s| {
            s["gso_probe"]["peers"]
                .as_array()
                .and_then(|p| p.first().cloned())
        }))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n--- status: {:?}\n--- plexd:\n{}",
            host.status(),
            out()
        )
    })
}

/// The `error` observations of `node_id` that come from the GSO probe.
fn probe_observations(cp: &ControlPlane, node_id: &str) -> Vec<String> {
    let json = cp
        .plexctl_ok(&[
            "node",
            "observations",
            node_id,
            "--kind",
            "error",
            "--output",
            "json",
        ])
        .unwrap();
    let list: serde_json::Value = serde_json::from_str(&json).unwrap();
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o["message"].as_str())
        .filter(|m| m.starts_with("GSO probe"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_path_that_loses_segmented_datagrams_is_reported_in_status_and_to_the_control_plane() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lab = Lab::new().unwrap();
    let cp = netns::start_control_plane(&tmp.path().join("cp"), lab.host_addr(), &[]).unwrap();
    let (ns, host, proc) = node(&mut lab, &cp, tmp.path(), |_| {});
    let (_, peer, peer_proc) = node(&mut lab, &cp, tmp.path(), drop_large_udp);
    let out = || format!("{}\n--- the peer:\n{}", proc.output(), peer_proc.output());
    first_handshake(&ns, &peer, &out);

    let result = probe_result(&host, &out);
    assert_eq!(result["verdict"], "segmented_lost", "{result}\n{}", out());
    assert_eq!(result["segmented_replies"], 0, "{result}");
    assert_eq!(result["single_replies"], 8, "{result}");
    let (peer_id, peer_ip) = peer.identity().unwrap();
    assert_eq!(result["mesh_ip"], peer_ip.as_str(), "{result} {peer_id}");
    let text = host.plexd(&["status"]).unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!(
            "({peer_ip}): segmented_lost, 0/8 segmented and 8/8 single"
        )),
        "{text}"
    );
    assert!(
        proc.output().contains("--udp-offload off"),
        "the warning says what to do:\n{}",
        proc.output()
    );

    let (node_id, _) = host.identity().unwrap();
    let seen = wait_until(
        BOUND,
        "the control plane holds the lost-path observation",
        || {
            let found = probe_observations(&cp, &node_id);
            Ok((!found.is_empty()).then_some(found))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", out()));
    assert!(
        seen[0].contains(&format!("plexctl node set {node_id} --udp-offload off")),
        "{seen:?}"
    );
    assert!(seen[0].contains(&peer_ip), "{seen:?}");
}

#[test]
fn a_clean_path_probes_ok_and_reports_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lab = Lab::new().unwrap();
    let cp = netns::start_control_plane(&tmp.path().join("cp"), lab.host_addr(), &[]).unwrap();
    let (ns, host, proc) = node(&mut lab, &cp, tmp.path(), |_| {});
    let (_, peer, peer_proc) = node(&mut lab, &cp, tmp.path(), |_| {});
    let out = || format!("{}\n--- the peer:\n{}", proc.output(), peer_proc.output());
    first_handshake(&ns, &peer, &out);

    for h in [&host, &peer] {
        let result = probe_result(h, &out);
        assert_eq!(result["verdict"], "ok", "{result}\n{}", out());
        assert_eq!(result["segmented_replies"], 8, "{result}");
    }
    // `plexd status --probe-gso` runs a round now (the next would come in 30 minutes) and
    // answers the status once it is done.
    let before = host.status().unwrap().unwrap()["gso_probe"]["rounds"]
        .as_u64()
        .unwrap();
    let now = host
        .plexd(&["status", "--probe-gso", "--output", "json"])
        .unwrap();
    assert!(
        now.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&now.stderr),
        out()
    );
    let now: serde_json::Value = serde_json::from_slice(&now.stdout).unwrap();
    let probe = &now["gso_probe"];
    assert_eq!(probe["rounds"].as_u64(), Some(before + 1), "{probe}");
    assert!(
        probe["last_round_age_secs"]
            .as_u64()
            .is_some_and(|a| a <= 2),
        "the round just ran: {probe}"
    );
    assert_eq!(probe["peers"][0]["verdict"], "ok", "{probe}");
    // The heartbeat and ingest run every second: a report would be there by now.
    let (node_id, _) = host.identity().unwrap();
    wait_until(BOUND, "the node's handshake observation arrived", || {
        let json = cp.plexctl_ok(&["node", "observations", &node_id, "--output", "json"])?;
        let list: serde_json::Value = serde_json::from_str(&json)?;
        Ok(list["items"]
            .as_array()
            .is_some_and(|i| i.iter().any(|o| o["type"] == "handshake"))
            .then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", out()));
    assert_eq!(probe_observations(&cp, &node_id), Vec::<String>::new());
    assert!(!proc.output().contains("GSO probe:"), "{}", proc.output());
}
