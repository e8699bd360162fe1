//! The rig of the tests that see the node only through its inputs and its one output queue
//! (as the runtime sees it; `routing.rs`, `rekey.rs`): a scripted relay r1 answers over UDP
//! as a relay seals, the reads the node asks for are answered on the spot, and time is
//! stepped, never slept.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use plexsphere_wire::key::PublicKey;
use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::reach::relay::{Frame, FrameKey};
use plexsphere_wire::reach::{public_key, shared_secret};

use super::base::{NODE_SECRET, PORT, RELAY_SECRET, node_with_token, now_at, relay};
use crate::reach::io::{Now, PeerReach};
use crate::reach::node::{Node, NodeOut};

pub(super) fn relay_udp() -> SocketAddr {
    SocketAddr::from(([192, 0, 2, 1], 3478))
}

pub(super) fn relay_r1() -> RelaySpec {
    relay("r1", 1)
}

pub(super) fn peer(secret: u8, endpoints: Vec<SocketAddr>) -> PeerReach {
    PeerReach {
        key: public_key(&[secret; 32]),
        node_id: uuid::Uuid::from_u128(u128::from(secret)),
        hostname: format!("peer{secret}"),
        endpoints,
        home_relay: None,
        routes: Vec::new(),
    }
}

pub(super) fn frame_kind(frame: &Frame) -> &'static str {
    match frame {
        Frame::Hello { .. } => "hello",
        Frame::Register { .. } => "register",
        Frame::Ping { .. } => "ping",
        Frame::Send { .. } => "send",
        _ => "other",
    }
}

/// The node, a relay r1 that answers over UDP while `relay_alive`, and a stepped clock.
pub(super) struct Rig {
    pub(super) node: Node,
    pub(super) start: Instant,
    pub(super) now: Instant,
    pub(super) relay_alive: bool,
    pub(super) relay_counter: u64,
    /// The node's WireGuard key as r1 knows it (r1 seals for it; a key rotation changes it).
    pub(super) node_secret: [u8; 32],
    /// The node keys r1 was greeted with, in order.
    pub(super) hellos: Vec<PublicKey>,
    /// Frames r1 sends right after the node registered (relayed datagrams).
    pub(super) relay_sends: Vec<Frame>,
}

impl Rig {
    pub(super) fn new() -> Self {
        let start = Instant::now();
        let node = node_with_token(start);
        Self {
            node,
            start,
            now: start,
            relay_alive: true,
            relay_counter: 0,
            node_secret: NODE_SECRET,
            hellos: Vec::new(),
            relay_sends: Vec::new(),
        }
    }

    pub(super) fn now(&self) -> Now {
        now_at(self.now)
    }

    /// The node told of relay r1 (which answers) and of peer `0x50`, whose home relay r1 is;
    /// nothing ran yet.
    pub(super) fn with_peer_homed_on_r1() -> (Self, PeerReach) {
        let mut rig = Self::new();
        let mut homed = peer(0x50, Vec::new());
        homed.home_relay = Some("r1".to_owned());
        let now = rig.now();
        rig.node.handle_peers(vec![homed.clone()], now);
        rig.node.handle_relays(vec![relay_r1()], Vec::new(), now);
        (rig, homed)
    }

    /// The node told of relay r1, which does not answer yet, at the start.
    pub(super) fn with_silent_r1() -> Self {
        let mut rig = Self::new();
        rig.relay_alive = false;
        rig.at(rig.start);
        let now = rig.now();
        rig.node.handle_relays(vec![relay_r1()], Vec::new(), now);
        rig.drain();
        rig
    }

    pub(super) fn seal(&mut self, frame: Frame) -> Frame {
        self.relay_counter += 1;
        FrameKey::new(&shared_secret(
            &RELAY_SECRET,
            &public_key(&self.node_secret),
        ))
        .seal(self.relay_counter, &frame)
    }

    /// What r1 answers to a frame the node sent it.
    pub(super) fn answer(&mut self, frame: &Frame) -> Vec<Frame> {
        match frame {
            Frame::Hello { node } => {
                self.hellos.push(*node);
                vec![Frame::Challenge { cookie: [0xC0; 32] }]
            }
            Frame::Register { .. } => {
                let mut answers = vec![self.seal(Frame::Registered { lease_secs: 60 })];
                // Relayed datagrams come unsealed, as a relay forwards them.
                answers.extend(std::mem::take(&mut self.relay_sends));
                answers
            }
            Frame::Ping { nonce } => vec![self.seal(Frame::Pong { nonce: *nonce })],
            _ => Vec::new(),
        }
    }

    /// Carries out the node's outputs as the runtime does (the reads answered, r1 answering
    /// its frames), as short lines, in order.
    pub(super) fn drain(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        while let Some(out) = self.node.poll_out() {
            let now = self.now();
            lines.push(match out {
                NodeOut::Send { to, .. } => format!("send {to}"),
                NodeOut::RelayUdp { to, frame } => {
                    let line = format!("relay-udp {to} {}", frame_kind(&frame));
                    if to == relay_udp() && self.relay_alive {
                        for a in self.answer(&frame) {
                            self.node.handle_datagram(&a.to_datagram(), to, now);
                        }
                    }
                    line
                }
                NodeOut::Recv { peer, .. } => format!("recv {}", short(&peer)),
                NodeOut::Carry { peer, how } => format!("carry {} {how:?}", short(&peer)),
                NodeOut::Candidates { home_relay, .. } => {
                    format!(
                        "candidates home={}",
                        home_relay.as_deref().unwrap_or("none")
                    )
                }
                NodeOut::ReadAddrs => {
                    let ips: Vec<IpAddr> = vec!["10.0.0.1".parse().expect("an address")];
                    self.node.handle_local_addrs(ips, PORT, now);
                    "read-addrs".to_owned()
                }
                NodeOut::ReadHandshakes => {
                    self.node.handle_handshakes(Some(Vec::new()), now);
                    "read-handshakes".to_owned()
                }
                NodeOut::Publish(paths) => format!("publish {}", paths.len()),
                NodeOut::PlaneRelays(relays) => format!("plane-relays {relays:?}"),
                other => format!("{other:?}"),
            });
        }
        lines
    }

    /// Time is `at`: the node's timeout, then its outputs.
    pub(super) fn at(&mut self, at: Instant) -> Vec<String> {
        self.now = at;
        let now = self.now();
        self.node.handle_timeout(now);
        self.drain()
    }

    /// Wakes the node at each of its deadlines up to `end`, as the runtime does.
    pub(super) fn run_until(&mut self, end: Instant) -> Vec<String> {
        let mut lines = Vec::new();
        while let Some(at) = self.node.poll_timeout().filter(|at| *at <= end) {
            lines.extend(self.at(at));
        }
        self.now = end;
        lines
    }
}

pub(super) fn short(key: &PublicKey) -> String {
    key.to_base64()[..4].to_owned()
}

/// Where the first line from `from` on that starts with `prefix` is.
pub(super) fn position_from(lines: &[String], from: usize, prefix: &str) -> usize {
    lines
        .iter()
        .skip(from)
        .position(|l| l.starts_with(prefix))
        .map(|i| i + from)
        .unwrap_or_else(|| panic!("no {prefix:?} from line {from} on in {lines:?}"))
}

pub(super) fn position(lines: &[String], prefix: &str) -> usize {
    position_from(lines, 0, prefix)
}
