//! How the node has the runtime carry what it decided, seen only through its inputs and its
//! output queue on a stepped clock (`scripted.rs`): each peer's path (direct, the data
//! plane's relay endpoint, a forwarder over UDP or a TCP link, held) and the relays whose
//! frames the data plane unwraps.

use std::net::SocketAddr;
use std::time::Duration;

use plexsphere_test_support::seeded::SeededRng;
use plexsphere_wire::key::PublicKey;
use plexsphere_wire::reach::public_key;
use plexsphere_wire::reach::relay::{Frame, prefix};

use super::base::{NODE_SECRET, mesh};
use super::rig::spec;
use super::scripted::{Rig, peer, position, position_from, relay_r1, relay_udp, short};
use crate::reach::io::{Effect, Path, TICK, Transport};
use crate::reach::node::{Carry, FORWARDER_LINGER, Node, NodeOut, Via};

fn set_path(rig: &mut Rig, peer: PublicKey, path: Path) -> Vec<String> {
    let now = rig.now();
    rig.node.handle_effect(Effect::SetPath { peer, path }, now);
    rig.drain()
}

fn over(relay: &str, transport: Transport) -> Path {
    Path::Relay {
        relay: relay.to_owned(),
        transport,
    }
}

fn carry(peer: PublicKey, how: &Carry) -> String {
    format!("carry {} {how:?}", short(&peer))
}

fn plane_r1() -> Carry {
    Carry::PlaneRelay {
        relay: "r1".to_owned(),
        udp: relay_udp(),
    }
}

#[test]
fn a_direct_path_is_the_peer_s_endpoint_and_no_path_carries_nothing() {
    let mut rig = Rig::with_silent_r1();
    let peer = public_key(&[0x50; 32]);
    let endpoint = SocketAddr::from(([198, 51, 100, 7], 51820));
    assert_eq!(
        set_path(&mut rig, peer, Path::Direct { endpoint }),
        [carry(peer, &Carry::Direct(endpoint))]
    );
    assert!(set_path(&mut rig, peer, Path::None).is_empty());
}

#[test]
fn a_relay_path_over_udp_is_the_data_plane_s_endpoint_and_a_refusal_a_forwarder_at_once() {
    let mut rig = Rig::with_silent_r1();
    let (a, b) = (public_key(&[0x50; 32]), public_key(&[0x51; 32]));
    for peer in [a, b] {
        let now = rig.now();
        rig.node.handle_effect(
            Effect::SetPath {
                peer,
                path: over("r1", Transport::Udp),
            },
            now,
        );
    }
    // The data plane refuses a's relay endpoint (the kernel has none): a's forwarder to r1's
    // UDP address is the very next output, ahead of b's.
    let first = rig.node.poll_out();
    assert!(
        matches!(&first, Some(NodeOut::Carry { peer, how }) if *peer == a && *how == plane_r1()),
        "{first:?}"
    );
    rig.node.handle_plane_refused(a);
    assert_eq!(
        rig.drain(),
        [
            carry(a, &Carry::Forward(Via::Udp(relay_udp()))),
            carry(b, &plane_r1())
        ]
    );
    // A peer the node does not relay has nothing to fall back to.
    rig.node.handle_plane_refused(public_key(&[0x52; 32]));
    assert!(rig.drain().is_empty());
}

#[test]
fn a_relay_path_over_tcp_is_the_plane_s_endpoint_on_its_link_and_the_link_s_end_carries_its_peers_anew()
 {
    let mut rig = Rig::new();
    rig.relay_alive = false;
    rig.node = Node::new(
        NODE_SECRET,
        mesh(),
        true,
        Box::new(SeededRng::new(2)),
        Box::new(SeededRng::new(1)),
        rig.start,
    );
    rig.node.handle_token(b"{\"token\":1}".to_vec());
    let (a, b) = (public_key(&[0x50; 32]), public_key(&[0x51; 32]));
    let now = rig.now();
    // r1 with a UDP address and TLS, r2 with TLS only.
    rig.node.handle_relays(
        vec![spec("r1", 1, true, true), spec("r2", 2, false, true)],
        Vec::new(),
        now,
    );
    rig.drain();
    assert_eq!(
        set_path(&mut rig, a, over("r1", Transport::Udp)),
        [carry(a, &plane_r1())]
    );
    // r2 has no UDP address: its connection starts over TCP, and b is carried on the link by
    // the data plane itself; a data plane that cannot (the kernel) gets a forwarder on it.
    let lines = set_path(&mut rig, b, over("r2", Transport::Tcp));
    let open = position(&lines, "OpenTcp { relay: \"r2\"");
    let tcp = carry(
        b,
        &Carry::PlaneLink {
            relay: "r2".to_owned(),
        },
    );
    assert_eq!(lines[open + 1..], [tcp], "{lines:?}");
    rig.node.handle_plane_refused(b);
    assert_eq!(
        rig.drain(),
        [carry(b, &Carry::Forward(Via::Tcp("r2".to_owned())))]
    );

    // r1 stays silent over UDP: its connection moves to TCP, and a is carried anew, on r1's
    // link.
    let lines = rig.run_until(rig.start + Duration::from_secs(10));
    let open = position(&lines, "OpenTcp { relay: \"r1\"");
    let on_link = carry(
        a,
        &Carry::PlaneLink {
            relay: "r1".to_owned(),
        },
    );
    assert!(position_from(&lines, open, &on_link) > open, "{lines:?}");

    // The links end: r1's peer goes back to the data plane's endpoint through r1 over UDP,
    // r2's has nowhere to go (its forwarder holds).
    let now = rig.now();
    rig.node.handle_tcp_closed("r1", "reset by peer", now);
    let lines = rig.drain();
    assert_eq!(lines.first(), Some(&carry(a, &plane_r1())), "{lines:?}");
    rig.node.handle_tcp_closed("r2", "reset by peer", now);
    let lines = rig.drain();
    assert_eq!(
        lines.first(),
        Some(&carry(b, &Carry::Forward(Via::Nowhere))),
        "{lines:?}"
    );
}

const PLANE_R1: &str = "plane-relays [192.0.2.1:3478]";
const PLANE_NONE: &str = "plane-relays []";

fn count(lines: &[String], line: &str) -> usize {
    lines.iter().filter(|l| *l == line).count()
}

#[test]
fn the_data_plane_is_told_its_relays_once_at_the_end_of_the_pass_that_changed_them() {
    let mut rig = Rig::new();
    // The first pass: no relay yet, and nothing to tell (the data plane starts with none).
    let lines = rig.at(rig.start);
    assert_eq!(count(&lines, PLANE_NONE), 0, "{lines:?}");

    // r1 comes with a daemon input: the pass opens its connection over UDP (it registers as
    // it answers), and the data plane hears of r1 once, after the views are published.
    let now = rig.now();
    rig.node.handle_relays(vec![relay_r1()], Vec::new(), now);
    rig.node.handle_daemon_input(now);
    let lines = rig.at(rig.now);
    assert_eq!(count(&lines, PLANE_R1), 1, "{lines:?}");
    assert!(position(&lines, "publish") < position(&lines, PLANE_R1));

    // Passes that change nothing tell nothing.
    let lines = rig.run_until(rig.start + 4 * TICK);
    assert!(
        !lines.iter().any(|l| l.starts_with("plane-relays")),
        "{lines:?}"
    );

    // r1 leaves the state: its connection closes with the next pass, and the data plane
    // hears of that once.
    let now = rig.now();
    rig.node.handle_relays(Vec::new(), Vec::new(), now);
    assert!(
        !rig.drain().iter().any(|l| l.starts_with("plane-relays")),
        "not before the pass"
    );
    rig.node.handle_daemon_input(now);
    let lines = rig.at(rig.now);
    assert_eq!(count(&lines, PLANE_NONE), 1, "{lines:?}");
    assert_eq!(count(&lines, PLANE_R1), 0, "{lines:?}");
}

#[test]
fn a_peer_no_longer_wanted_is_not_carried_when_its_relay_s_transport_changes() {
    let mut rig = Rig::with_silent_r1();
    let (gone, kept) = (public_key(&[0x50; 32]), public_key(&[0x51; 32]));
    for peer in [gone, kept] {
        set_path(&mut rig, peer, over("r1", Transport::Udp));
    }
    // Only `kept` is wanted now (the runtime dropped `gone`'s forwarder and endpoint owner).
    let now = rig.now();
    let mut wanted = peer(0x51, Vec::new());
    wanted.key = kept;
    rig.node.handle_peers(vec![wanted], now);
    rig.drain();
    // r1's transport changes: only `kept` is carried anew (before, `gone` was too, and the
    // runtime opened a forwarder and claimed an endpoint for a peer it no longer has).
    rig.node.handle_tcp_closed("r1", "reset by peer", now);
    let lines = rig.drain();
    let carried: Vec<&String> = lines.iter().filter(|l| l.starts_with("carry ")).collect();
    assert_eq!(carried, [&carry(kept, &plane_r1())], "{lines:?}");
}

/// The `carry` lines of `lines`.
fn carried(lines: &[String]) -> Vec<&String> {
    lines.iter().filter(|l| l.starts_with("carry ")).collect()
}

/// A rig whose r1 registered and relays the peer `0x50` (its home relay) through the data
/// plane's endpoint; answers the rig and the peer's key.
fn relayed_through_r1() -> (Rig, PublicKey) {
    let (mut rig, relayed) = Rig::with_peer_homed_on_r1();
    let lines = rig.at(rig.start);
    assert!(
        lines.contains(&carry(relayed.key, &plane_r1())),
        "{lines:?}"
    );
    (rig, relayed.key)
}

/// r1 says `peer` is gone (it left r1, and no other relay carries it).
fn r1_says_gone(rig: &mut Rig, peer: PublicKey) -> Vec<String> {
    let gone = rig.seal(Frame::PeerGone { dst: prefix(&peer) });
    let now = rig.now();
    rig.node
        .handle_datagram(&gone.to_datagram(), relay_udp(), now);
    rig.drain()
}

#[test]
fn a_relayed_peer_the_relay_says_is_gone_is_not_carried_anew_by_its_relay_s_change_and_comes_back_on_it()
 {
    let (mut rig, peer) = relayed_through_r1();
    // Its path ends; its forwarder stays as it is for now.
    let lines = r1_says_gone(&mut rig, peer);
    assert!(carried(&lines).is_empty(), "{lines:?}");
    assert_eq!(rig.node.paths()[0].path, Path::None);

    // r1's transport changes: the peer without a path is not carried through r1 again
    // (before, it was: the runtime opened or re-pointed a forwarder for a peer r1 said is
    // not there).
    let now = rig.now();
    rig.node.handle_tcp_closed("r1", "reset by peer", now);
    let lines = rig.drain();
    assert!(carried(&lines).is_empty(), "{lines:?}");

    // r1's "gone" expires well within the linger: the peer is carried through its home
    // relay again, and its forwarder is never released.
    let lines = rig.run_until(rig.start + FORWARDER_LINGER * 3);
    assert!(lines.contains(&carry(peer, &plane_r1())), "{lines:?}");
    assert!(!lines.iter().any(|l| l.contains("Release")), "{lines:?}");
}

#[test]
fn a_relayed_peer_without_a_path_for_the_linger_is_released_once() {
    let mut rig = Rig::with_silent_r1();
    let peer = public_key(&[0x50; 32]);
    set_path(&mut rig, peer, over("r1", Transport::Udp));
    let lines = set_path(&mut rig, peer, Path::None);
    assert!(carried(&lines).is_empty(), "{lines:?}");
    let since = rig.now;
    let lines = rig.run_until(since + FORWARDER_LINGER - TICK);
    assert!(!lines.iter().any(|l| l.contains("Release")), "{lines:?}");
    let lines = rig.run_until(since + FORWARDER_LINGER + TICK);
    assert_eq!(
        carried(&lines),
        [&carry(peer, &Carry::Release)],
        "{lines:?}"
    );
    let lines = rig.run_until(since + 3 * FORWARDER_LINGER);
    assert!(!lines.iter().any(|l| l.contains("Release")), "{lines:?}");
}

#[test]
fn a_peer_relayed_again_within_the_linger_keeps_its_forwarder() {
    let mut rig = Rig::with_silent_r1();
    let peer = public_key(&[0x50; 32]);
    set_path(&mut rig, peer, over("r1", Transport::Udp));
    set_path(&mut rig, peer, Path::None);
    rig.now += FORWARDER_LINGER / 2;
    let lines = set_path(&mut rig, peer, over("r1", Transport::Udp));
    assert_eq!(carried(&lines), [&carry(peer, &plane_r1())], "{lines:?}");
    let lines = rig.run_until(rig.now + 3 * FORWARDER_LINGER);
    assert!(!lines.iter().any(|l| l.contains("Release")), "{lines:?}");
}
