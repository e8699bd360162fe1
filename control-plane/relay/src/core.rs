//! The relay's decisions, with no sockets and the time passed in: who is registered where,
//! what a frame from a peer is answered with, where a `send` goes. The UDP threads and the TCP
//! tasks share one [`Core`] behind a mutex and perform what it answers.
//!
//! It follows the machines' vocabulary (docs/architecture.md): inputs are `handle_*` (the
//! input, then whom it came from, `now` last), outputs are polled. [`Core::handle_frame`] and
//! [`Core::handle_send`] queue what they answer (at most one [`Transmit`] an input: an answer,
//! or where a `send` goes on), and the shell takes it with [`Core::poll_transmit`] until that
//! answers `None`, right after the input and under the same hold of the lock, so one thread
//! never takes another's outputs. [`Core::handle_timeout`] sweeps ended leases and answers
//! nothing; [`Core::poll_timeout`] says when the next sweep is due ([`SWEEP_EVERY`] after the
//! last). A `send`'s forward is a [`Transmit::Forward`] naming the destination and the source
//! key, not the bytes: the UDP thread rewrites the datagram it holds in place, so the hot path
//! queues and takes one small value in a reused queue, with no allocation and no copy of the
//! payload. Undrained, the queue stops at [`MAX_OUTPUTS`] (the newest dropped and counted in
//! `dropped_outputs`).
//!
//! | frame from a peer | answer |
//! |---|---|
//! | `hello{node}` | `challenge{cookie(peer address, node, epoch)}` (strangers: prefix rate) |
//! | `register` with a stale or foreign cookie, or a wrong proof | `refused{bad_proof}` |
//! | `register` with a token no trusted Domain signed, or for another key | `refused{bad_token}` |
//! | `register` with an expired token | `refused{expired}` |
//! | `register` whose token names an older key generation of its node than a live token seen | `refused{bad_token}` |
//! | `register` of a new node id at `max_nodes` | `refused{busy}` |
//! | `register` that checks out | `registered{LEASE_SECS}`; the key is bound to this peer until the lease or the token ends, and replaces its node id's other registration |
//! | `send{dst}` from a peer with no registration | `refused{not_registered}` (prefix and global rate) |
//! | `send{dst}` over the node's frame or byte budget | `refused{busy}` (node's answer rate) |
//! | `send{dst}` to a key with no live registration | `peer_gone{dst}` (node's answer rate) |
//! | `send{dst}` otherwise | `recv{src, payload}` to `dst`'s peer |
//! | `ping{nonce}` from a registered peer | `pong{nonce}` (a stranger's: nothing, counted) |
//! | anything else | nothing (counted) |
//!
//! A registration made with the sealed proof gets its `registered`, `refused`, `peer gone` and
//! `pong` sealed (`Frame::Sealed`, under the node's [`FrameKey`], with the relay's counter);
//! answers to a peer with no registration (and every `refused` before the proof checked out)
//! are plain: a node takes those as a hint to say `hello` again. A node id has one
//! registration at a time; limits and budgets are per node id.
//!
//! Every answer to a UDP source with no registration (`challenge`, `refused`, and the STUN
//! answers of the UDP thread through [`Core::may_answer`]) takes a token of its source /24 or
//! /48 ([`crate::prefix`]), so the relay reflects a bounded rate to any network whatever
//! source a datagram names. A TCP peer has completed a handshake, so it is not charged; its
//! connections are bounded per source instead ([`Core::handle_tcp_open`]).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use plexsphere_wire::key::PublicKey;
use plexsphere_wire::reach::relay::{Frame, FrameKey, KeyPrefix, prefix};
use plexsphere_wire::signed::DomainVerifier;
use tokio::sync::mpsc;

use crate::bucket::TokenBucket;
use crate::cookie::CookieKey;
use crate::limits::Limits;
use crate::prefix::{Prefix, PrefixBuckets};
use crate::stats::Counters;

mod conns;
mod forward;
mod rates;
mod registration;

/// One TCP connection's number, unique for the relay's life.
pub type ConnId = u64;

/// Outputs waiting in the core at most. The shells drain after every input, which queues at
/// most one, so the queue holds one; past this (a shell that does not drain) the newest is
/// dropped and counted in `dropped_outputs`.
pub const MAX_OUTPUTS: usize = 64;

/// How often ended leases are swept and idle answer buckets pruned: [`Core::poll_timeout`] is
/// this long after the last sweep. An ended lease forwards nothing meanwhile (every decision
/// checks the lease's end); the sweep only frees its room.
pub const SWEEP_EVERY: Duration = Duration::from_millis(200);

/// Where a frame came from or goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    Udp(SocketAddr),
    Tcp(ConnId),
}

/// Where to put an answer: a UDP address, or a TCP connection's writer queue.
#[derive(Debug, Clone)]
pub enum To {
    Udp(SocketAddr),
    Tcp(mpsc::Sender<Vec<u8>>),
}

/// A frame to send.
#[derive(Debug)]
pub struct Out {
    pub to: To,
    pub frame: Frame,
}

/// What the core answered an input with, taken with [`Core::poll_transmit`]. A `send` that is
/// dropped (counted) queues nothing.
#[derive(Debug)]
pub enum Transmit {
    /// Send this frame: an answer, or the `recv` a decoded `send` became.
    Frame(Out),
    /// Deliver the `send` just handled ([`Core::handle_send`]) as `recv{src, payload}` there;
    /// the shell builds it from the bytes it holds.
    Forward { to: To, src: PublicKey },
}

/// The time, both ways: the monotonic clock (`at`) for leases and budgets, the wall clock
/// (`unix_secs()`) for cookies and tokens. The project's one `Now` (docs/architecture.md).
pub use plexsphere_wire::clock::Now;

/// A node as its tokens name it: Domain id and node id.
type NodeId = (uuid::Uuid, uuid::Uuid);

struct Registration {
    peer: Peer,
    /// The lease's end, or the token's expiry when sooner.
    expires: Instant,
    id: NodeId,
    /// `Some` when the node registered with the sealed proof: its answers are sealed.
    seal: Option<FrameKey>,
    frames: TokenBucket,
    bytes: TokenBucket,
    answers: TokenBucket,
}

struct TcpConn {
    tx: mpsc::Sender<Vec<u8>>,
    addr: SocketAddr,
}

/// Which limit a log line is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Limit {
    MaxNodes,
    MaxTcp,
    TcpPerSource,
    PrefixAnswers,
    NodeBudget,
    Refusals,
}

/// The newest key generation a token of a node id showed, until that token expires.
struct Generation {
    generation: i64,
    until: Instant,
}

pub struct Core {
    secret: [u8; 32],
    /// The counter of the last sealed frame: strictly increasing, and at least the Unix time in
    /// microseconds, so a restarted relay goes on above what it sent before.
    counter: u64,
    /// The registered key of each node id (one registration a node id).
    by_id: HashMap<NodeId, PublicKey>,
    generations: HashMap<NodeId, Generation>,
    cookies: CookieKey,
    domains: Vec<DomainVerifier>,
    limits: Limits,
    nodes: HashMap<PublicKey, Registration>,
    by_peer: HashMap<Peer, PublicKey>,
    /// The registered key of each key prefix (data frames name nodes by prefix).
    by_prefix: HashMap<KeyPrefix, PublicKey>,
    conns: HashMap<ConnId, TcpConn>,
    /// Open TCP connections per source address (IPv6: /64).
    per_source: HashMap<Prefix, usize>,
    /// Answers to unregistered UDP sources, per /24 or /48.
    strangers: PrefixBuckets,
    next_conn: ConnId,
    refusals: TokenBucket,
    logged: HashMap<Limit, (Instant, u64)>,
    counters: std::sync::Arc<Counters>,
    /// What the inputs answered, until the shell polls it (at most [`MAX_OUTPUTS`]).
    outputs: VecDeque<Transmit>,
    /// When the next sweep is due ([`Core::poll_timeout`]).
    next_sweep: Instant,
}

impl Core {
    pub fn new(
        secret: [u8; 32],
        cookie_secret: [u8; 32],
        domains: Vec<DomainVerifier>,
        limits: Limits,
        counters: std::sync::Arc<Counters>,
        now: Instant,
    ) -> Self {
        let refusals = TokenBucket::new(limits.refusals_per_sec, limits.refusals_per_sec, now);
        let strangers = PrefixBuckets::new(limits.prefix_answers, now);
        Self {
            secret,
            counter: 0,
            by_id: HashMap::new(),
            generations: HashMap::new(),
            cookies: CookieKey::new(&cookie_secret),
            domains,
            limits,
            nodes: HashMap::new(),
            by_peer: HashMap::new(),
            by_prefix: HashMap::new(),
            conns: HashMap::new(),
            per_source: HashMap::new(),
            strangers,
            next_conn: 1,
            refusals,
            logged: HashMap::new(),
            counters,
            outputs: VecDeque::new(),
            next_sweep: now + SWEEP_EVERY,
        }
    }

    /// The next output of the inputs handled so far, oldest first; `None` when all are taken.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.outputs.pop_front()
    }

    /// When [`Core::handle_timeout`] has a sweep to do: [`SWEEP_EVERY`] after the last one (or
    /// the core's start). Always some; O(1).
    pub fn poll_timeout(&self) -> Option<Instant> {
        Some(self.next_sweep)
    }

    /// Queues `out` for [`Core::poll_transmit`], or drops and counts it at [`MAX_OUTPUTS`].
    fn push(&mut self, out: Option<Transmit>) {
        let Some(out) = out else { return };
        if self.outputs.len() >= MAX_OUTPUTS {
            self.counters.dropped_outputs.inc();
            return;
        }
        self.outputs.push_back(out);
    }

    /// Nodes with a registration (live or not yet swept).
    pub fn registered(&self) -> usize {
        self.nodes.len()
    }

    /// Whether `peer` holds a registration (live or not yet swept).
    pub fn is_registered(&self, peer: Peer) -> bool {
        self.by_peer.contains_key(&peer)
    }

    /// At [`Core::poll_timeout`] (or later): drops every registration whose lease (or token)
    /// ended, and prunes idle answer buckets; before it, nothing. Answers nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        if now < self.next_sweep {
            return;
        }
        self.next_sweep = now + SWEEP_EVERY;
        self.sweep(now);
    }

    /// `frame` as `peer`'s registration gets it: sealed when it registered for sealed answers.
    fn seal_for(&mut self, peer: Peer, frame: Frame, now_unix: u64) -> Frame {
        let Some(key) = self
            .by_peer
            .get(&peer)
            .and_then(|n| self.nodes.get(n))
            .and_then(|r| r.seal.as_ref())
        else {
            return frame;
        };
        self.counter = (self.counter + 1).max(now_unix.saturating_mul(1_000_000));
        key.seal(self.counter, &frame)
    }

    fn to(&self, peer: Peer) -> Option<To> {
        match peer {
            Peer::Udp(a) => Some(To::Udp(a)),
            Peer::Tcp(id) => self.conns.get(&id).map(|c| To::Tcp(c.tx.clone())),
        }
    }

    /// The address a cookie is bound to: the UDP source, or the TCP connection's remote end.
    fn address(&self, peer: Peer) -> Option<SocketAddr> {
        match peer {
            Peer::Udp(a) => Some(a),
            Peer::Tcp(id) => self.conns.get(&id).map(|c| c.addr),
        }
    }

    /// One frame from `peer`; queues its answer, if any, for [`Core::poll_transmit`] (a
    /// `send` becomes its `recv` here, or its answer: the UDP thread's undecoded `send`s go
    /// through [`Core::handle_send`]).
    pub fn handle_frame(&mut self, frame: Frame, peer: Peer, now: Now) {
        let out = self.answer(frame, peer, now).map(Transmit::Frame);
        self.push(out);
    }

    /// The frame that answers `frame` from `peer`, if any.
    fn answer(&mut self, frame: Frame, peer: Peer, now: Now) -> Option<Out> {
        match frame {
            Frame::Hello { node } => {
                if !self.may_answer(peer, now.at) {
                    return None;
                }
                let cookie = self
                    .cookies
                    .make(self.address(peer)?, &node, now.unix_secs());
                Some(Out {
                    to: self.to(peer)?,
                    frame: Frame::Challenge { cookie },
                })
            }
            Frame::Register {
                node,
                cookie,
                proof,
                token,
            } => self.register(peer, node, &cookie, &proof, &token, now),
            Frame::Ping { nonce } if self.by_peer.contains_key(&peer) => Some(Out {
                to: self.to(peer)?,
                frame: self.seal_for(peer, Frame::Pong { nonce }, now.unix_secs()),
            }),
            Frame::Ping { .. } => {
                self.counters.dropped_unregistered.inc();
                None
            }
            Frame::Send { dst, payload } => match self.forward(&dst, payload.len(), peer, now)? {
                Transmit::Forward { to, src } => Some(Out {
                    to,
                    frame: Frame::Recv {
                        src: prefix(&src),
                        payload,
                    },
                }),
                Transmit::Frame(out) => Some(out),
            },
            Frame::Pong { .. } => None,
            Frame::Challenge { .. }
            | Frame::Registered { .. }
            | Frame::Recv { .. }
            | Frame::Refused { .. }
            | Frame::PeerGone { .. }
            | Frame::Sealed { .. } => {
                self.counters.dropped_unexpected.inc();
                None
            }
        }
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
