//! A spoofer on the path (root): relay frames forged with the relay's source address must not
//! take a relayed pair down. The lab of `reach.rs` (two nodes behind endpoint-dependent NATs,
//! relayed over UDP); the forged datagrams are sent from inside the lab's public namespace (a
//! raw UDP socket on the relay's address, its own UDP header naming the relay's port) to the
//! port node 0's router mapped for node 0's flow to that relay, so they reach node 0 as the
//! relay's: every `refused` code, `peer gone` naming node 1, and a `sealed` frame with a forged
//! tag. Expected: node 0 keeps its registration and its path through the same relay, and the
//! mesh carries traffic.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use plexsphere_e2e::nat::{
    NatMode, NodeSpec, PeerPath, ReachLab, flags, nat_mapped_port, send_spoofed,
};
use plexsphere_wire::key::PublicKey;
use plexsphere_wire::reach::relay::{Frame, RefuseCode, prefix};

const PATH_BOUND: Duration = Duration::from_secs(45);
const BOUND: Duration = Duration::from_secs(60);
/// How long the paths are watched after the spoofed frames: past the engine's reaction to a
/// relay that went down or a peer that is gone (a tick), well inside the 30 s such a block lasts.
const WATCH: Duration = Duration::from_secs(8);
/// plexd's WireGuard port (the lab's node config keeps the default).
const LISTEN_PORT: u16 = 51820;

fn lab() -> ReachLab {
    let mut lab = ReachLab::start(&[NatMode::Edm, NatMode::Edm], 2).unwrap();
    for r in 0..2 {
        lab.add_node(&NodeSpec {
            router: r,
            backend: "userspace",
        })
        .unwrap();
    }
    for i in 0..2 {
        lab.start_node(i)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.dump()));
    }
    lab
}

fn relayed_over_udp(p: &PeerPath) -> bool {
    p.is_relayed_over("udp") && p.relay.is_some()
}

/// The UDP address of relay `name` (one of the lab's, or the one `plexsphere dev` embeds).
fn relay_udp(lab: &ReachLab, name: &str) -> SocketAddrV4 {
    let addr = match lab.relays.iter().find(|r| r.name == name) {
        Some(r) => r.udp(),
        None => {
            assert_eq!(name, flags::DEV_RELAY_NAME);
            SocketAddr::new(lab.cp.addr().unwrap().ip(), flags::DEV_RELAY_UDP_PORT)
        }
    };
    match addr {
        SocketAddr::V4(v4) => v4,
        SocketAddr::V6(_) => panic!("the lab is IPv4"),
    }
}

/// Node `i`'s WireGuard public key.
fn key_of(lab: &ReachLab, i: usize) -> PublicKey {
    let id = lab.nodes[i].host.identity().unwrap().0;
    let out = lab
        .plexctl_ok(&["node", "get", &id, "--output", "json"])
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let b64 = v["wireguard_public_key"].as_str().unwrap();
    PublicKey::from_base64(b64).unwrap()
}

#[test]
fn spoofed_relay_frames_from_the_relays_address_leave_the_relayed_pair_up() {
    let lab = lab();
    for (from, to) in [(0, 1), (1, 0)] {
        lab.wait_path(from, to, "relayed over UDP", PATH_BOUND, relayed_over_udp)
            .unwrap();
    }
    lab.wait_ping(0, 1, BOUND).unwrap();
    // Each direction goes through the relay its sender chose; the two may differ (each node
    // sends through the peer's home relay), so each is watched on its own.
    let relay_of = |a: usize, b: usize| lab.path(a, b).unwrap().unwrap().relay.unwrap();
    let relays = [((0, 1), relay_of(0, 1)), ((1, 0), relay_of(1, 0))];
    // The spoofer forges frames from the relay node 0 sends through, to node 0's mapping.
    let relay = relays[0].1.clone();
    let from = relay_udp(&lab, &relay);
    let IpAddr::V4(node0) = IpAddr::from(lab.topo.node_addr(0, 0)) else {
        unreachable!()
    };
    let router = lab.topo.router_ns(0).unwrap().to_owned();
    let mapped = nat_mapped_port(&router, SocketAddrV4::new(node0, LISTEN_PORT), from).unwrap();
    let IpAddr::V4(wan) = IpAddr::from(lab.topo.router_wan(0)) else {
        unreachable!()
    };
    let to = SocketAddrV4::new(wan, mapped);
    let peer = prefix(&key_of(&lab, 1));
    let mut forged = Vec::new();
    for code in [
        RefuseCode::Expired,
        RefuseCode::BadToken,
        RefuseCode::Busy,
        RefuseCode::NotRegistered,
        RefuseCode::BadProof,
    ] {
        forged.push(Frame::Refused {
            code,
            reason: "spoofed".into(),
        });
    }
    forged.push(Frame::PeerGone { dst: peer });
    forged.push(Frame::Sealed {
        counter: u64::MAX,
        body: Frame::PeerGone { dst: peer }.encode(),
        tag: [0; 16],
    });
    // Every frame several times over: what one spoofer can send in a moment.
    let datagrams: Vec<Vec<u8>> = (0..20)
        .flat_map(|_| forged.iter().map(Frame::to_datagram))
        .collect();
    send_spoofed(lab.topo.public_ns(), from, to, datagrams).unwrap();

    // The pair stays up, each direction through its relay, for a while (a relay taken for down,
    // or a peer blocked for 30 s, moves the path within a tick): every observation names it.
    let watch_until = Instant::now() + WATCH;
    let mut seen = 0;
    while Instant::now() < watch_until {
        for ((a, b), relay) in &relays {
            let p = lab.path(*a, *b).unwrap().unwrap();
            assert!(
                relayed_over_udp(&p) && p.relay.as_deref() == Some(relay.as_str()),
                "{a} -> {b} moved off relay {relay} after the spoofed frames: {p:?}\n{}",
                lab.dump()
            );
            seen += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(seen >= 2, "observed the paths {seen} times");
    lab.wait_ping(0, 1, BOUND).unwrap();
    lab.wait_ping(1, 0, BOUND).unwrap();
    assert_eq!(lab.transfer(0, 1, 1 << 20, BOUND).unwrap(), 1 << 20);
}
