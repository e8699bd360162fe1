//! Every node reaches every node (root): two plexd nodes, each behind its own router doing NAT
//! with nftables (tests/src/nat.rs), the control plane (`plexsphere dev`, STUN on both relays)
//! and two relays on the public segment. Each test pings and carries a TCP transfer over the
//! mesh IPs and asserts the path `plexd status --output json` reports on both sides.
//!
//! These need the reach work: the relay (`plexsphere relay`), the control plane's `--relay` and
//! `--stun-advertise`, and plexd's reach runtime (STUN, disco, punching, relays over UDP and
//! TCP/TLS). Flag spellings live in `plexsphere_e2e::nat::flags`.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use plexsphere_e2e::nat::{NatMode, NodeSpec, PeerPath, ReachLab};

/// Enrolment, STUN, call-me-maybe and punching: well inside the 60-90 s of the e2e tests.
const PATH_BOUND: Duration = Duration::from_secs(45);
const BOUND: Duration = Duration::from_secs(60);
/// The TCP transfer of every scenario, each way.
const BYTES: u64 = 4 << 20;

/// A lab with routers in `modes` (one node behind each, started) and two relays.
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

/// Pings both ways and a TCP transfer each way over the mesh IPs.
fn mesh_carries_traffic(lab: &ReachLab) {
    lab.wait_ping(0, 1, BOUND).unwrap();
    lab.wait_ping(1, 0, BOUND).unwrap();
    // The tunnel MTU (1420) crosses every path, relayed ones included, unfragmented.
    for (from, to) in [(0, 1), (1, 0)] {
        let answered = lab.full_size_pings_unfragmented(from, to, 3).unwrap();
        assert!(
            answered >= 2,
            "{answered} of 3 full-size pings from {from} to {to} answered"
        );
    }
    assert_eq!(lab.transfer(0, 1, BYTES, BOUND).unwrap(), BYTES);
    assert_eq!(lab.transfer(1, 0, BYTES, BOUND).unwrap(), BYTES);
}

fn direct(p: &PeerPath) -> bool {
    p.is_direct() && p.endpoint.is_some()
}

fn relayed_over(transport: &'static str) -> impl Fn(&PeerPath) -> bool {
    move |p| p.is_relayed_over(transport) && p.relay.is_some()
}

/// Node `from` carries its peer `to`, relayed (over UDP or on a relay's TCP/TLS link), inside
/// its userspace data plane: the peer's WireGuard endpoint is a relay endpoint, not a loopback
/// forwarder (127.0.0.1).
/// Waits until each node's path to the other is relayed over UDP.
fn wait_relayed_over_udp_both_ways(lab: &ReachLab) {
    for (from, to) in [(0, 1), (1, 0)] {
        lab.wait_path(
            from,
            to,
            "relayed over UDP",
            PATH_BOUND,
            relayed_over("udp"),
        )
        .unwrap();
    }
}

fn no_forwarder(lab: &ReachLab, from: usize, to: usize) {
    let p = lab.path(from, to).unwrap().unwrap();
    assert!(
        p.is_relayed_in_data_plane() && !p.wg_endpoint.is_some_and(|e| e.ip().is_loopback()),
        "node {from}'s peer {to} relayed inside the data plane, without a loopback forwarder: {p:?}"
    );
}

/// `plexctl node get` of node `i`: its NAT mapping as it measured it, and its candidates.
fn nat_of(lab: &ReachLab, i: usize) -> (String, Vec<serde_json::Value>) {
    let id = lab.nodes[i].host.identity().unwrap().0;
    let out = lab
        .plexctl_ok(&["node", "get", &id, "--output", "json"])
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mapping = v["nat"]["mapping"].as_str().unwrap_or("").to_owned();
    let candidates = v["candidates"].as_array().cloned().unwrap_or_default();
    (mapping, candidates)
}

/// Both behind endpoint-independent NATs: each side's mapping is the same towards the STUN
/// servers and towards the peer, so probing the peer's reflexive candidate punches through
/// (simultaneous open through port-restricted filtering). Expected: direct both ways, to the
/// peer router's public address; `plexctl node get` shows the EIM mapping and the reflexive
/// candidate.
#[test]
fn both_behind_eim_punch_a_direct_path() {
    let lab = lab(&[NatMode::Eim, NatMode::Eim]);
    for (from, to) in [(0, 1), (1, 0)] {
        let p = lab
            .wait_path(from, to, "direct", PATH_BOUND, |p| {
                direct(p) && p.rtt_ms.is_some()
            })
            .unwrap();
        let ep = p.endpoint.unwrap();
        assert_eq!(
            ep.ip(),
            std::net::IpAddr::V4(lab.topo.router_wan(to)),
            "{p:?}"
        );
    }
    mesh_carries_traffic(&lab);
    for i in 0..2 {
        let wan = lab.topo.router_wan(i).to_string();
        let (mapping, candidates) = nat_of(&lab, i);
        assert_eq!(mapping, "endpoint_independent", "node {i}");
        assert!(
            candidates.iter().any(|c| c["kind"] == "reflexive"
                && c["address"]
                    .as_str()
                    .is_some_and(|a| a.starts_with(&format!("{wan}:")))),
            "node {i}'s reflexive candidate is its router's address: {candidates:?}"
        );
    }
}

/// Both behind endpoint-dependent NATs: every destination gets its own port, so the mapping
/// STUN saw is not the one the peer's probes would have to reach, and conntrack lets nothing
/// else in. Expected: relayed over UDP both ways; `plexctl node get` shows the EDM mapping.
#[test]
fn both_behind_edm_are_relayed_over_udp() {
    let lab = lab(&[NatMode::Edm, NatMode::Edm]);
    wait_relayed_over_udp_both_ways(&lab);
    mesh_carries_traffic(&lab);
    // Still relayed after the traffic: no direct path was possible.
    for (from, to) in [(0, 1), (1, 0)] {
        let p = lab.path(from, to).unwrap().unwrap();
        assert!(relayed_over("udp")(&p), "{p:?}");
        no_forwarder(&lab, from, to);
    }
    for i in 0..2 {
        assert_eq!(nat_of(&lab, i).0, "endpoint_dependent", "node {i}");
    }
}

/// Node 0 behind an "EIM, input accept" router (its input keeps what arrives unsolicited, so a
/// ping of node 1 that reaches it before node 0 sent to node 1 moves node 0's mapping towards
/// node 1 to another port), node 1 routed without NAT. Node 0's pings reach node 1 from
/// whatever port the router gave them, node 1 answers them there and probes that address
/// (peer-reflexive): direct both ways, node 1's endpoint for node 0 on router 0's address.
#[test]
fn one_behind_eim_input_accept_and_one_routed_go_direct_where_the_pings_come_from() {
    let lab = lab(&[NatMode::EimInputAccept, NatMode::None]);
    for (from, to) in [(0, 1), (1, 0)] {
        lab.wait_path(from, to, "direct", PATH_BOUND, |p| {
            direct(p) && p.rtt_ms.is_some()
        })
        .unwrap();
    }
    let p = lab.path(1, 0).unwrap().unwrap();
    assert_eq!(
        p.endpoint.map(|e| e.ip()),
        Some(std::net::IpAddr::V4(lab.topo.router_wan(0))),
        "{p:?}"
    );
    mesh_carries_traffic(&lab);
}

/// Both behind "EIM, input accept" routers. In this lab the routers are microseconds apart, so
/// the timed punch loses the race: one node's ping reaches the other's router before that
/// router's node sent, the router keeps it (an entry of its own), and the pair stays relayed
/// (docs/reach.md, "What each NAT topology gives"). What plexd must do then is stop refreshing
/// that entry: after its failed punches the pair is quiet towards each other's cold candidates
/// until both routers forgot them, so the next punch meets clean routers (where the routers
/// are milliseconds apart, as on the Internet, it passes). Expected: relayed over UDP, a
/// router's own entry for the other router's datagrams shows, and later a moment comes when
/// neither router holds one (a plexd that punched on every 5 s probe round refreshed them for
/// good).
#[test]
fn both_behind_eim_input_accept_let_the_routers_forget_a_lost_punch() {
    use plexd::reach::engine::{PROBE_INTERVAL, PUNCH_QUIET};
    // The failed series (two probe rounds of each node), the quiet, and a probe round.
    const FORGET_BOUND: Duration = Duration::from_secs(
        2 * PROBE_INTERVAL.as_secs() + PUNCH_QUIET.as_secs() + PROBE_INTERVAL.as_secs(),
    );
    let lab = lab(&[NatMode::EimInputAccept, NatMode::EimInputAccept]);
    wait_relayed_over_udp_both_ways(&lab);
    let own = || -> anyhow::Result<Vec<String>> {
        let mut all = lab.topo.routers_own_udp_entries(0)?;
        all.extend(lab.topo.routers_own_udp_entries(1)?);
        Ok(all)
    };
    let held = plexsphere_e2e::wait_until(BOUND, "a lost punch held by a router", || {
        Ok(Some(own()?).filter(|e| !e.is_empty()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.dump()));
    plexsphere_e2e::wait_until(FORGET_BOUND, "both routers forgot the lost punch", || {
        Ok(own()?.is_empty().then_some(()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}\nfirst held: {held:?}\nnow: {:?}\n{}",
            own(),
            lab.dump()
        )
    });
    mesh_carries_traffic(&lab);
}

/// Node 0's router drops every outbound UDP datagram (TCP to the API and the relays passes):
/// node 0 reaches the relay over TCP/TLS and says so; node 1 (EIM) reaches node 0 through a
/// relay too (no direct path can exist), over UDP, its own leg to the relay.
#[test]
fn one_behind_a_udp_dropping_router_is_relayed_over_tcp() {
    let lab = lab(&[NatMode::DropUdp, NatMode::Eim]);
    lab.wait_path(0, 1, "relayed over TCP", PATH_BOUND, relayed_over("tcp"))
        .unwrap();
    lab.wait_path(1, 0, "relayed over UDP", PATH_BOUND, relayed_over("udp"))
        .unwrap();
    mesh_carries_traffic(&lab);
    // Both legs inside the data planes: node 1's over UDP, node 0's on its TLS link.
    no_forwarder(&lab, 1, 0);
    no_forwarder(&lab, 0, 1);
    let id = lab.nodes[0].host.identity().unwrap().0;
    let out = lab
        .plexctl_ok(&["node", "get", &id, "--output", "json"])
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["nat"]["udp_blocked"], true,
        "node 0 reports UDP blocked: {v}"
    );
}

/// One endpoint-dependent (node 0) and one endpoint-independent (node 1). What is possible:
/// node 0's datagrams to node 1 leave from a fresh port per destination, one node 1 never
/// learns (STUN saw another); node 1's probes to the reflexive port STUN reported for node 0
/// are dropped by node 0's router (that port's flow goes to the STUN server only). Linux's
/// conntrack filters port-restricted on node 1's side too, so node 0's probes from the fresh
/// port are dropped there unless node 1 had sent to exactly that port, which it cannot know
/// (no port guessing). Expected: relayed over UDP both ways, and it stays so.
#[test]
fn one_edm_and_one_eim_are_relayed() {
    let lab = lab(&[NatMode::Edm, NatMode::Eim]);
    wait_relayed_over_udp_both_ways(&lab);
    mesh_carries_traffic(&lab);
    for (from, to) in [(0, 1), (1, 0)] {
        let p = lab.path(from, to).unwrap().unwrap();
        assert!(relayed_over("udp")(&p), "still relayed: {p:?}");
        no_forwarder(&lab, from, to);
    }
}

/// Both behind EDM (relayed over UDP), a TCP stream over the mesh IPs running; then both
/// routers switch to EIM at run time (new rulesets, conntrack flushed): plexd's re-probing
/// (on its schedule and on the changed reflexive address) finds the direct path and moves
/// the pair onto it, and the TCP stream never drops: data flows before, during and after,
/// and every byte sent arrives.
#[test]
fn relayed_pair_upgrades_to_direct_when_the_nats_allow_it_without_dropping_tcp() {
    const UPGRADE_BOUND: Duration = Duration::from_secs(60);
    let mut lab = lab(&[NatMode::Edm, NatMode::Edm]);
    wait_relayed_over_udp_both_ways(&lab);
    lab.wait_ping(0, 1, BOUND).unwrap();
    for (from, to) in [(0, 1), (1, 0)] {
        no_forwarder(&lab, from, to);
    }
    let stream = lab.long_stream(0, 1).unwrap();
    let before = stream.wait_flowing(0, 256 << 10, BOUND).unwrap();

    lab.set_mode(0, NatMode::Eim).unwrap();
    lab.set_mode(1, NatMode::Eim).unwrap();
    for (from, to) in [(0, 1), (1, 0)] {
        lab.wait_path(from, to, "direct after the upgrade", UPGRADE_BOUND, direct)
            .unwrap();
    }
    let after = stream.wait_flowing(before, 256 << 10, BOUND).unwrap();
    assert!(after > before);
    let total = stream
        .finish()
        .unwrap_or_else(|e| panic!("the TCP stream dropped: {e:#}\n{}", lab.dump()));
    assert!(total >= after, "{total} < {after}");
    mesh_carries_traffic(&lab);
}

/// Both behind EDM, relayed; the relay node 0's path uses is killed (SIGKILL): both sides move
/// to another relay of the state (the other one, or one `plexsphere dev` embeds) and the mesh
/// carries traffic again.
#[test]
fn a_killed_relay_moves_the_pair_to_the_other_relay() {
    const MOVE_BOUND: Duration = Duration::from_secs(45);
    let mut lab = lab(&[NatMode::Edm, NatMode::Edm]);
    let p = lab
        .wait_path(0, 1, "relayed over UDP", PATH_BOUND, relayed_over("udp"))
        .unwrap();
    lab.wait_path(1, 0, "relayed over UDP", PATH_BOUND, relayed_over("udp"))
        .unwrap();
    lab.wait_ping(0, 1, BOUND).unwrap();
    let killed = p.relay.unwrap();
    lab.kill_relay(&killed).unwrap();
    for (from, to) in [(0, 1), (1, 0)] {
        let k = killed.clone();
        lab.wait_path(from, to, "relayed by another relay", MOVE_BOUND, move |p| {
            relayed_over("udp")(p) && p.relay.as_deref() != Some(k.as_str())
        })
        .unwrap();
    }
    mesh_carries_traffic(&lab);
    for (from, to) in [(0, 1), (1, 0)] {
        no_forwarder(&lab, from, to);
    }
}
