//! `plexd netcheck` and `plexd ping` in a reach lab (root): three nodes, behind an
//! endpoint-independent NAT, a symmetric (endpoint-dependent) NAT and a router that drops UDP
//! (tests/src/nat.rs), with the control plane and two relays (four STUN servers) on the
//! public segment. netcheck's verdicts must tell the three apart, with and without the daemon;
//! ping must get replies over the mesh and report the peer's path.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use plexsphere_e2e::nat::{NatMode, NodeSpec, ReachLab};
use plexsphere_e2e::netns;

const BOUND: Duration = Duration::from_secs(60);

fn lab(modes: &[NatMode]) -> ReachLab {
    let mut lab = ReachLab::start(modes, 2).unwrap();
    for r in 0..modes.len() {
        lab.add_node(&NodeSpec {
            router: r,
            backend: "userspace",
        })
        .unwrap();
    }
    for i in 0..modes.len() {
        lab.start_node(i)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.dump()));
    }
    lab
}

/// `plexd <args>` of node `i` in its namespace: (exit code, stdout, stderr).
fn plexd(lab: &ReachLab, i: usize, args: &[&str]) -> (Option<i32>, String, String) {
    let n = &lab.nodes[i];
    let out = netns::plexd(&n.ns, &n.host, args).unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn verdict(report: &serde_json::Value, check: &str) -> String {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == check)
        .map(|c| c["verdict"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

#[test]
fn netcheck_tells_the_nats_apart_and_ping_gets_replies_over_the_mesh() {
    let mut lab = lab(&[NatMode::Eim, NatMode::Edm, NatMode::DropUdp]);

    for (i, mapping, udp) in [
        (0, "endpoint_independent", "ok"),
        (1, "endpoint_dependent", "ok"),
        (2, "unknown", "fail"),
    ] {
        let (code, table, _) = plexd(&lab, i, &["netcheck"]);
        println!("--- node {i} plexd netcheck (exit {code:?}):\n{table}");
        let (code, json, err) = plexd(&lab, i, &["netcheck", "--output", "json"]);
        let v: serde_json::Value =
            serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}{err}"));
        assert_eq!(v["nat_mapping"], mapping, "node {i}: {json}");
        assert_eq!(verdict(&v, "udp"), udp, "node {i}: {json}");
        assert_eq!(verdict(&v, "tcp"), "ok", "node {i}: {json}");
        assert_eq!(verdict(&v, "tls"), "ok", "node {i}: {json}");
        assert_eq!(
            v["stun_source"], "the node's cached state",
            "node {i}: {json}"
        );
        // dev's STUN responder, its embedded relay and the two relays: four addresses.
        let servers = v["stun"].as_array().unwrap().len();
        assert!(servers >= 3, "node {i}: {json}");
        if udp == "fail" {
            assert_eq!(code, Some(1), "node {i}: {err}");
            assert_eq!(v["udp_blocked"], true);
            let blocked = format!("UDP blocked: none of {servers} STUN servers answered");
            assert!(table.contains(&blocked), "{table}");
        } else {
            assert_eq!(code, Some(0), "node {i}: {err}");
            assert!(
                v["reflexive_address"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("203.0.113.10"),
                "{json}"
            );
        }
    }

    // ping, from the EIM node to the symmetric one and back (their path is a relay), by mesh
    // IP and by node id prefix.
    let ip1 = lab.mesh_ip(1).unwrap().to_string();
    let id0 = lab.nodes[0].host.identity().unwrap().0;
    lab.wait_ping(0, 1, BOUND).unwrap();
    let (code, out, err) = plexd(&lab, 0, &["ping", &ip1, "-c", "3", "-i", "200ms"]);
    println!("--- node 0 plexd ping {ip1}:\n{out}{err}");
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(&format!("reply from {ip1}: seq=")), "{out}");
    let (code, json, err) = plexd(&lab, 1, &["ping", &id0[..13], "-c", "2", "-o", "json"]);
    println!("--- node 1 plexd ping {} -o json:\n{json}{err}", &id0[..13]);
    assert_eq!(code, Some(0), "{json}{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["node_id"], id0.as_str());
    assert!(v["received"].as_u64().unwrap() >= 1, "{json}");
    assert!(v["path"]["kind"].is_string(), "{json}");
    // A peer nobody has.
    let (code, _, err) = plexd(&lab, 0, &["ping", "10.99.99.99", "-c", "1"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("no peer has mesh IP 10.99.99.99"), "{err}");

    // A bugreport of a running node has the daemon's view of its peers, and not its key.
    let report = lab.dir.path().join("node0-report.tar.gz");
    let (code, out, err) = plexd(&lab, 0, &["bugreport", "--out", report.to_str().unwrap()]);
    println!("--- node 0 plexd bugreport:\n{out}{err}");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("peers.txt") && out.contains("netcheck.json"),
        "{out}"
    );
    let listing = std::process::Command::new("tar")
        .args(["-tzvf", report.to_str().unwrap()])
        .output()
        .unwrap();
    println!(
        "--- tar -tzvf:\n{}",
        String::from_utf8_lossy(&listing.stdout)
    );
    let peers = std::process::Command::new("tar")
        .args([
            "-xzOf",
            report.to_str().unwrap(),
            "plexd-bugreport/peers.txt",
        ])
        .output()
        .unwrap();
    let peers = String::from_utf8_lossy(&peers.stdout).into_owned();
    println!("--- peers.txt:\n{peers}");
    assert!(peers.contains(&format!("allowed ips: {ip1}")), "{peers}");
    let key_file = lab.nodes[0].host.state_dir().join("wireguard.key");
    let key = std::fs::read_to_string(key_file).unwrap();
    assert!(!peers.contains(key.trim()));

    // Without the daemon: netcheck still runs (from the cached state), ping says why not.
    lab.nodes[1].proc.take();
    let (code, json, err) = plexd(&lab, 1, &["netcheck", "-o", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["nat_mapping"], "endpoint_dependent", "{json}");
    let (code, json, _) = plexd(&lab, 1, &["ping", &id0, "-o", "json"]);
    assert_eq!(code, Some(3));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["error"], "not_running");
    // And the node that lost its peer: ping gets no reply and exits 1.
    let (code, out, err) = plexd(
        &lab,
        0,
        &["ping", &ip1, "-c", "2", "-i", "200ms", "-W", "500ms"],
    );
    println!("--- node 0 plexd ping {ip1} with node 1 down:\n{out}{err}");
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("2 sent, 0 received, 100% loss"), "{out}");
}
