//! The contract between the reach engine (sans-IO: `engine`, path choice and disco) and the
//! reach runtime (sockets: the WireGuard socket's side channel, STUN, relay connections, the
//! loopback forwarders). The engine takes [`Input`]s with the time in them and queues
//! [`Effect`]s; the runtime takes them (`poll_effect`), performs them and feeds back what
//! happened.
//!
//! Additive changes only: a new variant or field may be added by either side, nothing renamed.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use plexsphere_wire::node::{NatReport, RelaySpec};

use plexsphere_wire::key::PublicKey;

/// How a relay connection is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    Udp,
    /// TCP with TLS (for networks that drop UDP).
    Tcp,
}

/// The path a peer's WireGuard traffic takes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Path {
    /// No path found yet (nothing answered).
    None,
    /// Straight to this address from the WireGuard socket.
    Direct { endpoint: SocketAddr },
    /// Through this relay (by name), over UDP or TCP.
    Relay { relay: String, transport: Transport },
}

/// One peer as the engine sees it: from the signed state and the event stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerReach {
    pub key: PublicKey,
    pub node_id: uuid::Uuid,
    pub hostname: String,
    /// Direct candidates, best first (local addresses, then reflexive).
    pub endpoints: Vec<SocketAddr>,
    /// The relay the peer keeps a connection to, if it reported one.
    pub home_relay: Option<String>,
    /// The subnet routes this node reaches through the peer (its allowed IPs beyond its mesh
    /// addresses, without the exit's `/0`): an address inside one is reached through the
    /// mesh, so it is no direct candidate of any peer (the engine's `routed`).
    pub routes: Vec<ipnet::IpNet>,
}

#[derive(Debug, Clone)]
pub enum Input {
    /// This node's local candidates (interface addresses with the WireGuard port), sent in
    /// call-me-maybe messages so a peer punches towards every one of them.
    LocalAddrs(Vec<SocketAddr>),
    /// The wanted peers (the whole set, after every state or event that changed it).
    Peers(Vec<PeerReach>),
    /// The relays of the signed state, in its order.
    Relays(Vec<RelaySpec>),
    /// A disco datagram arrived on the WireGuard socket.
    DiscoDirect { from: SocketAddr, datagram: Vec<u8> },
    /// A disco datagram arrived through a relay, from the peer `src`.
    DiscoRelayed {
        relay: String,
        src: PublicKey,
        datagram: Vec<u8>,
    },
    /// A relay connection is registered and usable.
    RelayUp {
        relay: String,
        transport: Transport,
        rtt: Option<Duration>,
    },
    /// A relay connection is lost or was refused.
    RelayDown { relay: String, why: String },
    /// The relay says `dst` is not registered with it.
    PeerGone { relay: String, dst: PublicKey },
    /// The runtime's home relay (the one this node registers with and reports).
    HomeRelay(Option<String>),
    /// The data plane's last handshake per peer (read every few seconds).
    Handshakes(Vec<(PublicKey, Option<SystemTime>)>),
    /// A local address appeared or went away (roaming): probe everything again.
    NetworkChanged,
    /// What STUN measured: the reflexive addresses of the WireGuard socket and the NAT.
    Reflexive {
        addrs: Vec<SocketAddr>,
        nat: NatReport,
    },
    /// Time passed; the runtime sends one at least every [`TICK`].
    Tick,
}

/// How often the runtime ticks the engine at least.
pub const TICK: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send a datagram (disco) from the WireGuard socket.
    SendDirect { to: SocketAddr, datagram: Vec<u8> },
    /// Send a datagram (disco) to `dst` through `relay` (the runtime connects on demand).
    SendRelayed {
        relay: String,
        dst: PublicKey,
        datagram: Vec<u8>,
    },
    /// From now on, carry `peer`'s WireGuard traffic on `path`.
    SetPath { peer: PublicKey, path: Path },
    /// Our own candidates changed: the next endpoint report should carry them.
    Candidates {
        reflexive: Vec<SocketAddr>,
        home_relay: Option<String>,
        nat: NatReport,
    },
}

/// What `plexd status` shows per peer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PeerPathView {
    pub public_key: String,
    pub hostname: String,
    pub path: Path,
    /// The round trip of the last disco ping on that path, in milliseconds.
    pub rtt_ms: Option<u64>,
    /// Why the path is what it is, for the journal and status ("direct 192.0.2.7:51820
    /// answered in 3 ms", "no direct candidate answered; via relay r1 over udp").
    pub reason: String,
    /// The peer's node id (for the path report; status names peers by key and host name).
    #[serde(skip)]
    pub node_id: uuid::Uuid,
    /// The data plane's last handshake with the peer, as the runtime last read it.
    #[serde(skip)]
    pub last_handshake: Option<SystemTime>,
}

/// The engine's clock inputs, so tests step time (the project's one `Now`).
pub use plexsphere_wire::clock::Now;

/// This node's own candidates, for the endpoint report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnCandidates {
    pub reflexive: Vec<SocketAddr>,
    pub home_relay: Option<String>,
    pub nat: NatReport,
}

/// What the daemon holds of the reach runtime: it feeds it the wanted peers and relays and
/// reads paths and candidates back. Every call returns at once (the runtime runs on its own
/// thread); none of them fails: a runtime that stopped answers empty views.
pub trait ReachHandle: Send + Sync {
    /// The wanted peers, the whole set, after every change.
    fn set_peers(&self, peers: Vec<PeerReach>);
    /// The relays and STUN servers of the newest signed state.
    fn set_relays(&self, relays: Vec<RelaySpec>, stun: Vec<SocketAddr>);
    /// The newest relay token (from the state or a heartbeat answer).
    fn set_relay_token(&self, token: plexsphere_wire::signed::SignedEnvelope);
    /// Every peer's path, for `plexd status`.
    fn paths(&self) -> Vec<PeerPathView>;
    /// This node's candidates, for the endpoint report.
    fn own_candidates(&self) -> OwnCandidates;
}

/// No reach runtime (`wireguard.backend: none`, tests): peers keep the endpoints the diff
/// gives them.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoReach;

impl ReachHandle for NoReach {
    fn set_peers(&self, _peers: Vec<PeerReach>) {}
    fn set_relays(&self, _relays: Vec<RelaySpec>, _stun: Vec<SocketAddr>) {}
    fn set_relay_token(&self, _token: plexsphere_wire::signed::SignedEnvelope) {}
    fn paths(&self) -> Vec<PeerPathView> {
        Vec::new()
    }
    fn own_candidates(&self) -> OwnCandidates {
        OwnCandidates::default()
    }
}

/// Who sets a peer's WireGuard endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The diff, through the candidate rotation of the mesh diff's `EndpointBook`.
    Rotation,
    /// The reach runtime (it chose a path for the peer, or carries every peer through a
    /// forwarder): the diff writes no endpoint for a live peer, and gives a peer it adds
    /// `endpoint` (where reach carries it now), or its first candidate until reach decides.
    Reach { endpoint: Option<SocketAddr> },
}

/// Answers, per peer, who sets its endpoint; see [`Owner`].
pub trait EndpointOwners {
    fn owner(&self, key: &PublicKey) -> Owner;
}
