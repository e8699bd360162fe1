//! The routing the node owns between its machines, seen only through its inputs and its one
//! output queue (as the runtime sees it), with the scripted relay of `scripted.rs`.

use std::net::SocketAddr;
use std::time::Duration;

use plexsphere_wire::key::PublicKey;
use plexsphere_wire::reach::public_key;
use plexsphere_wire::reach::relay::{Frame, prefix};

use super::scripted::{Rig, peer, position, position_from, relay_r1, relay_udp, short};
use crate::reach::engine::PROBE_INTERVAL;
use crate::reach::io::{Effect, Path, TICK, Transport};
use crate::reach::node::{Carry, OUT_QUEUE};

#[test]
fn a_daemon_input_gives_a_pass_at_once_whose_tick_reaches_the_relays_and_the_engine() {
    let mut rig = Rig::new();
    let first = rig.at(rig.start);
    assert!(position(&first, "read-addrs") < position(&first, "read-handshakes"));
    assert_eq!(first.last().map(String::as_str), Some("publish 0"));

    // A daemon input (the relays) off the pass's grid: the pass runs now, not at the next
    // tick, and its tick opens the home relay's connection (after STUN asked the new relay).
    rig.now = rig.start + Duration::from_millis(100);
    let now = rig.now();
    rig.node.handle_relays(vec![relay_r1()], Vec::new(), now);
    assert!(rig.drain().is_empty());
    assert_eq!(rig.node.poll_timeout(), Some(rig.start + TICK));
    rig.node.handle_daemon_input(now);
    assert_eq!(rig.node.poll_timeout(), Some(rig.now));
    let pass = rig.at(rig.now);
    let publish = position(&pass, "publish 0");
    assert!(
        position(&pass, "send 192.0.2.1:3478") < position(&pass, "relay-udp 192.0.2.1:3478 hello")
            && position(&pass, "relay-udp 192.0.2.1:3478 hello") < publish,
        "{pass:?}"
    );
    // r1 registered (after the pass, as it answered).
    assert!(position_from(&pass, publish, "candidates home=r1") > publish);

    // The STUN run gives up (nothing answers it) and the engine probes anew with what it
    // said; then a peer, handed over with no daemon input (no pass): the engine probes it at
    // once through r1, and its next probe round is due PROBE_INTERVAL later, between two
    // passes.
    rig.run_until(rig.start + Duration::from_secs(4));
    rig.now = rig.start + Duration::from_millis(4_150);
    let now = rig.now();
    rig.node.handle_peers(vec![peer(0x50, Vec::new())], now);
    let round = "relay-udp 192.0.2.1:3478 send";
    let lines = rig.drain();
    assert!(lines.iter().any(|l| l == round), "{lines:?}");
    let due = rig.now + PROBE_INTERVAL;
    let lines = rig.run_until(due + Duration::from_millis(10));
    assert!(
        !lines.iter().any(|l| l == round),
        "no probe round before it is due: {lines:?}"
    );
    let next = rig.node.poll_timeout().expect("a next pass");
    assert!(next > rig.now, "{next:?}");

    // Another daemon input (a token): the pass runs now, and its tick reaches the engine,
    // whose probe round is due, before the views are published (the new token makes r1's
    // connection register again after that).
    rig.node.handle_token(b"{\"token\":2}".to_vec());
    assert!(!rig.node.schedule.pass_due(rig.now));
    let now = rig.now();
    rig.node.handle_daemon_input(now);
    assert!(rig.node.schedule.pass_due(rig.now));
    assert!(rig.node.poll_timeout() <= Some(rig.now));
    let pass = rig.at(rig.now);
    assert!(
        position(&pass, round) < position(&pass, "publish 1"),
        "{pass:?}"
    );
}

#[test]
fn an_engine_send_relayed_to_a_known_relay_is_a_relay_frame_and_to_an_unknown_one_nothing() {
    let mut rig = Rig::with_silent_r1();
    let now = rig.now();
    let dst = public_key(&[0x50; 32]);
    rig.node.handle_effect(
        Effect::SendRelayed {
            relay: "r9".to_owned(),
            dst,
            datagram: vec![1, 2, 3],
        },
        now,
    );
    assert!(rig.drain().is_empty(), "no relay r9: nothing to send");
    assert!(rig.node.relays.connections().is_empty());
    rig.node.handle_effect(
        Effect::SendRelayed {
            relay: "r1".to_owned(),
            dst,
            datagram: vec![1, 2, 3],
        },
        now,
    );
    // The connection opens on demand; once r1 answers, the datagram goes to it over UDP.
    assert!(rig.drain().is_empty());
    assert_eq!(rig.node.relays.connections(), ["r1"]);
    rig.relay_alive = true;
    let lines = rig.run_until(rig.now + Duration::from_secs(1));
    let register = position(&lines, "relay-udp 192.0.2.1:3478 register");
    assert!(
        position_from(&lines, register, "relay-udp 192.0.2.1:3478 send") > register,
        "{lines:?}"
    );
}

#[test]
fn a_relays_up_reaches_the_engine_and_a_relayed_datagram_its_sender_without_the_runtime() {
    let mut rig = Rig::new();
    let known = peer(0x50, Vec::new());
    // Two peers whose keys share a prefix would name neither; one does not.
    rig.node.handle_peers(vec![known.clone()], rig.now());
    let wireguard = vec![4, 0, 0, 0, 9, 9, 9, 9];
    rig.relay_sends.push(Frame::Recv {
        src: prefix(&known.key),
        payload: wireguard.clone(),
    });
    rig.relay_sends.push(Frame::Recv {
        src: prefix(&public_key(&[0x51; 32])),
        payload: wireguard,
    });
    let now = rig.now();
    rig.node.handle_relays(vec![relay_r1()], Vec::new(), now);
    let lines = rig.at(rig.start);
    // r1 registers: the engine hears RelayUp (its relays changed: new candidates) and then
    // that r1 is home; the relayed datagrams reach their sender, or are dropped.
    let register = position(&lines, "relay-udp 192.0.2.1:3478 register");
    let up = position_from(&lines, register, "candidates home=none");
    let home = position_from(&lines, register, "candidates home=r1");
    let recv = position_from(&lines, register, &format!("recv {}", short(&known.key)));
    let dropped = position_from(&lines, register, "Dropped");
    assert!(
        register < up && up < home && home < recv && recv < dropped,
        "{lines:?}"
    );
    assert_eq!(
        rig.node.engine.own_candidates().home_relay.as_deref(),
        Some("r1")
    );
}

#[test]
fn a_relay_path_opens_its_connection_before_it_is_carried_and_one_to_an_unknown_relay_is_ignored() {
    let mut rig = Rig::with_silent_r1();
    let now = rig.now();
    let peer = public_key(&[0x50; 32]);
    let path = |relay: &str| Path::Relay {
        relay: relay.to_owned(),
        transport: Transport::Udp,
    };
    rig.node.handle_effect(
        Effect::SetPath {
            peer,
            path: path("r9"),
        },
        now,
    );
    assert!(rig.drain().is_empty(), "a path through no relay is ignored");
    assert!(rig.node.relays.connections().is_empty());
    rig.node.handle_effect(
        Effect::SetPath {
            peer,
            path: path("r1"),
        },
        now,
    );
    assert_eq!(
        rig.drain(),
        [format!(
            "carry {} {:?}",
            short(&peer),
            Carry::PlaneRelay {
                relay: "r1".to_owned(),
                udp: relay_udp(),
            }
        )]
    );
    assert_eq!(rig.node.relays.connections(), ["r1"]);
}

#[test]
fn a_relayed_datagram_from_a_key_prefix_two_peers_share_reaches_neither() {
    let mut rig = Rig::new();
    // Two wanted peers whose keys start alike (a relay names a sender by 8 bytes).
    let mut first = peer(0x50, Vec::new());
    let mut second = peer(0x51, Vec::new());
    first.key = PublicKey([0x70; 32]);
    let mut bytes = [0x70; 32];
    bytes[31] = 0x71;
    second.key = PublicKey(bytes);
    rig.node
        .handle_peers(vec![first.clone(), second], rig.now());
    rig.relay_sends.push(Frame::Recv {
        src: prefix(&first.key),
        payload: vec![4, 0, 0, 0, 9, 9, 9, 9],
    });
    let now = rig.now();
    rig.node.handle_relays(vec![relay_r1()], Vec::new(), now);
    let lines = rig.at(rig.start);
    let register = position(&lines, "relay-udp 192.0.2.1:3478 register");
    assert!(position_from(&lines, register, "Dropped") > register);
    assert!(!lines.iter().any(|l| l.starts_with("recv ")), "{lines:?}");
}

#[test]
fn an_undrained_node_holds_at_most_out_queue_outputs_and_counts_the_rest() {
    let mut rig = Rig::new();
    let now = rig.now();
    let from = SocketAddr::from(([198, 51, 100, 9], 4000));
    // Each unknown datagram is one output (dropped, counted by the runtime).
    for _ in 0..OUT_QUEUE + 3 {
        rig.node.handle_datagram(&[0xEE; 8], from, now);
    }
    assert_eq!(rig.node.out_dropped(), 3);
    let mut held = 0;
    while rig.node.poll_out().is_some() {
        held += 1;
    }
    assert_eq!(held, OUT_QUEUE);
}
