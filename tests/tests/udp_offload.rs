//! The operator's UDP GSO/GRO switch end to end (root): the real control plane on the host and
//! one plexd node (embedded userspace data plane) in a network namespace. `plexctl node set
//! NODE --udp-offload off` puts `udp_offload: off` into the node's signed state; the node pulls
//! it after the `resync` event and switches its WireGuard socket live: `plexd status` reports
//! GSO off and `UDP_GRO` off as the socket reads it back from the kernel, with no restart (the
//! daemon's pid is the same). `default` turns both back on.
//!
//! And what the kernel sees: an nftables counter in the node's namespace counts UDP packets
//! longer than the link MTU leaving it. Only a GSO send makes one (the netfilter output hook
//! sees the super-datagram before the device segments it), so bulk TCP through the mesh to a
//! second node moves the counter with offload on and leaves it where it was with offload off.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use plexsphere_e2e::netns::{self, Lab};
use plexsphere_e2e::{ControlPlane, Host, Proc, wait_until};

const BOUND: Duration = Duration::from_secs(60);

fn config_extra(iface: &str) -> String {
    // A slow state poll (60 s): the switch must arrive through the resync event, not a poll.
    format!(
        "wireguard:\n  backend: userspace\n  interface: {iface}\ndaemon:\n  backoff_initial_ms: 200\n  backoff_cap_secs: 2\n  intervals:\n    heartbeat_secs: 1\n    endpoint_report_secs: 5\n    state_poll_secs: 60\n    ingest_secs: 1\n"
    )
}

/// Waits until `plexd status` shows `setting` with the socket's GSO and GRO both `on`.
fn wait_offload(
    host: &Host,
    setting: &str,
    on: bool,
    out: &dyn Fn() -> String,
) -> serde_json::Value {
    wait_until(
        BOUND,
        &format!("plexd status shows udp offload {setting}"),
        || {
            Ok(host.status()?.filter(|s| {
                let u = &s["udp_offload"];
                u["setting"] == setting && u["gso"] == on && u["gro"] == on && u["applied"] == true
            }))
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n--- status: {:?}\n--- plexd output:\n{}",
            host.status(),
            out()
        )
    })
}

/// UDP packets above this many bytes leave a node only as GSO super-datagrams (the lab's
/// links have an MTU of 1500).
const ABOVE_MTU: u32 = 1600;

fn node(lab: &mut Lab, cp: &ControlPlane, root: &std::path::Path) -> (String, Host, Proc) {
    let (ns, host, _) = netns::prepare_node(lab, cp, root, "node", config_extra).unwrap();
    let proc = netns::start_daemon(&ns, &host).unwrap();
    (ns, host, proc)
}

/// An nftables table in `ns` that counts UDP packets above [`ABOVE_MTU`] on output.
fn count_large_udp(ns: &str) {
    let rules = format!(
        "table inet gsudp {{\n chain out {{\n  type filter hook output priority 0;\n  meta l4proto udp meta length > {ABOVE_MTU} counter\n }}\n}}\n"
    );
    let path = std::env::temp_dir().join(format!("gs-udp-offload-{}.nft", std::process::id()));
    std::fs::write(&path, rules).unwrap();
    let out = netns::exec(ns, "nft", &["-f", path.to_str().unwrap()]).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "nft (apt-get install nftables): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The counter's packets.
fn large_udp_packets(ns: &str) -> u64 {
    let out = netns::exec(ns, "nft", &["list", "table", "inet", "gsudp"]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counter in: {text}"))
}

/// 8 MiB over TCP from `client` to `server`'s mesh IP; every byte must arrive.
fn transfer(client_ns: &str, server_ns: &str, server: &Host) {
    let ip = server.identity().unwrap().1.parse().unwrap();
    let got = netns::tcp_transfer(server_ns, ip, client_ns, 8 << 20, BOUND)
        .unwrap_or_else(|e| panic!("TCP {client_ns} -> {ip}: {e:#}"));
    assert!(got >= 8 << 20, "{got} bytes");
}

#[test]
fn an_operator_switches_a_nodes_udp_offload_off_and_back_without_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lab = Lab::new().unwrap();
    let cp = netns::start_control_plane(&tmp.path().join("cp"), lab.host_addr(), &[]).unwrap();
    let (ns, host, proc) = node(&mut lab, &cp, tmp.path());
    let (peer_ns, peer, peer_proc) = node(&mut lab, &cp, tmp.path());
    let out = || format!("{}\n--- the peer:\n{}", proc.output(), peer_proc.output());
    count_large_udp(&ns);

    // The default: the embedded data plane uses GSO and GRO where the kernel has them.
    let status = wait_offload(&host, "default", true, &out);
    assert_eq!(status["backend"], "userspace", "{status}");
    let pid = proc.pid();
    let (node_id, _) = host.identity().unwrap();
    for h in [&host, &peer] {
        wait_until(BOUND, "both nodes list each other as peers", || {
            Ok(h.status()?.filter(|s| {
                s["event_stream_connected"] == true
                    && s["peers"].as_array().is_some_and(|p| !p.is_empty())
            }))
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", out()));
    }
    // Bulk TCP through the mesh leaves as GSO super-datagrams.
    transfer(&ns, &peer_ns, &peer);
    let with_gso = large_udp_packets(&ns);
    assert!(
        with_gso > 0,
        "offload on, yet no UDP packet above {ABOVE_MTU} bytes left the node"
    );

    let view = cp
        .plexctl_ok(&["node", "set", &node_id, "--udp-offload", "off"])
        .unwrap();
    assert!(
        view.contains("udp offload") && view.contains("off"),
        "{view}"
    );
    let json = cp
        .plexctl_ok(&["--output", "json", "node", "get", &node_id])
        .unwrap();
    let view: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(view["udp_offload"], "off", "{json}");

    // Off in the data plane, read back from the socket, by the same process.
    let status = wait_offload(&host, "off", false, &out);
    assert_eq!(proc.pid(), pid, "the switch needs no restart");
    // Off: the same transfer arrives whole, and not one super-datagram left.
    transfer(&ns, &peer_ns, &peer);
    assert_eq!(
        large_udp_packets(&ns),
        with_gso,
        "GSO sends with offload off"
    );
    let text = host.plexd(&["status"]).unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("udp offload setting off: socket GSO off, GRO off"),
        "{text}\n{status}"
    );

    // Setting it again changes nothing; `default` turns both back on.
    cp.plexctl_ok(&["node", "set", &node_id, "--udp-offload", "off"])
        .unwrap();
    cp.plexctl_ok(&["node", "set", &node_id, "--udp-offload", "default"])
        .unwrap();
    wait_offload(&host, "default", true, &out);
    assert_eq!(proc.pid(), pid);
    transfer(&ns, &peer_ns, &peer);
    assert!(large_udp_packets(&ns) > with_gso, "GSO is back");

    // A bad value is refused before anything is sent.
    let bad = cp
        .plexctl(&["node", "set", &node_id, "--udp-offload", "maybe"])
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("possible values"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}
