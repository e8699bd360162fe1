//! Reach's decisions as sans-IO machines, and the node that routes between them (issue 26,
//! "reach as one sans-IO node"; docs/reach.md "The runtime"):
//!
//! - [`relays`]: the relay set (the relays in use, their connections, the home relay, the
//!   move to TCP with TLS, idle closes, replay floors, the relay token).
//! - [`schedule`]: the schedule (when the pass runs, the host address and handshake reads,
//!   STUN runs and the probe, the tick of the relays and the engine).
//! - [`Node`] (here): the engine, the relay set and the schedule together, and the decisions
//!   that span them: the one deadline the runtime sleeps until, which machine is due when no
//!   pass runs, a change of the relays or STUN servers, a key rotation, and the routing
//!   between the machines. The schedule's engine inputs and its tick reach the engine and the
//!   relay set; the relay set's engine inputs (a relay up or down, the home relay, relayed
//!   disco, a peer gone) reach the engine; the engine's relayed sends and relay paths reach
//!   the relay set; relayed datagrams are named by the wanted peers' key prefixes (a prefix
//!   two peers share names neither).
//! - `carry` ([`Carry`], [`Via`]): how each peer's chosen path is carried: its endpoint direct,
//!   the data plane's own relay endpoint (and, when the data plane refuses,
//!   [`Node::handle_plane_refused`], a forwarder instead), a forwarder to the relay's UDP
//!   address or on its TCP link, held (a key rotation), or released (a relayed peer's
//!   forwarder closes once it stayed without a path for [`FORWARDER_LINGER`]); a relay whose
//!   transport changed has its peers carried anew (not those left without a path).
//! - `sim` (tests only): a deterministic network of whole nodes behind routers of every NAT
//!   kind, with STUN servers and the relay's own core (docs/reach.md "The simulator").
//!
//! The runtime hands the node what arrived (`handle_*`, the time last: a [`Now`], whose
//! `at` the relay set and the schedule get) and then carries out the node's one output queue
//! ([`Node::poll_out`], [`NodeOut`]) until it answers `None`: only what takes I/O or the
//! runtime's shared state (among them how to carry a peer, [`NodeOut::Carry`], and the
//! relays the data plane unwraps frames from, [`NodeOut::PlaneRelays`], when that set
//! changed): the runtime decides nothing of its own. A read the node asks for
//! ([`NodeOut::ReadAddrs`], [`NodeOut::ReadHandshakes`]) is answered
//! ([`Node::handle_local_addrs`], [`Node::handle_handshakes`]) while draining, and the pass
//! goes on from there; so is a refused relay endpoint ([`Node::handle_plane_refused`]).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant, SystemTime};

use ipnet::IpNet;
use plexsphere_wire::key::PublicKey;
use plexsphere_wire::node::{NatReport, RelaySpec};
use plexsphere_wire::reach::relay::{Frame, KeyPrefix, prefix};
use plexsphere_wire::reach::{Kind, classify};
use rand_core::CryptoRngCore;

use crate::reach::engine::Engine;
use crate::reach::io::{Effect, Input, Now, PeerPathView, PeerReach};

mod carry;
pub mod relays;
mod route;
pub mod schedule;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

use self::relays::RelaySet;
use self::schedule::Schedule;

/// At most this many outputs wait in the node's queue. The runtime drains it after every
/// input, so one input's outputs are what it holds (a pass to a few hundred peers and relays
/// is well under this); should it ever be full, a new output is dropped and counted
/// ([`Node::out_dropped`]), so an undrained node cannot grow without bound.
pub const OUT_QUEUE: usize = 65_536;

/// How long a relayed peer left with no path keeps its forwarder before it is released
/// ([`Carry::Release`]): a peer back within it (its relay restarted, the peer registered
/// again, its home relay's "gone" expired) is carried again without a new socket and a new
/// kernel endpoint; one without a path for longer (its relays left the state, or all are down)
/// gives its descriptor back.
pub const FORWARDER_LINGER: Duration = Duration::from_secs(60);

/// What the runtime carries out for the node, in order: only what takes I/O or the
/// runtime's shared state (the machines' other outputs are routed inside the node).
#[derive(Debug)]
pub enum NodeOut {
    /// A datagram to send from the WireGuard socket (disco direct, a STUN request).
    Send { to: SocketAddr, datagram: Vec<u8> },
    /// A frame to a relay's UDP address (from the WireGuard socket).
    RelayUdp { to: SocketAddr, frame: Frame },
    /// A frame on the relay's TCP connection.
    RelayTcp { relay: String, frame: Frame },
    /// Open a TCP connection with TLS to the relay (its certificate must name
    /// `server_name`); one that cannot start is reported with [`Node::handle_tcp_closed`].
    OpenTcp {
        relay: String,
        addr: SocketAddr,
        server_name: String,
    },
    /// Close the relay's TCP connection (without reporting its end back).
    CloseTcp { relay: String },
    /// A WireGuard datagram `peer` sent through a relay, for its forwarder.
    Recv { peer: PublicKey, datagram: Vec<u8> },
    /// A datagram or frame from no known source was dropped (counted as an unknown source).
    Dropped,
    /// From now on, carry `peer`'s WireGuard traffic this way (a relay's connection is
    /// already asked for); see [`Carry`].
    Carry { peer: PublicKey, how: Carry },
    /// Our own candidates changed (for the published view and the endpoint report).
    Candidates {
        reflexive: Vec<SocketAddr>,
        home_relay: Option<String>,
        nat: NatReport,
    },
    /// Tell the data plane the relays whose frames it unwraps: the UDP addresses of the
    /// relays with a connection over UDP (registered or registering), sorted. Only when that
    /// set changed, at the end of a pass or of a timeout that ran no pass.
    PlaneRelays(Vec<SocketAddr>),
    /// Read the host's addresses and answer with [`Node::handle_local_addrs`].
    ReadAddrs,
    /// Read the data plane's handshake times and answer with [`Node::handle_handshakes`].
    ReadHandshakes,
    /// The pass ended: publish these path views.
    Publish(Vec<PeerPathView>),
}

/// How the runtime carries a peer's WireGuard traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Carry {
    /// Point the peer at its direct endpoint; a forwarder it had goes.
    Direct(SocketAddr),
    /// Point the peer at the data plane's own endpoint through the relay at `udp` (no
    /// forwarder; one it had goes). When the data plane has none or refuses, answer
    /// [`Node::handle_plane_refused`]: the node then picks the forwarder.
    PlaneRelay { relay: String, udp: SocketAddr },
    /// Point the peer at the data plane's own endpoint on the relay's TCP link with TLS (no
    /// forwarder; one it had goes). When the data plane has none (the kernel), refuses, or
    /// the link is not up, answer [`Node::handle_plane_refused`]: the node then picks the
    /// forwarder on that link.
    PlaneLink { relay: String },
    /// Carry the peer through its loopback forwarder (opened, and made its endpoint, when it
    /// has none), which sends `via`.
    Forward(Via),
    /// The peer's forwarder, when it has one, holds its traffic (until its path is chosen
    /// again).
    Hold,
    /// The relayed peer stayed without a path for [`FORWARDER_LINGER`]: its forwarder,
    /// when it has one, closes. Its endpoint is left as it is (a closed loopback port, or the
    /// data plane's endpoint through the relay, which answers that the peer is gone) until a
    /// path is chosen again.
    Release,
}

/// Where a peer's forwarder sends its traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// Framed to the relay's UDP address (from the WireGuard socket).
    Udp(SocketAddr),
    /// On the relay's TCP link with TLS (named by the relay).
    Tcp(String),
    /// Nowhere yet: the relay has neither a UDP address nor a TCP link (held).
    Nowhere,
}

/// The node; see the module docs.
pub struct Node {
    engine: Engine,
    relays: RelaySet,
    schedule: Schedule,
    /// The wanted peers as last handed over (the new engine gets them after a key rotation).
    peers: Vec<PeerReach>,
    /// Each wanted peer by its key prefix (relays name the sender of a datagram by it); a
    /// prefix two peers share maps to neither.
    by_prefix: HashMap<KeyPrefix, Option<PublicKey>>,
    /// The relay each relayed peer goes through (carried anew when its transport changes).
    relayed: BTreeMap<PublicKey, String>,
    /// The relayed peers left with no path, and when their forwarders are released.
    lingering: BTreeMap<PublicKey, Instant>,
    /// The relays the data plane was last told to unwrap frames from ([`NodeOut::PlaneRelays`]).
    plane_relays: Vec<SocketAddr>,
    /// The pass waits for the answer to a read it asked for.
    awaiting_read: bool,
    out: VecDeque<NodeOut>,
    out_dropped: u64,
}

impl Node {
    /// A node with this WireGuard private key in a Domain with this mesh range, with or
    /// without TLS trust for relays; the engine's tx ids and disco nonces come from
    /// `engine_rng` and STUN transaction ids from `stun_rng` (both the OS's CSPRNG in
    /// production: the runtime hands them in, the node reads no randomness of its own). Its
    /// first pass is due at `now`.
    pub fn new(
        secret: [u8; 32],
        mesh: IpNet,
        tls_trust: bool,
        engine_rng: Box<dyn CryptoRngCore + Send>,
        stun_rng: Box<dyn CryptoRngCore + Send>,
        now: Instant,
    ) -> Self {
        Self {
            engine: Engine::with_rng(secret, mesh, engine_rng),
            relays: RelaySet::new(secret, tls_trust),
            schedule: Schedule::new(stun_rng, now),
            peers: Vec::new(),
            by_prefix: HashMap::new(),
            relayed: BTreeMap::new(),
            lingering: BTreeMap::new(),
            plane_relays: Vec::new(),
            awaiting_read: false,
            out: VecDeque::new(),
            out_dropped: 0,
        }
    }

    /// The next thing to carry out.
    pub fn poll_out(&mut self) -> Option<NodeOut> {
        self.out.pop_front()
    }

    /// Outputs dropped because the queue was full ([`OUT_QUEUE`]).
    pub fn out_dropped(&self) -> u64 {
        self.out_dropped
    }

    /// The earliest deadline of the schedule (its next pass, the STUN probe), the engine (a
    /// timed punch), the relay set (a connection's retry, keepalive, give-up, ...) and a
    /// forwarder's release ([`FORWARDER_LINGER`]). Never
    /// `None`: the schedule always has its next pass.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.schedule.poll_timeout(),
            self.engine.poll_timeout(),
            self.relays.poll_timeout(),
            self.lingering.values().min().copied(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The peers' paths as the engine sees them now.
    pub fn paths(&self) -> Vec<PeerPathView> {
        self.engine.paths()
    }

    /// Time passed: the pass runs when it is due (its reads, STUN, then the relays' and the
    /// engine's tick and the published views); otherwise only the machine that is due runs
    /// (the STUN probe, the engine's timed punch, a relay connection's timers).
    pub fn handle_timeout(&mut self, now: Now) {
        // A read asked for and never answered does not hold the schedule up forever.
        self.awaiting_read = false;
        self.release_lingering(now.at);
        let pass = self.schedule.pass_due(now.at);
        self.schedule.handle_timeout(now.at);
        self.carry_schedule(now);
        if pass {
            return;
        }
        if self.engine_due(now.at) {
            self.input(Input::Tick, now);
        }
        if self.relays_due(now.at) {
            self.relays.handle_timeout(now.at);
            self.carry_relays(now);
        }
        self.tell_plane_relays();
    }

    /// A daemon input arrived (peers, relays, a token, a key, a pinned path): the next pass
    /// runs at once (with the next [`Self::handle_timeout`]).
    pub fn handle_daemon_input(&mut self, now: Now) {
        self.schedule.handle_daemon_input(now.at);
    }

    /// A datagram the WireGuard socket received that is not WireGuard's: STUN goes to the
    /// schedule's probe, disco to the engine, a relay frame to the relay set; anything else
    /// is dropped and counted.
    pub fn handle_datagram(&mut self, datagram: &[u8], from: SocketAddr, now: Now) {
        match classify(datagram) {
            Kind::Stun => {
                self.schedule.handle_stun_datagram(datagram, from, now.at);
                self.carry_schedule(now);
            }
            Kind::Disco => self.input(
                Input::DiscoDirect {
                    from,
                    datagram: datagram.to_vec(),
                },
                now,
            ),
            Kind::Relay => match Frame::from_datagram(datagram) {
                Ok(f) => {
                    self.relays.handle_udp_frame(f, from, now.at);
                    self.carry_relays(now);
                }
                Err(e) => tracing::debug!(%from, "unreadable relay frame: {e}"),
            },
            Kind::WireGuard | Kind::Unknown => self.push(NodeOut::Dropped),
        }
    }

    /// A relay frame that arrived on the relay's TCP connection.
    pub fn handle_tcp_frame(&mut self, relay: &str, frame: Frame, now: Now) {
        self.relays.handle_tcp_frame(relay, frame, now.at);
        self.carry_relays(now);
    }

    /// The relay's TCP connection ended (or could not open): back to UDP, retried later.
    pub fn handle_tcp_closed(&mut self, relay: &str, why: &str, now: Now) {
        self.relays.handle_tcp_closed(relay, why, now.at);
        self.carry_relays(now);
    }

    /// The wanted peers, for the engine (and their key prefixes, which name relayed senders);
    /// a peer no longer wanted is no longer carried through a relay.
    pub fn handle_peers(&mut self, peers: Vec<PeerReach>, now: Now) {
        self.by_prefix.clear();
        for p in &peers {
            self.by_prefix
                .entry(prefix(&p.key))
                .and_modify(|k| *k = None)
                .or_insert(Some(p.key));
        }
        // A set, not a list: a change at 10k peers must not cost 10k x 10k comparisons.
        let wanted: HashSet<PublicKey> = peers.iter().map(|p| p.key).collect();
        self.relayed.retain(|k, _| wanted.contains(k));
        self.lingering.retain(|k, _| wanted.contains(k));
        self.peers = peers.clone();
        self.input(Input::Peers(peers), now);
    }

    /// A new relay token (the JSON of its signed envelope), for every connection.
    pub fn handle_token(&mut self, token: Vec<u8>) {
        self.relays.handle_token(token);
    }

    /// The state's relays and STUN servers: the relay set takes the relays (the engine gets
    /// them when the usable set changed), and a change of the usable relays or of the STUN
    /// servers starts a STUN run with the next pass.
    pub fn handle_relays(&mut self, specs: Vec<RelaySpec>, stun: Vec<SocketAddr>, now: Now) {
        self.set_relays(specs, stun, now.at);
        self.carry_relays(now);
    }

    /// A key rotation: the disco keys and relay registrations derive from the WireGuard key,
    /// so the relayed peers hold ([`Carry::Hold`]) until their paths are chosen again, the
    /// engine starts over with the new key and gets the relays and the wanted peers again,
    /// every relay connection registers again (its TLS links close), and the next pass hands
    /// the engine the local addresses again.
    pub fn handle_secret(&mut self, secret: [u8; 32], now: Now) {
        self.hold_relayed();
        self.rekey(secret, now.at);
        self.carry_relays(now);
        let peers = self.peers.clone();
        self.input(Input::Peers(peers), now);
    }

    /// The host's addresses and the WireGuard port (the answer to [`NodeOut::ReadAddrs`]);
    /// the pass goes on.
    pub fn handle_local_addrs(&mut self, ips: Vec<IpAddr>, port: u16, now: Now) {
        self.schedule.handle_local_addrs(ips, port, now.at);
        self.awaiting_read = false;
        self.carry_schedule(now);
    }

    /// The data plane's handshake times, or `None` when they could not be read (the answer
    /// to [`NodeOut::ReadHandshakes`]); the pass goes on.
    pub fn handle_handshakes(
        &mut self,
        handshakes: Option<Vec<(PublicKey, Option<SystemTime>)>>,
        now: Now,
    ) {
        if let Some(h) = handshakes {
            self.input(Input::Handshakes(h), now);
        }
        self.awaiting_read = false;
        self.carry_schedule(now);
    }

    /// An effect the daemon asks for (a pinned path), carried out as the engine's are.
    pub fn handle_effect(&mut self, effect: Effect, now: Now) {
        self.perform(effect, now);
    }

    /// Whether the engine's own deadline has come (it then gets `Input::Tick` even when no
    /// pass runs).
    fn engine_due(&self, now: Instant) -> bool {
        self.engine.poll_timeout().is_some_and(|at| at <= now)
    }

    /// Whether a relay connection's deadline has come (the relay set's `handle_timeout` then
    /// runs even when no pass runs).
    fn relays_due(&self, now: Instant) -> bool {
        self.relays.poll_timeout().is_some_and(|at| at <= now)
    }

    /// The relay set and the schedule take the state's relays and STUN servers (the relay
    /// set's outputs wait in it).
    fn set_relays(&mut self, specs: Vec<RelaySpec>, stun: Vec<SocketAddr>, now: Instant) {
        if self.relays.handle_relays(specs) {
            let udp = self.relays.relays().iter().filter_map(|r| r.udp).collect();
            self.schedule.handle_relays_changed(udp, now);
        }
        self.schedule.handle_stun_servers(stun, now);
    }

    /// A new engine, the relay set under the new key (its outputs wait in it), and the
    /// schedule reads the addresses again.
    fn rekey(&mut self, secret: [u8; 32], now: Instant) {
        self.engine.rekey(secret);
        self.relays.handle_secret(secret);
        self.schedule.handle_rekey(now);
    }
}
