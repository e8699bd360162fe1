//! The node's own decisions, across its machines: the one deadline, which machine is due
//! outside a pass, a change of the relays or STUN servers, a key rotation. Driven as the
//! runtime drives it, with a stepped clock.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use plexsphere_wire::reach::public_key;

use super::base::{PORT, node_with_token, now_at, relay};
use crate::reach::io::{Input, Now, PeerReach, TICK};
use crate::reach::node::Node;
use crate::reach::node::relays::RelayOut;
use crate::reach::node::schedule::Due;

fn stun_server() -> SocketAddr {
    SocketAddr::from(([198, 51, 100, 1], 3478))
}

fn addrs() -> Vec<IpAddr> {
    vec!["10.0.0.1".parse().expect("an address")]
}

/// The node and a clock.
struct Rig {
    node: Node,
    start: Instant,
    now: Instant,
}

impl Rig {
    fn new() -> Self {
        let start = Instant::now();
        let node = node_with_token(start);
        Self {
            node,
            start,
            now: start,
        }
    }

    fn now(&self) -> Now {
        now_at(self.now)
    }

    fn input(&mut self, input: Input) {
        let now = self.now();
        self.node.engine.handle(input, now);
        while self.node.engine.poll_effect().is_some() {}
    }

    /// The relay set's outputs, as short lines (engine inputs handed to the engine).
    fn relay_outs(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        while let Some(out) = self.node.relays.poll_out() {
            lines.push(match out {
                RelayOut::Udp { to, .. } => format!("udp {to}"),
                RelayOut::Engine(input) => {
                    let line = match &input {
                        Input::Relays(specs) => format!("relays {}", specs.len()),
                        other => format!("engine {other:?}"),
                    };
                    self.input(input);
                    line
                }
                other => format!("{other:?}"),
            });
        }
        lines
    }

    /// Wakes the node's schedule at each of its deadlines up to `end`, as the runtime does.
    fn run_until(&mut self, end: Instant) -> Vec<String> {
        let mut lines = Vec::new();
        while let Some(at) = self.node.schedule.poll_timeout().filter(|at| *at <= end) {
            self.now = at;
            lines.extend(self.pass());
        }
        self.now = end;
        lines
    }

    /// A pass at `now` (when one is due), carried out as the runtime does: what the schedule
    /// asked for, as short lines.
    fn pass(&mut self) -> Vec<String> {
        self.node.schedule.handle_timeout(self.now);
        let mut lines = Vec::new();
        while let Some(due) = self.node.schedule.poll_out() {
            lines.push(match due {
                Due::ReadAddrs => {
                    let now = self.now;
                    self.node.schedule.handle_local_addrs(addrs(), PORT, now);
                    "read-addrs".to_owned()
                }
                Due::ReadHandshakes => "read-handshakes".to_owned(),
                Due::Send { to, .. } => format!("stun {to}"),
                Due::UdpBlocked(b) => format!("udp-blocked {b}"),
                Due::Engine(input) => {
                    let line = match &input {
                        Input::LocalAddrs(a) => format!("local-addrs {a:?}"),
                        other => format!("engine {other:?}"),
                    };
                    self.input(input);
                    line
                }
                Due::Tick => {
                    let now = self.now;
                    self.node.relays.handle_timeout(now);
                    self.relay_outs();
                    self.input(Input::Tick);
                    "tick".to_owned()
                }
            });
        }
        lines
    }
}

#[test]
fn the_node_sleeps_until_the_earliest_deadline_of_its_machines() {
    let mut rig = Rig::new();
    // The first pass is due at once.
    assert_eq!(rig.node.poll_timeout(), Some(rig.start));
    rig.node
        .set_relays(vec![relay("r1", 1)], vec![stun_server()], rig.start);
    rig.relay_outs();
    assert!(rig.pass().contains(&"tick".to_owned()));
    // The home relay's connection said hello and waits for its answer; the next pass comes
    // first.
    let relay_due = rig.node.relays.poll_timeout().expect("a hello waits");
    assert!(relay_due > rig.start + TICK, "{relay_due:?}");
    assert_eq!(rig.node.poll_timeout(), Some(rig.start + TICK));
    assert!(!rig.node.relays_due(relay_due - Duration::from_millis(1)));
    assert!(rig.node.relays_due(relay_due));
    // No punch timed: the engine is never due on its own.
    assert!(!rig.node.engine_due(relay_due));
    // A daemon input: at once, whatever else waits.
    rig.now = rig.start + Duration::from_millis(100);
    rig.node.schedule.handle_daemon_input(rig.now);
    assert_eq!(rig.node.poll_timeout(), Some(rig.now));
}

#[test]
fn a_change_of_the_relays_or_the_stun_servers_starts_stun_with_the_next_pass() {
    let mut rig = Rig::new();
    rig.node
        .set_relays(vec![relay("r1", 1)], vec![stun_server()], rig.start);
    assert_eq!(rig.relay_outs(), ["relays 1"]);
    let first = rig.pass();
    assert!(
        first.contains(&"stun 198.51.100.1:3478".to_owned()),
        "{first:?}"
    );
    assert!(
        first.contains(&"stun 192.0.2.1:3478".to_owned()),
        "{first:?}"
    );
    // The run ends (nobody answers: it gives up after its retries).
    let lines = rig.run_until(rig.start + Duration::from_secs(3));
    assert!(lines.contains(&"udp-blocked true".to_owned()), "{lines:?}");
    // The same relays and servers: nothing new, and the next pass starts no run.
    let now = rig.now;
    rig.node
        .set_relays(vec![relay("r1", 1)], vec![stun_server()], now);
    assert!(rig.relay_outs().is_empty());
    rig.node.schedule.handle_daemon_input(now);
    assert!(
        !rig.pass().iter().any(|l| l.starts_with("stun ")),
        "no STUN run for the same relays"
    );
    // Another relay: the engine gets the relays and the next pass asks it too.
    rig.now = rig.start + Duration::from_secs(4);
    let now = rig.now;
    rig.node.set_relays(
        vec![relay("r1", 1), relay("r2", 2)],
        vec![stun_server()],
        now,
    );
    assert_eq!(rig.relay_outs(), ["relays 2"]);
    rig.node.schedule.handle_daemon_input(now);
    let lines = rig.pass();
    for server in ["198.51.100.1:3478", "192.0.2.1:3478", "192.0.2.2:3478"] {
        assert!(lines.contains(&format!("stun {server}")), "{lines:?}");
    }
}

#[test]
fn a_key_rotation_starts_the_engine_over_registers_again_and_hands_over_the_addresses_again() {
    let mut rig = Rig::new();
    rig.node
        .set_relays(vec![relay("r1", 1)], vec![stun_server()], rig.start);
    rig.relay_outs();
    rig.input(Input::Peers(vec![PeerReach {
        key: public_key(&[0x50; 32]),
        node_id: uuid::Uuid::from_u128(2),
        hostname: "peer".into(),
        endpoints: vec![],
        home_relay: None,
        routes: Vec::new(),
    }]));
    assert_eq!(
        rig.pass()[..2],
        ["read-addrs", "local-addrs [10.0.0.1:51820]"]
    );
    assert_eq!(rig.node.engine.paths().len(), 1);
    assert!(rig.node.relays.connections() == ["r1"]);

    rig.now = rig.start + Duration::from_millis(1_100);
    let now = rig.now;
    rig.node.rekey([0x61; 32], now);
    // A new engine (it knows no peer until the runtime hands them over again), no
    // connection until the next pass, and the relays for the new engine.
    assert!(rig.node.engine.paths().is_empty());
    assert!(rig.node.relays.connections().is_empty());
    assert_eq!(rig.relay_outs(), ["relays 1"]);
    // The next pass (the rotation is a daemon input) reads the addresses at once, hands the
    // same ones to the new engine, and connects to the home relay again.
    rig.node.schedule.handle_daemon_input(now);
    let lines = rig.pass();
    assert_eq!(lines[..2], ["read-addrs", "local-addrs [10.0.0.1:51820]"]);
    assert!(
        !lines.contains(&"engine NetworkChanged".to_owned()),
        "{lines:?}"
    );
    assert!(rig.node.relays.connections() == ["r1"]);
}
