//! The relay set against relays scripted in the test: they answer a `hello` with a challenge,
//! a `register` and a `ping` sealed as a relay seals them, over UDP or TCP as each is told to;
//! time is stepped, never slept.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use base64::Engine as _;
use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::reach::relay::{Frame, FrameKey};
use plexsphere_wire::reach::{public_key, shared_secret};

use crate::reach::io::{Input, TICK};
use crate::reach::node::relays::{RELAY_IDLE, RelayOut, RelaySet};
use crate::reach::relay_client::GIVE_UP;

const RELAY_SECRET: [u8; 32] = [0x52; 32];
const NODE_SECRET: [u8; 32] = [0x4e; 32];
const SECOND: Duration = Duration::from_secs(1);

fn udp(n: u8) -> SocketAddr {
    SocketAddr::from(([192, 0, 2, n], 3478))
}

fn spec(name: &str, n: u8, with_udp: bool, with_tls: bool) -> RelaySpec {
    RelaySpec {
        name: name.to_owned(),
        public_key: base64::engine::general_purpose::STANDARD.encode(public_key(&RELAY_SECRET)),
        udp: with_udp.then(|| udp(n)),
        tls: with_tls.then(|| SocketAddr::from(([192, 0, 2, n], 443))),
        tls_server_name: with_tls.then(|| format!("{name}.relay.example")),
    }
}

fn kind(frame: &Frame) -> &'static str {
    match frame {
        Frame::Hello { .. } => "hello",
        Frame::Register { .. } => "register",
        Frame::Ping { .. } => "ping",
        Frame::Pong { .. } => "pong",
        Frame::Send { .. } => "send",
        _ => "other",
    }
}

/// The relay set and the scripted relays around it.
struct Rig {
    set: RelaySet,
    /// Relays that answer over UDP, and over TCP, by name.
    udp_alive: BTreeSet<String>,
    tcp_alive: BTreeSet<String>,
    /// The relays' sealing counter (one for all: each relay's only grows too).
    counter: u64,
    /// The last sealed `registered` a relay sent (for replays).
    last_registered: Option<Frame>,
    /// What the set asked for, in order, as short lines.
    trace: Vec<String>,
    now: Instant,
}

impl Rig {
    fn new(specs: Vec<RelaySpec>, tls_trust: bool, answer: &[&str]) -> Self {
        let mut set = RelaySet::new(NODE_SECRET, tls_trust);
        set.handle_token(b"{\"token\":1}".to_vec());
        set.handle_relays(specs);
        let alive: BTreeSet<String> = answer.iter().map(|s| (*s).to_owned()).collect();
        let mut rig = Self {
            set,
            udp_alive: alive.clone(),
            tcp_alive: alive,
            counter: 0,
            last_registered: None,
            trace: Vec::new(),
            now: Instant::now(),
        };
        rig.pump();
        rig
    }

    fn seal(&mut self, frame: Frame) -> Frame {
        self.counter += 1;
        FrameKey::new(&shared_secret(&RELAY_SECRET, &public_key(&NODE_SECRET)))
            .seal(self.counter, &frame)
    }

    fn answer(&mut self, frame: &Frame) -> Option<Frame> {
        match frame {
            Frame::Hello { .. } => Some(Frame::Challenge { cookie: [0xC0; 32] }),
            Frame::Register { .. } => {
                let sealed = self.seal(Frame::Registered { lease_secs: 60 });
                self.last_registered = Some(sealed.clone());
                Some(sealed)
            }
            Frame::Ping { nonce } => Some(self.seal(Frame::Pong { nonce: *nonce })),
            _ => None,
        }
    }

    fn name_of(&self, to: SocketAddr) -> String {
        self.set
            .relays()
            .iter()
            .find(|r| r.udp == Some(to))
            .map_or_else(|| to.to_string(), |r| r.spec.name.clone())
    }

    /// Carries out what the set asks, the live relays answering at once.
    fn pump(&mut self) {
        while let Some(out) = self.set.poll_out() {
            let line = match out {
                RelayOut::Udp { to, frame } => {
                    let name = self.name_of(to);
                    let line = format!("udp {name} {}", kind(&frame));
                    if self.udp_alive.contains(&name)
                        && let Some(a) = self.answer(&frame)
                    {
                        self.set.handle_udp_frame(a, to, self.now);
                    }
                    line
                }
                RelayOut::Tcp { relay, frame } => {
                    let line = format!("tcp {relay} {}", kind(&frame));
                    if self.tcp_alive.contains(&relay)
                        && let Some(a) = self.answer(&frame)
                    {
                        self.set.handle_tcp_frame(&relay, a, self.now);
                    }
                    line
                }
                RelayOut::OpenTcp { relay, .. } => format!("open-tcp {relay}"),
                RelayOut::CloseTcp { relay } => format!("close-tcp {relay}"),
                RelayOut::Reroute { relay } => format!("reroute {relay}"),
                RelayOut::Engine(Input::RelayUp {
                    relay, transport, ..
                }) => format!("up {relay} {transport:?}"),
                RelayOut::Engine(Input::RelayDown { relay, .. }) => format!("down {relay}"),
                RelayOut::Engine(Input::HomeRelay(home)) => {
                    format!("home {}", home.as_deref().unwrap_or("none"))
                }
                RelayOut::Engine(Input::Relays(_)) => "relays".to_owned(),
                RelayOut::Engine(other) => format!("engine {other:?}"),
                RelayOut::Recv { relay, .. } => format!("recv {relay}"),
                RelayOut::PeerGone { relay, .. } => format!("peer-gone {relay}"),
                RelayOut::Dropped => "dropped".to_owned(),
            };
            self.trace.push(line);
        }
    }

    /// Time is `t`: the set's timers run.
    fn at(&mut self, t: Instant) {
        self.now = t;
        self.set.handle_timeout(t);
        self.pump();
    }

    /// Steps time by the runtime's tick up to `until`.
    fn run_until(&mut self, until: Instant) {
        while self.now < until {
            let next = (self.now + TICK).min(until);
            self.at(next);
        }
    }

    /// The lines that are not frames: connections, engine inputs, drops.
    fn events(&self) -> Vec<&str> {
        self.trace
            .iter()
            .map(String::as_str)
            .filter(|l| !l.starts_with("udp ") && !l.starts_with("tcp "))
            .collect()
    }
}

#[test]
fn the_first_relay_registers_and_becomes_home_and_only_its_connection_opens() {
    let mut rig = Rig::new(
        vec![spec("r1", 1, true, false), spec("r2", 2, true, false)],
        false,
        &["r1", "r2"],
    );
    let t0 = rig.now;
    rig.at(t0);
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
    let mut rig = Rig::new(
        vec![spec("r1", 1, true, false), spec("r2", 2, true, false)],
        false,
        &["r1", "r2"],
    );
    let t0 = rig.now;
    rig.at(t0);
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
    assert_eq!(
        rig.events(),
        [
            "relays",
            "open-tcp r1",
            "reroute r1",
            "up r1 Tcp",
            "home r1"
        ]
    );
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
            [
                "relays",
                "open-tcp r1",
                "reroute r1",
                "up r1 Tcp",
                "home r1"
            ],
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
fn a_relay_other_than_home_closes_after_exactly_relay_idle_and_home_never() {
    let mut rig = Rig::new(
        vec![spec("r1", 1, true, false), spec("r2", 2, true, false)],
        false,
        &["r1"],
    );
    let t0 = rig.now;
    rig.at(t0);
    let t1 = t0 + SECOND;
    rig.now = t1;
    assert!(rig.set.handle_send("r2", [9; 32], b"disco".to_vec(), t1));
    assert!(
        !rig.set.handle_send("r9", [9; 32], b"disco".to_vec(), t1),
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
