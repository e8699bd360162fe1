//! The relay set's rig: relays scripted in the test answer a `hello` with a challenge, a
//! `register` and a `ping` sealed as a relay seals them, over UDP or TCP as each is told to;
//! time is stepped, never slept.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::reach::relay::{Frame, FrameKey};
use plexsphere_wire::reach::{public_key, shared_secret};

use crate::reach::io::{Input, TICK};
use crate::reach::node::relays::{RelayOut, RelaySet};

pub(super) const RELAY_SECRET: [u8; 32] = [0x52; 32];
pub(super) const NODE_SECRET: [u8; 32] = [0x4e; 32];
pub(super) const SECOND: Duration = Duration::from_secs(1);

pub(super) fn udp(n: u8) -> SocketAddr {
    SocketAddr::from(([192, 0, 2, n], 3478))
}

pub(super) fn spec(name: &str, n: u8, with_udp: bool, with_tls: bool) -> RelaySpec {
    RelaySpec {
        name: name.to_owned(),
        public_key: public_key(&RELAY_SECRET).to_base64(),
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
pub(super) struct Rig {
    pub(super) set: RelaySet,
    /// Relays that answer over UDP, and over TCP, by name.
    pub(super) udp_alive: BTreeSet<String>,
    pub(super) tcp_alive: BTreeSet<String>,
    /// The relays' sealing counter (one for all: each relay's only grows too).
    pub(super) counter: u64,
    /// The last sealed `registered` a relay sent (for replays).
    pub(super) last_registered: Option<Frame>,
    /// What the set asked for, in order, as short lines.
    pub(super) trace: Vec<String>,
    pub(super) now: Instant,
}

impl Rig {
    pub(super) fn new(specs: Vec<RelaySpec>, tls_trust: bool, answer: &[&str]) -> Self {
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

    pub(super) fn seal(&mut self, frame: Frame) -> Frame {
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
    pub(super) fn pump(&mut self) {
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

    /// Relays r1 and r2 over UDP (no TLS), those in `answer` answering, after the first
    /// timeout at the start; with that start.
    pub(super) fn two_udp_relays(answer: &[&str]) -> (Self, Instant) {
        let mut rig = Self::new(
            vec![spec("r1", 1, true, false), spec("r2", 2, true, false)],
            false,
            answer,
        );
        let t0 = rig.now;
        rig.at(t0);
        (rig, t0)
    }

    /// Time is `t`: the set's timers run.
    pub(super) fn at(&mut self, t: Instant) {
        self.now = t;
        self.set.handle_timeout(t);
        self.pump();
    }

    /// Steps time by the runtime's tick up to `until`.
    pub(super) fn run_until(&mut self, until: Instant) {
        while self.now < until {
            let next = (self.now + TICK).min(until);
            self.at(next);
        }
    }

    /// The lines that are not frames: connections, engine inputs, drops.
    pub(super) fn events(&self) -> Vec<&str> {
        self.trace
            .iter()
            .map(String::as_str)
            .filter(|l| !l.starts_with("udp ") && !l.starts_with("tcp "))
            .collect()
    }
}
