//! The NAT topologies of the reach tests, tested on their own (root), before any reach code is
//! involved: each router mode translates the way its name says (seen from a UDP echo on the
//! public segment that answers with the source it saw), a mode changes at run time, and two
//! bare userspace WireGuard peers behind routers punch through endpoint-independent NATs by
//! simultaneous handshakes and not through endpoint-dependent ones.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::{SocketAddr, SocketAddrV4};
use std::time::Duration;

use plexsphere_e2e::nat::{NatMode, Topology, UdpEcho, WgPeer, send_spoofed, udp_mapped_from};
use plexsphere_e2e::{bin, netns, wait_until};

/// How long a probe waits for an echo's answer before it counts the datagram as blocked.
const ANSWER_BOUND: Duration = Duration::from_secs(3);
const BOUND: Duration = Duration::from_secs(30);
/// The port the inside hosts send from.
const LOCAL_PORT: u16 = 40_000;

/// A topology with one router in `mode`, one node behind it and two echoes on the public
/// segment.
fn one_router(mode: NatMode) -> (Topology, String, [UdpEcho; 2]) {
    let mut topo = Topology::new().unwrap();
    let r = topo.add_router(mode).unwrap();
    let node = topo.add_node(r).unwrap();
    let echoes = [(); 2].map(|()| {
        let addr = topo.add_public_addr().unwrap();
        UdpEcho::start(topo.public_ns(), SocketAddr::from((addr, 3478))).unwrap()
    });
    (topo, node, echoes)
}

fn mapped(node: &str, echoes: &[UdpEcho; 2]) -> Vec<Option<SocketAddr>> {
    udp_mapped_from(
        node,
        LOCAL_PORT,
        &[echoes[0].addr, echoes[1].addr],
        ANSWER_BOUND,
    )
    .unwrap()
}

#[test]
fn eim_keeps_one_mapping_towards_two_destinations_and_the_port_when_free() {
    let (topo, node, echoes) = one_router(NatMode::Eim);
    let seen = mapped(&node, &echoes);
    let wan = SocketAddr::from((topo.router_wan(0), LOCAL_PORT));
    assert_eq!(
        seen,
        vec![Some(wan), Some(wan)],
        "EIM: the router's address, the port kept"
    );
}

/// "EIM, input accept": a datagram from outside that reaches the router's public port before
/// the inside host sent to its source leaves a conntrack entry of the router's own, which holds
/// the tuple: the host's mapping towards that source takes another port, towards everyone else
/// it keeps its own. A router that drops such datagrams at its input keeps nothing of them.
#[test]
fn eim_input_accept_moves_the_mapping_towards_a_source_that_arrived_first() {
    for mode in [NatMode::EimInputAccept, NatMode::Eim] {
        let (topo, node, echoes) = one_router(mode);
        let wan = SocketAddrV4::new(topo.router_wan(0), LOCAL_PORT);
        let SocketAddr::V4(early) = echoes[1].addr else {
            panic!("the echoes are IPv4")
        };
        send_spoofed(topo.public_ns(), early, wan, vec![b"early".to_vec()]).unwrap();
        let seen = mapped(&node, &echoes);
        assert_eq!(
            seen[0],
            Some(SocketAddr::V4(wan)),
            "{mode:?}: the port kept"
        );
        let towards_early = seen[1].unwrap();
        assert_eq!(
            towards_early.ip(),
            std::net::IpAddr::V4(*wan.ip()),
            "{mode:?}"
        );
        if mode == NatMode::EimInputAccept {
            assert_ne!(
                towards_early.port(),
                LOCAL_PORT,
                "the router's own entry holds the tuple: {seen:?}"
            );
        } else {
            assert_eq!(towards_early.port(), LOCAL_PORT, "{seen:?}");
        }
    }
}

#[test]
fn edm_maps_each_destination_to_its_own_port() {
    let (topo, node, echoes) = one_router(NatMode::Edm);
    let seen = mapped(&node, &echoes);
    let (a, b) = (seen[0].unwrap(), seen[1].unwrap());
    assert_eq!(a.ip(), topo.router_wan(0));
    assert_eq!(b.ip(), topo.router_wan(0));
    assert_ne!(a.port(), b.port(), "EDM: a port per destination: {seen:?}");
}

#[test]
fn none_routes_without_translation() {
    let (topo, node, echoes) = one_router(NatMode::None);
    let seen = mapped(&node, &echoes);
    let inside = SocketAddr::from((topo.node_addr(0, 0), LOCAL_PORT));
    assert_eq!(seen, vec![Some(inside), Some(inside)]);
}

#[test]
fn drop_udp_drops_every_outbound_datagram_and_passes_tcp() {
    let (topo, node, echoes) = one_router(NatMode::DropUdp);
    assert_eq!(
        mapped(&node, &echoes),
        vec![None, None],
        "UDP must not pass"
    );
    let server = echoes[0].addr.ip();
    let std::net::IpAddr::V4(server) = server else {
        panic!("the echo is IPv4")
    };
    let got = netns::tcp_transfer(topo.public_ns(), server, &node, 1 << 20, BOUND).unwrap();
    assert_eq!(got, 1 << 20, "TCP passes a DropUdp router");
}

#[test]
fn a_mode_changes_at_run_time() {
    let (mut topo, node, echoes) = one_router(NatMode::DropUdp);
    assert_eq!(mapped(&node, &echoes), vec![None, None]);
    topo.set_mode(0, NatMode::Edm).unwrap();
    let seen = mapped(&node, &echoes);
    assert_ne!(seen[0].unwrap().port(), seen[1].unwrap().port(), "{seen:?}");
    topo.set_mode(0, NatMode::Eim).unwrap();
    let wan = SocketAddr::from((topo.router_wan(0), LOCAL_PORT));
    assert_eq!(mapped(&node, &echoes), vec![Some(wan), Some(wan)]);
    assert_eq!(topo.mode(0), Some(NatMode::Eim));
}

/// Two routers in `mode`, a node behind each running `program` with the other's public
/// mapping (router address, WireGuard port) as endpoint and a 1 s persistent keepalive.
fn punch(
    mode: NatMode,
    program: &std::path::Path,
) -> (tempfile::TempDir, Topology, WgPeer, WgPeer) {
    const WG_PORT: u16 = 51820;
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().to_path_buf();
    let mut topo = Topology::new().unwrap();
    let ns: Vec<String> = (0..2)
        .map(|_| {
            let r = topo.add_router(mode).unwrap();
            topo.add_node(r).unwrap()
        })
        .collect();
    let peers: Vec<WgPeer> = (0..2)
        .map(|i| {
            let addr = format!("10.99.0.{}/24", i + 1);
            WgPeer::start(program, &ns[i], &topo.wg_iface(i, 0), &addr, WG_PORT, &tmp).unwrap()
        })
        .collect();
    for (me, other) in [(0, 1), (1, 0)] {
        let ep = SocketAddr::from((topo.router_wan(other), WG_PORT));
        let ip = format!("10.99.0.{}/32", other + 1);
        peers[me]
            .set_peer(&peers[other].public_key, Some(ep), &ip, Some(1))
            .unwrap();
    }
    let mut it = peers.into_iter();
    let (a, b) = (it.next().unwrap(), it.next().unwrap());
    (dir, topo, a, b)
}

fn ping(ns: &str, ip: &str) -> bool {
    netns::exec(ns, "ping", &["-c", "1", "-W", "1", ip])
        .unwrap()
        .status
        .success()
}

fn punches_through_eim(program: &std::path::Path) {
    let (_dir, _topo, a, b) = punch(NatMode::Eim, program);
    wait_until(BOUND, "the peers behind EIM routers handshake", || {
        Ok((a.has_handshake()? && b.has_handshake()?).then_some(()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n--- a:\n{}\n--- b:\n{}",
            a.proc.output(),
            b.proc.output()
        )
    });
    wait_until(BOUND, "a pings b over the tunnel", || {
        Ok(ping(&a.ns, "10.99.0.2").then_some(()))
    })
    .unwrap();
    assert!(ping(&b.ns, "10.99.0.1"));
}

#[test]
fn plexd_wg_peers_behind_eim_routers_punch_through_by_simultaneous_handshakes() {
    punches_through_eim(&bin("plexd-wg").unwrap());
}

#[test]
fn wireguard_go_peers_behind_eim_routers_punch_through_by_simultaneous_handshakes() {
    punches_through_eim(std::path::Path::new("/usr/bin/wireguard-go"));
}

/// Behind EDM routers each side's datagrams leave from a port the other side never sent to,
/// and conntrack lets in only replies to an outbound flow: no handshake completes. Ten
/// seconds cover two handshake attempts of each side (WireGuard retries every 5 s) and ten
/// keepalive rounds.
#[test]
fn plexd_wg_peers_behind_edm_routers_do_not_connect() {
    const NO_HANDSHAKE_FOR: Duration = Duration::from_secs(10);
    let (_dir, _topo, a, b) = punch(NatMode::Edm, &bin("plexd-wg").unwrap());
    let connected = wait_until(NO_HANDSHAKE_FOR, "a handshake behind EDM", || {
        Ok((a.has_handshake()? || b.has_handshake()?).then_some(()))
    });
    assert!(connected.is_err(), "EDM routers let a handshake through");
    assert!(!ping(&a.ns, "10.99.0.2"));
}

/// Behind "EIM, input accept" routers the first handshake of one side reaches the other
/// side's router before that side sent anything: the router keeps it (its own input), the
/// other side's datagrams to the first leave from another port, which reaches the first
/// side's router as just as unsolicited; every retry refreshes both entries, and no handshake
/// completes (what plexd's timed punch avoids, docs/reach.md).
#[test]
fn plexd_wg_peers_behind_eim_input_accept_routers_do_not_connect() {
    const NO_HANDSHAKE_FOR: Duration = Duration::from_secs(10);
    let (_dir, topo, a, b) = punch(NatMode::EimInputAccept, &bin("plexd-wg").unwrap());
    let connected = wait_until(
        NO_HANDSHAKE_FOR,
        "a handshake behind EIM, input accept",
        || Ok((a.has_handshake()? || b.has_handshake()?).then_some(())),
    );
    let table = |r: usize| {
        let ns = topo.router_ns(r).unwrap().to_owned();
        String::from_utf8_lossy(
            &netns::exec(&ns, "conntrack", &["-L", "-p", "udp"])
                .unwrap()
                .stdout,
        )
        .into_owned()
    };
    assert!(
        connected.is_err(),
        "a handshake passed\n--- router 0:\n{}\n--- router 1:\n{}",
        table(0),
        table(1)
    );
    assert!(!ping(&a.ns, "10.99.0.2"));
}

/// The reach lab without relays (what exists before the reach work): the control plane on the
/// public segment, a plexd behind a router of every mode enrols and keeps its event stream
/// (the API is TCP: it passes every mode, DropUdp too), and `plexctl` on the public segment
/// lists all four nodes.
#[test]
fn reach_lab_nodes_behind_every_mode_enrol_with_the_control_plane() {
    use plexsphere_e2e::nat::{NodeSpec, ReachLab};
    let modes = [NatMode::Eim, NatMode::Edm, NatMode::DropUdp, NatMode::None];
    let mut lab = ReachLab::start(&modes, 0).unwrap();
    for r in 0..modes.len() {
        let i = lab
            .add_node(&NodeSpec {
                router: r,
                backend: "userspace",
            })
            .unwrap();
        lab.start_node(i)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.dump()));
    }
    let out = lab
        .plexctl_ok(&["node", "list", "--output", "json"])
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let listed = v
        .as_array()
        .or_else(|| v["items"].as_array())
        .map_or(0, Vec::len);
    assert_eq!(listed, modes.len(), "{out}");
    for (i, n) in lab.nodes.iter().enumerate() {
        let want = modes.len() - 1;
        let status = wait_until(BOUND, &format!("node {i} lists {want} peers"), || {
            Ok(n.host.status()?.filter(|s| {
                s["event_stream_connected"] == true
                    && s["peers"].as_array().map(Vec::len) == Some(want)
            }))
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.dump()));
        assert_eq!(status["backend"], "userspace", "node {i}");
    }
    // "Killing" dev's embedded relay rejects its ports only: the API stays up for every node.
    lab.kill_relay(plexsphere_e2e::nat::flags::DEV_RELAY_NAME)
        .unwrap();
    let beats: Vec<u64> = lab
        .nodes
        .iter()
        .map(|n| {
            n.host.status().unwrap().unwrap()["last_heartbeat_age_secs"]
                .as_u64()
                .unwrap_or(u64::MAX)
        })
        .collect();
    for (i, n) in lab.nodes.iter().enumerate() {
        wait_until(BOUND, &format!("node {i} still heartbeats"), || {
            let s = n.host.status()?;
            Ok(s.filter(|s| {
                s["api"]["reachable"] == true
                    && s["last_heartbeat_age_secs"]
                        .as_u64()
                        .is_some_and(|a| a <= 2)
            })
            .map(|_| ()))
        })
        .unwrap_or_else(|e| panic!("{e:#} (ages before: {beats:?})\n{}", lab.dump()));
    }
}

/// The long TCP stream the upgrade scenario keeps running, on what exists today: two plexd
/// nodes behind routing-only routers mesh directly (the control plane's endpoints are
/// reachable), a stream runs over their mesh IPs, and both routers' rulesets are replaced and
/// their conntrack tables flushed at run time; data keeps flowing and every byte arrives.
#[test]
fn a_long_tcp_stream_over_the_mesh_survives_a_ruleset_replacement() {
    use plexsphere_e2e::nat::{NodeSpec, ReachLab};
    let mut lab = ReachLab::start(&[NatMode::None, NatMode::None], 0).unwrap();
    for r in 0..2 {
        let i = lab
            .add_node(&NodeSpec {
                router: r,
                backend: "userspace",
            })
            .unwrap();
        lab.start_node(i).unwrap();
    }
    lab.wait_ping(0, 1, BOUND).unwrap();
    let stream = lab.long_stream(0, 1).unwrap();
    let before = stream.wait_flowing(0, 256 << 10, BOUND).unwrap();
    lab.set_mode(0, NatMode::None).unwrap();
    lab.set_mode(1, NatMode::None).unwrap();
    let after = stream.wait_flowing(before, 256 << 10, BOUND).unwrap();
    let total = stream.finish().unwrap();
    assert!(total >= after && after > before, "{before} {after} {total}");
    assert_eq!(lab.transfer(1, 0, 1 << 20, BOUND).unwrap(), 1 << 20);
}
