//! The schedule driven as the runtime drives it: woken at its `poll_timeout`, every `Due`
//! carried out (the host's addresses answered from the test, STUN servers that answer at once
//! or stay silent); time is stepped, never slept.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytecodec::EncodeExt as _;
use stun_codec::rfc5389::Attribute;
use stun_codec::rfc5389::attributes::XorMappedAddress;
use stun_codec::rfc5389::methods::BINDING;
use stun_codec::{Message, MessageClass, MessageEncoder, TransactionId};

use crate::reach::io::{Input, TICK};
use crate::reach::node::schedule::{ADDRS_EVERY, Due, HANDSHAKES_EVERY, STUN_EVERY, Schedule};
use crate::reach::stun::{RETRY_AFTER, TRIES};
use plexsphere_test_support::seeded::SeededRng;

const PORT: u16 = 51820;
/// What every STUN server sees of this node.
const SEEN: &str = "203.0.113.7:40001";

fn stun_server(n: u8) -> SocketAddr {
    SocketAddr::from(([198, 51, 100, n], 3478))
}

fn relay_udp(n: u8) -> SocketAddr {
    SocketAddr::from(([192, 0, 2, n], 3478))
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("a test address")
}

/// A Binding success response to `request` saying the node is seen at `seen`.
fn binding_answer(request: &[u8], seen: SocketAddr) -> Vec<u8> {
    let mut id = [0u8; 12];
    id.copy_from_slice(&request[8..20]);
    let mut m = Message::<Attribute>::new(
        MessageClass::SuccessResponse,
        BINDING,
        TransactionId::new(id),
    );
    m.add_attribute(XorMappedAddress::new(seen));
    MessageEncoder::new()
        .encode_into_bytes(m)
        .expect("a response encodes")
}

/// The schedule and the host around it.
struct Rig {
    schedule: Schedule,
    start: Instant,
    now: Instant,
    /// The host's addresses, as the next read finds them.
    addrs: Vec<IpAddr>,
    /// Whether the STUN servers answer at once.
    answering: bool,
    /// STUN requests sent and not answered (to, the request).
    unanswered: Vec<(SocketAddr, Vec<u8>)>,
    /// What the schedule asked for, as "<ms> <what>" lines.
    trace: Vec<String>,
}

impl Rig {
    fn new(seed: u64, answering: bool) -> Self {
        let start = Instant::now();
        let mut schedule = Schedule::new(Box::new(SeededRng::new(seed)), start);
        // As the daemon's first `set_relays` does before the first pass.
        schedule.handle_stun_servers(vec![stun_server(1), stun_server(2)], start);
        schedule.handle_relays_changed(vec![relay_udp(1)], start);
        Self {
            schedule,
            start,
            now: start,
            addrs: vec![ip("10.0.0.2"), ip("10.0.0.1"), ip("10.0.0.2")],
            answering,
            unanswered: Vec::new(),
            trace: Vec::new(),
        }
    }

    fn ms(&self) -> u128 {
        self.now.duration_since(self.start).as_millis()
    }

    fn at(&self, d: Duration) -> Instant {
        self.start + d
    }

    /// Wakes the schedule at each of its deadlines up to `end` (included), as the runtime's
    /// loop does, and carries out what it asks.
    fn run_until(&mut self, end: Duration) {
        let end = self.at(end);
        loop {
            let at = self.schedule.poll_timeout().expect("always a deadline");
            assert!(
                at >= self.now,
                "a deadline in the past after a pass: {at:?}"
            );
            if at > end {
                break;
            }
            self.now = at;
            self.schedule.handle_timeout(at);
            self.pump();
        }
        self.now = end;
    }

    fn pump(&mut self) {
        while let Some(due) = self.schedule.poll_out() {
            let line = match due {
                Due::ReadAddrs => {
                    self.schedule
                        .handle_local_addrs(self.addrs.clone(), PORT, self.now);
                    "read-addrs".to_owned()
                }
                Due::ReadHandshakes => "read-handshakes".to_owned(),
                Due::Send { to, datagram } => {
                    if self.answering {
                        let answer = binding_answer(&datagram, SEEN.parse().expect("an address"));
                        // Answered in the same turn: the report is in `poll_out` at once.
                        self.schedule.handle_stun_datagram(&answer, to, self.now);
                    } else {
                        self.unanswered.push((to, datagram));
                    }
                    format!("stun {to}")
                }
                Due::UdpBlocked(blocked) => format!("udp-blocked {blocked}"),
                Due::Engine(Input::LocalAddrs(a)) => format!("local-addrs {a:?}"),
                Due::Engine(Input::NetworkChanged) => "network-changed".to_owned(),
                Due::Engine(Input::Reflexive { addrs, nat }) => {
                    format!("reflexive {addrs:?} {:?}", nat.mapping)
                }
                Due::Engine(other) => format!("engine {other:?}"),
                Due::Tick => "tick".to_owned(),
            };
            self.trace.push(format!("{} {line}", self.ms()));
        }
    }

    /// The times (ms) of the trace lines that are `what`.
    fn times_of(&self, what: &str) -> Vec<u128> {
        self.trace
            .iter()
            .filter_map(|l| {
                let (ms, rest) = l.split_once(' ')?;
                (rest == what).then(|| ms.parse().expect("a time"))
            })
            .collect()
    }
}

#[test]
fn the_first_pass_reads_the_addresses_and_the_handshakes_and_starts_stun() {
    let mut rig = Rig::new(1, false);
    assert_eq!(rig.schedule.poll_timeout(), Some(rig.start), "due at once");
    rig.run_until(Duration::ZERO);
    assert_eq!(
        rig.trace,
        [
            "0 read-addrs",
            "0 local-addrs [10.0.0.1:51820, 10.0.0.2:51820]",
            "0 read-handshakes",
            "0 stun 198.51.100.1:3478",
            "0 stun 198.51.100.2:3478",
            "0 stun 192.0.2.1:3478",
            "0 tick",
        ]
    );
    // The next pass one tick later, unless the probe's retry comes first.
    assert_eq!(
        rig.schedule.poll_timeout(),
        Some(rig.at(TICK.min(RETRY_AFTER)))
    );
}

#[test]
fn stun_runs_again_at_exactly_stun_every() {
    let mut rig = Rig::new(1, true);
    rig.run_until(STUN_EVERY - Duration::from_millis(1));
    assert_eq!(rig.times_of("stun 198.51.100.1:3478"), [0]);
    rig.run_until(STUN_EVERY);
    let every = STUN_EVERY.as_millis();
    assert_eq!(rig.times_of("stun 198.51.100.1:3478"), [0, every]);
    assert_eq!(rig.times_of("stun 192.0.2.1:3478"), [0, every]);
    rig.run_until(3 * STUN_EVERY);
    assert_eq!(
        rig.times_of("stun 198.51.100.1:3478"),
        [0, every, 2 * every, 3 * every]
    );
}

#[test]
fn an_address_change_is_a_network_change_and_restarts_stun_at_once() {
    let mut rig = Rig::new(1, true);
    rig.run_until(Duration::from_secs(7));
    assert!(
        rig.times_of("network-changed").is_empty(),
        "{:?}",
        rig.trace
    );
    // Found at the next read (10 s), and STUN runs in the same pass.
    rig.addrs = vec![ip("10.0.0.1"), ip("10.0.9.9")];
    rig.run_until(Duration::from_secs(20));
    assert_eq!(rig.times_of("network-changed"), [10_000]);
    assert_eq!(
        rig.times_of("local-addrs [10.0.0.1:51820, 10.0.9.9:51820]"),
        [10_000]
    );
    assert_eq!(rig.times_of("stun 198.51.100.1:3478"), [0, 10_000]);
    // The run after it is STUN_EVERY after the change.
    rig.run_until(Duration::from_secs(10) + STUN_EVERY);
    assert_eq!(
        rig.times_of("stun 198.51.100.1:3478"),
        [0, 10_000, 10_000 + STUN_EVERY.as_millis()]
    );
}

#[test]
fn a_change_of_the_relays_or_the_stun_servers_restarts_stun_at_once() {
    let mut rig = Rig::new(1, true);
    rig.run_until(Duration::from_millis(20_100));
    // The relays changed (a daemon input): the pass runs now, and STUN with it.
    let now = rig.now;
    rig.schedule.handle_relays_changed(vec![relay_udp(2)], now);
    rig.schedule.handle_daemon_input(now);
    rig.run_until(Duration::from_millis(20_100));
    assert_eq!(rig.times_of("stun 192.0.2.2:3478"), [20_100]);
    assert_eq!(rig.times_of("stun 198.51.100.1:3478"), [0, 20_100]);
    assert_eq!(rig.times_of("stun 192.0.2.1:3478"), [0], "{:?}", rig.trace);
    // The same STUN servers again: nothing new.
    rig.run_until(Duration::from_secs(30));
    let now = rig.now;
    rig.schedule
        .handle_stun_servers(vec![stun_server(1), stun_server(2)], now);
    rig.schedule.handle_daemon_input(now);
    rig.run_until(Duration::from_secs(30));
    assert_eq!(rig.times_of("stun 198.51.100.1:3478"), [0, 20_100]);
    // Other STUN servers: at once.
    rig.run_until(Duration::from_millis(40_050));
    let now = rig.now;
    rig.schedule.handle_stun_servers(vec![stun_server(3)], now);
    rig.schedule.handle_daemon_input(now);
    rig.run_until(Duration::from_millis(40_050));
    assert_eq!(rig.times_of("stun 198.51.100.3:3478"), [40_050]);
    assert_eq!(rig.times_of("stun 192.0.2.2:3478"), [20_100, 40_050]);
}

#[test]
fn the_addresses_are_read_every_5_s_and_the_handshakes_every_2_s() {
    let mut rig = Rig::new(1, true);
    rig.run_until(Duration::from_secs(20));
    assert_eq!(ADDRS_EVERY, Duration::from_secs(5));
    assert_eq!(HANDSHAKES_EVERY, Duration::from_secs(2));
    assert_eq!(
        rig.times_of("read-addrs"),
        [0, 5_000, 10_000, 15_000, 20_000]
    );
    assert_eq!(
        rig.times_of("read-handshakes"),
        (0..=10).map(|i| i * 2_000).collect::<Vec<u128>>()
    );
    // The same addresses each time: handed over once.
    assert_eq!(
        rig.times_of("local-addrs [10.0.0.1:51820, 10.0.0.2:51820]"),
        [0]
    );
    // A tick every TICK, and nothing in between.
    let ticks = rig.times_of("tick");
    assert_eq!(ticks.len(), 81);
    assert!(
        ticks.windows(2).all(|w| w[1] - w[0] == TICK.as_millis()),
        "{ticks:?}"
    );
}

#[test]
fn a_daemon_input_makes_the_next_pass_due_now() {
    let mut rig = Rig::new(1, true);
    rig.run_until(Duration::from_millis(100));
    assert_eq!(rig.schedule.poll_timeout(), Some(rig.at(TICK)));
    let now = rig.now;
    rig.schedule.handle_daemon_input(now);
    assert_eq!(rig.schedule.poll_timeout(), Some(now));
    rig.run_until(Duration::from_millis(100));
    assert_eq!(rig.times_of("tick"), [0, 100]);
    // The tick after it is TICK later.
    assert_eq!(
        rig.schedule.poll_timeout(),
        Some(now + TICK),
        "{:?}",
        rig.trace
    );
}

#[test]
fn a_finished_probe_is_handled_when_its_last_answer_arrives() {
    let mut rig = Rig::new(1, false);
    rig.run_until(Duration::ZERO);
    let asked = std::mem::take(&mut rig.unanswered);
    assert_eq!(asked.len(), 3);
    let seen: SocketAddr = SEEN.parse().expect("an address");
    for (i, (server, request)) in asked.iter().enumerate() {
        rig.now = rig.at(Duration::from_millis(30 + 10 * i as u64));
        let now = rig.now;
        rig.schedule
            .handle_stun_datagram(&binding_answer(request, seen), *server, now);
        rig.pump();
    }
    // Before any tick: the report at the last answer (50 ms), not at the next pass.
    assert_eq!(rig.times_of("udp-blocked false"), [50]);
    assert_eq!(
        rig.times_of("reflexive [203.0.113.7:40001] EndpointIndependent"),
        [50]
    );
    assert_eq!(rig.times_of("tick"), [0]);
    // The probe's retries no longer wake anything.
    assert_eq!(rig.schedule.poll_timeout(), Some(rig.at(TICK)));
    // An answer from a server nobody asked, or a repeated one, is no report.
    let (server, request) = &asked[0];
    let now = rig.now;
    rig.schedule
        .handle_stun_datagram(&binding_answer(request, seen), *server, now);
    rig.pump();
    assert_eq!(rig.times_of("udp-blocked false"), [50]);
}

#[test]
fn a_silent_probe_retries_and_gives_up_at_its_deadlines_and_says_udp_is_blocked() {
    let mut rig = Rig::new(1, false);
    let give_up = RETRY_AFTER * TRIES;
    rig.run_until(give_up - Duration::from_millis(1));
    let retry = RETRY_AFTER.as_millis();
    assert_eq!(
        rig.times_of("stun 198.51.100.1:3478"),
        [0, retry, 2 * retry]
    );
    assert!(rig.times_of("udp-blocked true").is_empty());
    rig.run_until(give_up);
    assert_eq!(rig.times_of("udp-blocked true"), [give_up.as_millis()]);
    assert_eq!(rig.times_of("reflexive [] Unknown"), [give_up.as_millis()]);
}

#[test]
fn the_stun_ids_come_from_the_random_source_given() {
    let requests = |seed: u64| {
        let mut rig = Rig::new(seed, false);
        rig.run_until(Duration::ZERO);
        rig.unanswered
    };
    assert_eq!(requests(7), requests(7));
    assert_ne!(requests(7), requests(8));
}
