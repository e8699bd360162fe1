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
use plexsphere_wire::reach::relay::{
    Frame, FrameKey, KeyPrefix, LEASE_SECS, RefuseCode, RelayToken, TOKEN_CLOCK_SKEW_SECS,
    TOKEN_TTL_SECS, prefix,
};
use plexsphere_wire::signed::{DomainVerifier, SignContext, SignedEnvelope};
use tokio::sync::mpsc;

use crate::bucket::TokenBucket;
use crate::cookie::CookieKey;
use crate::limits::{LIMIT_LOG_EVERY, Limits};
use crate::prefix::{Prefix, PrefixBuckets, conn_source};
use crate::stats::Counters;

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

    /// A new TCP connection's writer queue, or `None` at `max_tcp_connections` or when its
    /// source holds `max_tcp_per_source` already.
    pub fn handle_tcp_open(
        &mut self,
        tx: mpsc::Sender<Vec<u8>>,
        addr: SocketAddr,
        now: Instant,
    ) -> Option<ConnId> {
        let source = conn_source(addr.ip());
        if self.per_source.get(&source).copied().unwrap_or(0) >= self.limits.tcp_per_source() {
            self.counters.tcp_refused_per_source.inc();
            self.hit(Limit::TcpPerSource, now);
            return None;
        }
        if self.conns.len() >= self.limits.max_tcp_connections {
            self.hit(Limit::MaxTcp, now);
            return None;
        }
        let id = self.next_conn;
        self.next_conn += 1;
        self.conns.insert(id, TcpConn { tx, addr });
        *self.per_source.entry(source).or_insert(0) += 1;
        Some(id)
    }

    /// Forgets a closed TCP connection and the registration bound to it.
    pub fn handle_tcp_close(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.remove(&id) {
            let source = conn_source(conn.addr.ip());
            if let Some(n) = self.per_source.get_mut(&source) {
                *n -= 1;
                if *n == 0 {
                    self.per_source.remove(&source);
                }
            }
        }
        if let Some(node) = self.by_peer.remove(&Peer::Tcp(id)) {
            self.forget(&node);
        }
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

    /// Drops every registration whose lease (or token) ended, and prunes idle answer buckets.
    fn sweep(&mut self, now: Instant) {
        self.strangers.tick(now);
        let (by_peer, by_prefix, by_id) = (&mut self.by_peer, &mut self.by_prefix, &mut self.by_id);
        self.nodes.retain(|key, r| {
            let live = r.expires > now;
            if !live {
                if by_peer.get(&r.peer) == Some(key) {
                    by_peer.remove(&r.peer);
                }
                if by_prefix.get(&prefix(key)) == Some(key) {
                    by_prefix.remove(&prefix(key));
                }
                if by_id.get(&r.id) == Some(key) {
                    by_id.remove(&r.id);
                }
            }
            live
        });
        self.generations.retain(|_, g| g.until > now);
    }

    /// Drops `node`'s registration, its prefix, its node id and its peer's binding.
    fn forget(&mut self, node: &PublicKey) {
        if let Some(r) = self.nodes.remove(node) {
            if self.by_peer.get(&r.peer) == Some(node) {
                self.by_peer.remove(&r.peer);
            }
            if self.by_id.get(&r.id) == Some(node) {
                self.by_id.remove(&r.id);
            }
        }
        if self.by_prefix.get(&prefix(node)) == Some(node) {
            self.by_prefix.remove(&prefix(node));
        }
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

    /// Logs a limit at most every [`LIMIT_LOG_EVERY`], with how often it was hit meanwhile.
    fn hit(&mut self, limit: Limit, now: Instant) {
        self.counters.limit_hits.inc();
        let entry = self
            .logged
            .entry(limit)
            .or_insert((now - LIMIT_LOG_EVERY * 2, 0));
        entry.1 += 1;
        if now.saturating_duration_since(entry.0) < LIMIT_LOG_EVERY {
            return;
        }
        let times = std::mem::take(&mut entry.1);
        entry.0 = now;
        let l = &self.limits;
        match limit {
            Limit::MaxNodes => tracing::warn!(
                times,
                max = l.max_nodes,
                "the relay is at its limit of registered nodes; new nodes are refused as busy (raise --max-nodes)"
            ),
            Limit::MaxTcp => tracing::warn!(
                times,
                max = l.max_tcp_connections,
                "the relay is at its limit of TCP connections; new ones are closed (raise --max-tcp-connections)"
            ),
            Limit::TcpPerSource => tracing::warn!(
                times,
                max = l.tcp_per_source(),
                "a source address (or IPv6 /64) holds as many TCP connections as it may; new ones from it are closed (raise --max-tcp-per-source)"
            ),
            Limit::PrefixAnswers => tracing::warn!(
                times,
                rate = l.prefix_answers.per_sec,
                burst = l.prefix_answers.burst,
                "a source /24 or /48 with no registration asked for more answers than it gets; the rest go unanswered (--prefix-answers-per-sec, --prefix-answers-burst)"
            ),
            Limit::NodeBudget => tracing::warn!(
                times,
                frames = l.node_frames_per_sec,
                bytes = l.node_bytes_per_sec,
                "a node sent more than its budget; frames over it are dropped (--node-frames-per-sec, --node-bytes-per-sec)"
            ),
            Limit::Refusals => tracing::warn!(
                times,
                rate = l.refusals_per_sec,
                "more refusals than --refusals-per-sec are due; the rest go unanswered"
            ),
        }
    }

    /// Whether `peer` may be answered now: always when it is registered or a TCP connection,
    /// else when its source /24 or /48 has an answer left (a drop is counted and logged).
    pub fn may_answer(&mut self, peer: Peer, now: Instant) -> bool {
        let Peer::Udp(addr) = peer else { return true };
        if self.by_peer.contains_key(&peer) || self.strangers.take(addr.ip(), now) {
            return true;
        }
        self.counters.dropped_prefix_rate.inc();
        self.hit(Limit::PrefixAnswers, now);
        false
    }

    /// A `refused` for a peer, if its prefix's rate and the global refusal rate allow one now.
    fn refuse(&mut self, peer: Peer, code: RefuseCode, reason: &str, now: Instant) -> Option<Out> {
        self.counters.refused.inc();
        if !self.may_answer(peer, now) {
            return None;
        }
        if !self.refusals.take(1, now) {
            self.hit(Limit::Refusals, now);
            return None;
        }
        let to = self.to(peer)?;
        Some(Out {
            to,
            frame: Frame::Refused {
                code,
                reason: reason.to_owned(),
            },
        })
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

    fn register(
        &mut self,
        peer: Peer,
        node: PublicKey,
        cookie: &[u8; 32],
        proof: &[u8; 32],
        token: &[u8],
        now: Now,
    ) -> Option<Out> {
        let addr = self.address(peer)?;
        if !self.cookies.check(addr, &node, cookie, now.unix_secs()) {
            return self.refuse(peer, RefuseCode::BadProof, "the cookie is not from this relay for this address and key, or older than a minute: send hello again", now.at);
        }
        let shared = plexsphere_wire::reach::shared_secret(&self.secret, &node);
        use plexsphere_wire::reach::relay::{proof_matches, sealed_proof_matches};
        let seal = if sealed_proof_matches(&shared, cookie, &node, proof) {
            Some(FrameKey::new(&shared))
        } else if proof_matches(&shared, cookie, &node, proof) {
            None
        } else {
            return self.refuse(peer, RefuseCode::BadProof, "the proof does not match this key and this relay's public key: check the relay key in the node's state", now.at);
        };
        // From here the node proved its key: its refusals are sealed when it asked for that.
        let token = match self.check_token(&node, token, now.unix_secs()) {
            Ok(t) => t,
            Err((code, reason)) => return self.refuse_proved(peer, seal, code, reason, now),
        };
        let id = (token.domain_id, token.node_id);
        if self
            .generations
            .get(&id)
            .is_some_and(|g| g.until > now.at && g.generation > token.key_generation)
        {
            return self.refuse_proved(peer, seal, RefuseCode::BadToken, "the token is for an older key of this node (it rotated its key): register with the token of the current key", now);
        }
        let new_id = !self.nodes.contains_key(&node) && !self.by_id.contains_key(&id);
        if new_id && self.nodes.len() >= self.limits.max_nodes {
            self.sweep(now.at);
            if self.nodes.len() >= self.limits.max_nodes {
                self.hit(Limit::MaxNodes, now.at);
                return self.refuse_proved(peer, seal, RefuseCode::Busy, "this relay has as many nodes registered as it takes (--max-nodes): use another relay", now);
            }
        }
        // The token's end, on the monotonic clock (check_token saw it in the future).
        let left = u64::try_from(token.expires_at)
            .unwrap_or(0)
            .saturating_sub(now.unix_secs());
        let token_end = now.at + Duration::from_secs(left);
        let g = self.generations.entry(id).or_insert(Generation {
            generation: token.key_generation,
            until: token_end,
        });
        if token.key_generation >= g.generation {
            g.until = if token.key_generation > g.generation {
                token_end
            } else {
                g.until.max(token_end)
            };
            g.generation = token.key_generation;
        }
        self.bind(peer, node, id, seal, token_end, now.at);
        self.counters.registrations.inc();
        tracing::debug!(%node, ?peer, "registered");
        let registered = Frame::Registered {
            lease_secs: LEASE_SECS,
        };
        Some(Out {
            to: self.to(peer)?,
            frame: self.seal_for(peer, registered, now.unix_secs()),
        })
    }

    /// A refusal to a node that proved its key: sealed under `seal` when it asked for that.
    fn refuse_proved(
        &mut self,
        peer: Peer,
        seal: Option<FrameKey>,
        code: RefuseCode,
        reason: &str,
        now: Now,
    ) -> Option<Out> {
        let mut out = self.refuse(peer, code, reason, now.at)?;
        if let Some(key) = seal {
            self.counter = (self.counter + 1).max(now.unix_secs().saturating_mul(1_000_000));
            out.frame = key.seal(self.counter, &out.frame);
        }
        Some(out)
    }

    fn check_token(
        &self,
        node: &PublicKey,
        token: &[u8],
        now_unix: u64,
    ) -> Result<RelayToken, (RefuseCode, &'static str)> {
        let env: SignedEnvelope = serde_json::from_slice(token).map_err(|_| {
            (
                RefuseCode::BadToken,
                "the token is not a signed envelope (JSON): send the relay_token of the node's state",
            )
        })?;
        let token: RelayToken = self
            .domains
            .iter()
            .find_map(|d| d.open(SignContext::RelayToken, &env).ok())
            .ok_or((
                RefuseCode::BadToken,
                "the token is not signed by a Domain this relay trusts (--domain-key)",
            ))?;
        if token.public_key != node.to_base64() {
            return Err((
                RefuseCode::BadToken,
                "the token was issued for another WireGuard key",
            ));
        }
        let now = i64::try_from(now_unix).unwrap_or(i64::MAX);
        if token.expires_at <= now {
            return Err((
                RefuseCode::Expired,
                "the token has expired: pull a fresh state from the control plane",
            ));
        }
        if token.expires_at > now.saturating_add(TOKEN_TTL_SECS + TOKEN_CLOCK_SKEW_SECS) {
            return Err((
                RefuseCode::BadToken,
                "the token lives longer than relays accept (10 minutes): upgrade the control plane, or check the relay's clock",
            ));
        }
        Ok(token)
    }

    /// Binds `node` to `peer` (replacing its older binding, whatever key `peer` had, and the
    /// other key of its node id) until the lease or the token ends.
    fn bind(
        &mut self,
        peer: Peer,
        node: PublicKey,
        id: NodeId,
        seal: Option<FrameKey>,
        token_end: Instant,
        now: Instant,
    ) {
        if let Some(old) = self.nodes.get(&node)
            && old.peer != peer
            && self.by_peer.get(&old.peer) == Some(&node)
        {
            self.by_peer.remove(&old.peer);
        }
        if let Some(other) = self.by_peer.insert(peer, node)
            && other != node
        {
            self.forget(&other);
            self.by_peer.insert(peer, node);
        }
        if let Some(other) = self.by_id.insert(id, node)
            && other != node
        {
            // The node's other key (an older generation, or the same one): replaced.
            self.forget(&other);
            self.by_id.insert(id, node);
        }
        if let Some(r) = self.nodes.get(&node)
            && r.id != id
            && self.by_id.get(&r.id) == Some(&node)
        {
            self.by_id.remove(&r.id);
        }
        self.by_prefix.insert(prefix(&node), node);
        let lease = (now + Duration::from_secs(u64::from(LEASE_SECS))).min(token_end);
        let l = &self.limits;
        match self.nodes.get_mut(&node) {
            Some(r) => {
                r.peer = peer;
                r.expires = lease;
                r.id = id;
                r.seal = seal;
            }
            None => {
                self.nodes.insert(
                    node,
                    Registration {
                        peer,
                        expires: lease,
                        id,
                        seal,
                        frames: TokenBucket::new(l.node_frames_per_sec, l.node_frames_per_sec, now),
                        bytes: TokenBucket::new(l.node_bytes_per_sec, l.node_bytes_per_sec, now),
                        answers: TokenBucket::new(
                            l.node_answers_per_sec,
                            l.node_answers_per_sec,
                            now,
                        ),
                    },
                );
            }
        }
    }

    /// A `send` of `len` payload bytes to `dst` from `peer` (its bytes stay with the shell);
    /// queues where it goes on ([`Transmit::Forward`]) or the answer to its sender, for
    /// [`Core::poll_transmit`]. A dropped one (counted) queues nothing.
    pub fn handle_send(&mut self, dst: &KeyPrefix, len: usize, peer: Peer, now: Now) {
        let out = self.forward(dst, len, peer, now);
        self.push(out);
    }

    /// Where a `send` goes on, or the answer to its sender; `None`: dropped (counted).
    fn forward(&mut self, dst: &KeyPrefix, len: usize, peer: Peer, now: Now) -> Option<Transmit> {
        let Some(src) = self.by_peer.get(&peer).copied() else {
            return self.not_registered(peer, now.at);
        };
        let Some(reg) = self.nodes.get_mut(&src) else {
            return self.not_registered(peer, now.at);
        };
        if reg.expires <= now.at {
            return self.not_registered(peer, now.at);
        }
        if !reg.frames.take(1, now.at) || !reg.bytes.take(len as u64, now.at) {
            self.counters.dropped_budget.inc();
            let answer = reg.answers.take(1, now.at);
            self.hit(Limit::NodeBudget, now.at);
            return match (answer, self.to(peer)) {
                (true, Some(to)) => {
                    let busy = Frame::Refused {
                        code: RefuseCode::Busy,
                        reason: "over this node's budget at this relay; frames are dropped".into(),
                    };
                    Some(Transmit::Frame(Out {
                        to,
                        frame: self.seal_for(peer, busy, now.unix_secs()),
                    }))
                }
                _ => None,
            };
        }
        let target = self
            .by_prefix
            .get(dst)
            .and_then(|key| self.nodes.get(key))
            .filter(|r| r.expires > now.at)
            .map(|r| r.peer);
        match target.and_then(|p| self.to(p)) {
            Some(to) => Some(Transmit::Forward { to, src }),
            None => {
                self.counters.peer_gone.inc();
                let answer = self
                    .nodes
                    .get_mut(&src)
                    .is_some_and(|r| r.answers.take(1, now.at));
                match (answer, self.to(peer)) {
                    (true, Some(to)) => Some(Transmit::Frame(Out {
                        to,
                        frame: self.seal_for(peer, Frame::PeerGone { dst: *dst }, now.unix_secs()),
                    })),
                    _ => None,
                }
            }
        }
    }

    fn not_registered(&mut self, peer: Peer, now: Instant) -> Option<Transmit> {
        self.refuse(
            peer,
            RefuseCode::NotRegistered,
            "send from an address or connection with no registration: register first",
            now,
        )
        .map(Transmit::Frame)
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
