//! The relay set against relays scripted in the test (`rig.rs`): they answer a `hello` with a
//! challenge, a `register` and a `ping` sealed as a relay seals them, over UDP or TCP as each is
//! told to; time is stepped, never slept.

use std::time::Duration;

use plexsphere_wire::key::PublicKey;
use plexsphere_wire::reach::relay::Frame;

use crate::reach::io::TICK;
use crate::reach::node::relays::{RELAY_IDLE, RelaySet};
use crate::reach::relay_client::GIVE_UP;

use super::rig::*;

/// What a relay reached over TCP with TLS says, in order, from the start.
const UP_OVER_TCP: [&str; 5] = [
    "relays",
    "open-tcp r1",
    "reroute r1",
    "up r1 Tcp",
    "home r1",
];

#[test]
fn the_first_relay_registers_and_becomes_home_and_only_its_connection_opens() {
    let (rig, _) = Rig::two_udp_relays(&["r1", "r2"]);
    assert_eq!(rig.events(), ["relays", "up r1 Udp", "home r1"]);
    assert_eq!(rig.set.connections(), ["r1"]);
    assert!(
        !rig.trace.iter().any(|l| l.contains("r2")),
        "{:?}",
        rig.trace
    );
    assert_eq!(rig.set.plane_relays(), [udp(1)]);
}

#[test]
fn when_the_home_relay_goes_down_the_next_one_is_home_after_home_relay_none() {
    let (mut rig, t0) = Rig::two_udp_relays(&["r1", "r2"]);
    rig.udp_alive.remove("r1");
    rig.run_until(t0 + 15 * SECOND);
    assert_eq!(
        rig.events(),
        [
            "relays",
            "up r1 Udp",
            "home r1",
            "down r1",
            "home none",
            "up r2 Udp",
            "home r2"
        ]
    );
}

#[test]
fn a_relay_unanswered_over_udp_for_give_up_moves_to_tcp_before_any_relay_down() {
    let mut rig = Rig::new(vec![spec("r1", 1, true, true)], true, &[]);
    rig.tcp_alive.insert("r1".to_owned());
    let t0 = rig.now;
    rig.at(t0);
    rig.run_until(t0 + GIVE_UP - TICK);
    assert!(!rig.events().contains(&"open-tcp r1"), "{:?}", rig.trace);
    rig.run_until(t0 + GIVE_UP);
    assert_eq!(rig.events(), ["relays", "open-tcp r1", "reroute r1"]);
    rig.run_until(t0 + GIVE_UP + TICK);
    assert_eq!(rig.events(), UP_OVER_TCP);
    assert!(rig.set.is_over_tcp("r1"));
    assert!(
        rig.set.plane_relays().is_empty(),
        "over TCP: not the data plane's"
    );
}

#[test]
fn udp_blocked_or_no_udp_address_starts_over_tcp() {
    for (blocked, with_udp) in [(true, true), (false, false)] {
        let mut rig = Rig::new(vec![spec("r1", 1, with_udp, true)], true, &["r1"]);
        rig.set.handle_udp_blocked(blocked);
        let t0 = rig.now;
        rig.at(t0);
        rig.run_until(t0 + TICK);
        assert_eq!(
            rig.events(),
            UP_OVER_TCP,
            "blocked {blocked}, UDP address {with_udp}"
        );
        assert!(
            !rig.trace.iter().any(|l| l.starts_with("udp ")),
            "nothing over UDP: {:?}",
            rig.trace
        );
    }
}

#[test]
fn a_relay_that_answers_its_keepalives_still_closes_when_nothing_is_relayed_through_it() {
    // Pings, pongs and re-registrations keep a connection alive; they are not use. Before,
    // every authentic answer counted as use, so a relay other than home that answered its
    // keepalives was never closed.
    let (mut rig, t0) = Rig::two_udp_relays(&["r1", "r2"]);
    let t1 = t0 + SECOND;
    rig.now = t1;
    assert!(
        rig.set
            .handle_send("r2", PublicKey([9; 32]), b"disco".to_vec(), t1)
    );
    rig.pump();
    rig.run_until(t1 + RELAY_IDLE - TICK);
    assert_eq!(rig.set.connections(), ["r1", "r2"], "not before");
    let pings = rig.trace.iter().filter(|l| *l == "udp r2 ping").count();
    assert!(pings >= 20, "r2 was kept alive meanwhile: {pings} pings");
    assert_eq!(
        rig.events()
            .iter()
            .filter(|l| l.starts_with("down r2"))
            .count(),
        0,
        "and answered them: {:?}",
        rig.events()
    );
    rig.at(t1 + RELAY_IDLE);
    assert_eq!(
        rig.set.connections(),
        ["r1"],
        "closed at exactly RELAY_IDLE"
    );
}

#[test]
fn a_relay_other_than_home_closes_after_exactly_relay_idle_and_home_never() {
    let (mut rig, t0) = Rig::two_udp_relays(&["r1"]);
    let t1 = t0 + SECOND;
    rig.now = t1;
    assert!(
        rig.set
            .handle_send("r2", PublicKey([9; 32]), b"disco".to_vec(), t1)
    );
    assert!(
        !rig.set
            .handle_send("r9", PublicKey([9; 32]), b"disco".to_vec(), t1),
        "no such relay"
    );
    rig.pump();
    assert_eq!(rig.set.connections(), ["r1", "r2"]);
    rig.run_until(t1 + RELAY_IDLE - TICK);
    rig.at(t1 + RELAY_IDLE - Duration::from_millis(1));
    assert_eq!(rig.set.connections(), ["r1", "r2"], "not before");
    rig.at(t1 + RELAY_IDLE);
    assert_eq!(rig.set.connections(), ["r1"], "at exactly RELAY_IDLE");
    rig.run_until(t0 + 4 * RELAY_IDLE);
    assert_eq!(rig.set.connections(), ["r1"], "home stays");
    assert_eq!(
        rig.events()
            .iter()
            .filter(|l| l.starts_with("up r1"))
            .count(),
        1,
        "and stays up: {:?}",
        rig.events()
    );
}

#[test]
fn a_udp_frame_for_a_connection_over_tcp_is_dropped_and_counted() {
    let mut rig = Rig::new(vec![spec("r1", 1, true, true)], true, &["r1"]);
    rig.set.handle_udp_blocked(true);
    let t0 = rig.now;
    rig.at(t0);
    rig.run_until(t0 + TICK);
    assert!(rig.events().contains(&"up r1 Tcp"));
    let pong = rig.seal(Frame::Pong { nonce: [1; 8] });
    rig.set.handle_udp_frame(pong, udp(1), rig.now);
    rig.pump();
    assert_eq!(rig.set.udp_for_tcp, 1);
    assert_eq!(rig.events().last(), Some(&"dropped"));
}

#[test]
fn a_new_connection_after_a_tcp_close_resumes_the_replay_floor() {
    let mut rig = Rig::new(vec![spec("r1", 1, false, true)], true, &["r1"]);
    let t0 = rig.now;
    rig.at(t0);
    rig.run_until(t0 + TICK);
    assert!(rig.events().contains(&"up r1 Tcp"), "{:?}", rig.trace);
    let replay = rig.last_registered.clone().expect("registered once");

    let t = rig.now + SECOND;
    rig.now = t;
    rig.set.handle_tcp_closed("r1", "reset by peer", t);
    rig.pump();
    assert_eq!(&rig.events()[5..], ["reroute r1", "down r1", "home none"]);

    // The path asks for TCP again: a new connection, which must not take the old answer.
    rig.tcp_alive.clear();
    assert!(
        rig.set
            .handle_path("r1", crate::reach::io::Transport::Tcp, t)
    );
    rig.pump();
    rig.run_until(t + TICK);
    assert!(
        rig.trace.last().is_some_and(|l| l == "tcp r1 hello"),
        "{:?}",
        rig.trace
    );
    rig.set
        .handle_tcp_frame("r1", Frame::Challenge { cookie: [0xC0; 32] }, rig.now);
    rig.pump();
    rig.set.handle_tcp_frame("r1", replay, rig.now);
    rig.pump();
    assert_eq!(
        rig.events().iter().filter(|l| l.starts_with("up ")).count(),
        1,
        "the replayed answer does not bring it up: {:?}",
        rig.events()
    );
    let fresh = rig.seal(Frame::Registered { lease_secs: 60 });
    rig.set.handle_tcp_frame("r1", fresh, rig.now);
    rig.pump();
    assert_eq!(rig.events().last(), Some(&"home r1"));
    assert!(rig.events().contains(&"up r1 Tcp"));
}

#[test]
fn a_relay_with_neither_address_is_skipped_with_a_single_warning() {
    let (relays, text) = crate::reach::journal::capture(tracing::Level::WARN, || {
        // Neither address; and a TLS address on a node without TLS trust.
        let specs = vec![spec("a", 1, false, false), spec("b", 2, false, true)];
        let mut set = RelaySet::new(NODE_SECRET, false);
        assert!(
            !set.handle_relays(specs.clone()),
            "nothing usable: no change"
        );
        set.handle_relays(specs);
        set.relays().len()
    });
    assert_eq!(relays, 0);
    assert_eq!(
        text.matches("has no UDP address").count(),
        1,
        "one warning: {text}"
    );
}
