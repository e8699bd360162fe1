//! The reach engine: sans-IO path choice per peer (disco probes, relay fallback, upgrades).
//!
//! The runtime hands it one [`Input`] at a time with the time ([`Now`]) through
//! [`Engine::handle`], takes the [`Effect`]s it decided on through [`Engine::poll_effect`] (until
//! it answers `None`) and performs them, and ticks it (`Tick`) on its timer and at
//! [`Engine::poll_timeout`].
//! No sockets, no clock, no sleeps; randomness (tx ids and disco nonces) only from the random
//! source it was built with ([`Engine::with_rng`]; the OS's CSPRNG in production).
//!
//! | input | what the engine does |
//! |---|---|
//! | `Peers` | new peers: pair key, probe at once; changed endpoints: what relays said of the peer forgotten, probe; gone peers: forgotten |
//! | `Relays` | the relays to fall back on, in the state's order |
//! | `LocalAddrs`, `Reflexive`, `HomeRelay` | `Candidates` when they changed; probe every peer |
//! | `NetworkChanged` | probe every peer |
//! | any disco message | dropped unless it opens with the pair key and its stamp is new (`guard`) |
//! | `DiscoDirect` ping | from an address peers may send to, within its source budget: pong there; a new address is learned and pinged |
//! | `DiscoRelayed` ping | pong through the same relay |
//! | pong | counts only for a tx id we sent to that destination within [`TX_LIFETIME`]; a relay's pong starts the punch a probe round wants (`punch`) |
//! | call-me-maybe | ping every distinct address in it that peers may send to, at once (not while the pair is quiet after [`PUNCHES_BEFORE_QUIET`] failed punches) |
//! | `RelayUp` / `RelayDown` / `PeerGone` | relays usable or not; peers on a lost relay probe every other |
//! | `Tick` | due punches, heartbeats, scheduled probe rounds, dead paths, expiry |
//!
//! A probe round pings every direct candidate that answers lately, and the peer through its
//! home relay (else every relay of the state in order). The relay's pong starts a punch: a
//! call-me-maybe with our local and reflexive addresses through that relay, and the cold
//! candidates pinged half the pong's round trip later ([`Engine::poll_timeout`]), when the
//! peer's answering pings leave its NAT. The path is the fastest confirmed direct candidate
//! (with [`RTT_HYSTERESIS`]), else a relay ([`choice`]).

use ipnet::IpNet;
use plexsphere_wire::node::{NatReport, RelaySpec};
use plexsphere_wire::reach::DecodeError;
use plexsphere_wire::reach::disco::{self, Message, PairKey, TxId};
use rand_core::CryptoRngCore;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::Instant;

use self::peer::Peer;
use super::io::{Effect, Input, Now, PeerPathView, Transport};
use plexsphere_wire::key::PublicKey;

pub use self::bounds::*;

pub mod bounds;
mod choice;
mod guard;
mod peer;
mod probe;
mod punch;
#[cfg(test)]
mod sim;
#[cfg(test)]
pub(crate) mod sim_nat;
#[cfg(test)]
mod tests;

/// Messages the engine dropped, by why (for tests and the journal at debug).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// From a key that is not a wanted peer (or not a disco datagram at all).
    pub unknown_sender: u64,
    /// Did not open with the pair key (forged or altered), or a relayed one whose sender is
    /// not the relay's source.
    pub unauthentic: u64,
    /// Pongs with a tx id we did not send to that destination, or too old.
    pub stray_pongs: u64,
    /// Sends skipped because a per-peer or per-source budget was spent.
    pub rate_limited: u64,
    /// Authentic messages whose stamp was seen before or is too old (replays).
    pub replayed: u64,
    /// Addresses a peer named (or a ping came from) that peers may not send to: loopback,
    /// link-local, the mesh range, ... (`plexsphere_wire::endpoint`); never probed.
    pub unusable: u64,
    /// Messages of another disco version (an older plexd).
    pub other_version: u64,
}

/// Seals and numbers what the engine sends.
struct Sealer {
    pub own: PublicKey,
    /// Disco nonces and tx ids. A nonce must never repeat under a pair key both nodes seal
    /// with: a CSPRNG (`CryptoRngCore`), never a counter.
    pub rng: Box<dyn CryptoRngCore + Send>,
    /// The stamp of the last message sealed.
    pub last_stamp: u64,
    /// The wall clock of the input being handled, in microseconds since the Unix epoch.
    pub wall_micros: u64,
}

impl Sealer {
    /// The next stamp ([`disco::next_stamp`]): strictly increasing.
    pub fn stamp(&mut self) -> u64 {
        self.last_stamp = disco::next_stamp(self.last_stamp, self.wall_micros);
        self.last_stamp
    }

    /// A fresh tx id.
    pub fn tx(&mut self) -> TxId {
        disco::new_tx_from(&mut *self.rng)
    }

    /// `message` sealed under `pair` with the next stamp and a fresh nonce.
    pub fn seal(&mut self, pair: &PairKey, message: &Message) -> Vec<u8> {
        let stamp = self.stamp();
        let nonce = disco::new_nonce_from(&mut *self.rng);
        pair.seal_with_nonce(&self.own, stamp, message, nonce)
    }
}

/// What the engine knows of this node and its relays.
#[derive(Debug, Default)]
struct Local {
    pub addrs: Vec<SocketAddr>,
    pub reflexive: Vec<SocketAddr>,
    pub nat: NatReport,
    pub home: Option<String>,
    pub relays: Vec<RelaySpec>,
    /// Relays with a registered connection, and how.
    pub up: BTreeMap<String, Transport>,
    /// When each relay of `up` last came up: a relayed ping sent before then waited in the
    /// connection's queue for the registration, so its round trip counts from here.
    pub up_since: BTreeMap<String, Instant>,
    /// Relays whose connection was lost or refused, and why (until they come up again).
    pub down: BTreeMap<String, String>,
}

/// The per-node reach state machine; see the module docs.
pub struct Engine {
    /// Our WireGuard private key: each peer's pair key is derived from it once.
    secret: [u8; 32],
    /// The Domain's mesh range: never a candidate (`plexsphere_wire::endpoint`).
    mesh: IpNet,
    /// The subnet routes this node reaches through its peers (`PeerReach::routes`): an
    /// address inside one would be reached through the mesh itself, so it is no candidate
    /// (`Engine::may_send`), unless one of our own addresses is in it too (our own LAN, which
    /// the kernel reaches directly: plexd leaves a connected route in place).
    routed: Vec<IpNet>,
    sealer: Sealer,
    peers: BTreeMap<PublicKey, Peer>,
    local: Local,
    counters: Counters,
    /// What the inputs decided, in order, until the runtime takes it ([`Engine::poll_effect`]).
    effects: VecDeque<Effect>,
}

impl Engine {
    /// An engine for the node with this WireGuard private key in a Domain with this mesh range;
    /// tx ids and disco nonces from `rng`, a CSPRNG on purpose (the OS's in production): both
    /// nodes of a pair seal under one key, so a nonce that repeats would break it.
    pub fn with_rng(secret: [u8; 32], mesh: IpNet, rng: Box<dyn CryptoRngCore + Send>) -> Self {
        Self {
            secret,
            mesh,
            routed: Vec::new(),
            sealer: Sealer {
                own: plexsphere_wire::reach::public_key(&secret),
                rng,
                last_stamp: 0,
                wall_micros: 0,
            },
            peers: BTreeMap::new(),
            local: Local::default(),
            counters: Counters::default(),
            effects: VecDeque::new(),
        }
    }

    /// A key rotation: all but the random source starts over, under the new key.
    pub fn rekey(&mut self, secret: [u8; 32]) {
        self.secret = secret;
        self.sealer.own = plexsphere_wire::reach::public_key(&secret);
        self.sealer.last_stamp = 0;
        self.peers.clear();
        self.local = Local::default();
        self.counters = Counters::default();
        self.effects.clear();
    }

    /// The same from a seed: every tx id and nonce, and so every effect, repeats for the same
    /// seed and inputs (tests and the simulator only).
    #[cfg(test)]
    pub fn seeded(secret: [u8; 32], mesh: IpNet, seed: u64) -> Self {
        Self::with_rng(
            secret,
            mesh,
            Box::new(plexsphere_test_support::seeded::SeededRng::new(seed)),
        )
    }

    /// Takes one input; what to do is queued for [`Self::poll_effect`].
    pub fn handle(&mut self, input: Input, now: Now) {
        let mut out = Vec::new();
        let t = now.at;
        self.sealer.wall_micros = now
            .wall
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        // A disco message or a relay's "not registered" concerns one peer: only its path is
        // chosen again (the sender key is read unauthenticated, only to pick the peer).
        let only: Option<Option<PublicKey>> = match &input {
            Input::DiscoDirect { datagram, .. } | Input::DiscoRelayed { datagram, .. } => {
                Some(disco::sender(datagram).ok())
            }
            Input::PeerGone { dst, .. } => Some(Some(*dst)),
            _ => None,
        };
        match input {
            Input::Peers(peers) => self.set_peers(peers, t, &mut out),
            Input::Relays(relays) => {
                self.local.relays = relays;
                let names: Vec<String> = self.local.relays.iter().map(|r| r.name.clone()).collect();
                self.local.up.retain(|r, _| names.contains(r));
                self.local.up_since.retain(|r, _| names.contains(r));
                self.local.down.retain(|r, _| names.contains(r));
            }
            Input::LocalAddrs(addrs) => {
                if addrs != self.local.addrs {
                    self.local.addrs = addrs;
                    out.push(self.candidates());
                    self.probe_all(t, &mut out);
                }
            }
            Input::Reflexive { addrs, nat } => {
                if addrs != self.local.reflexive || nat != self.local.nat {
                    self.local.reflexive = addrs;
                    self.local.nat = nat;
                    out.push(self.candidates());
                    self.probe_all(t, &mut out);
                }
            }
            Input::HomeRelay(home) => {
                if home != self.local.home {
                    self.local.home = home;
                    out.push(self.candidates());
                }
            }
            Input::NetworkChanged => self.probe_all(t, &mut out),
            Input::DiscoDirect { from, datagram } => {
                self.disco_direct(from, &datagram, t, &mut out)
            }
            Input::DiscoRelayed {
                relay,
                src,
                datagram,
            } => self.disco_relayed(&relay, src, &datagram, t, &mut out),
            Input::RelayUp {
                relay, transport, ..
            } => {
                self.local.down.remove(&relay);
                // A re-registration of a connection that stayed up is no new start.
                if !self.local.up.contains_key(&relay) {
                    self.local.up_since.insert(relay.clone(), t);
                }
                if self.local.up.insert(relay, transport) != Some(transport) {
                    out.push(self.candidates());
                }
            }
            // A peer on that relay loses its path; `choose_all` probes it through the others.
            Input::RelayDown { relay, why } => {
                self.local.up.remove(&relay);
                self.local.up_since.remove(&relay);
                self.local.down.insert(relay, why);
            }
            Input::PeerGone { relay, dst } => {
                if let Some(peer) = self.peers.get_mut(&dst) {
                    peer.gone.insert(relay, t);
                }
            }
            // The engine decides on disco alone; it keeps handshakes for the path report.
            Input::Handshakes(hs) => {
                for (key, at) in hs {
                    if let Some(peer) = self.peers.get_mut(&key) {
                        peer.handshake = at;
                    }
                }
            }
            Input::Tick => self.tick(t, &mut out),
        }
        match only {
            None => self.choose_all(t, &mut out),
            Some(Some(key)) => self.choose_peer(key, t, &mut out),
            Some(None) => {}
        }
        self.effects.extend(out);
    }

    /// The next effect decided on, in the order decided; `None` once every one was taken.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// Handles `input` and takes every effect queued (tests and the simulation read them as
    /// one list).
    #[cfg(test)]
    pub(crate) fn step(&mut self, input: Input, now: Now) -> Vec<Effect> {
        self.handle(input, now);
        std::iter::from_fn(|| self.poll_effect()).collect()
    }

    /// Every peer's path, for `plexd status`, by hostname.
    pub fn paths(&self) -> Vec<PeerPathView> {
        let mut views: Vec<PeerPathView> = self
            .peers
            .iter()
            .map(|(key, p)| PeerPathView {
                public_key: key.to_base64(),
                hostname: p.reach.hostname.clone(),
                path: p.path.clone(),
                rtt_ms: p
                    .rtt
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                reason: p.reason.clone(),
                node_id: p.reach.node_id,
                last_handshake: p.handshake,
            })
            .collect();
        views.sort_by(|a, b| a.hostname.cmp(&b.hostname));
        views
    }

    /// What the engine dropped so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// This node's own candidates as the endpoint report should carry them.
    pub fn own_candidates(&self) -> super::io::OwnCandidates {
        super::io::OwnCandidates {
            reflexive: self.local.reflexive.clone(),
            home_relay: self.local.home.clone(),
            nat: self.local.nat.clone(),
        }
    }

    /// The key `peer` and we seal our disco messages with.
    fn pair_key(&self, peer: &PublicKey) -> disco::PairKey {
        let shared = plexsphere_wire::reach::shared_secret(&self.secret, peer);
        disco::PairKey::new(&shared)
    }

    fn candidates(&self) -> Effect {
        let own = self.own_candidates();
        Effect::Candidates {
            reflexive: own.reflexive,
            home_relay: own.home_relay,
            nat: own.nat,
        }
    }
}

impl Engine {
    /// The wanted peer a datagram is from and what it says, once per stamp; anything else is
    /// dropped and counted. A relayed datagram must be sealed by the relay's source.
    fn open(&mut self, src: Option<PublicKey>, datagram: &[u8]) -> Option<(PublicKey, Message)> {
        let sender = match disco::sender(datagram) {
            Ok(sender) => sender,
            Err(DecodeError::Version(v)) => {
                self.other_version(v, datagram);
                return None;
            }
            Err(_) => {
                self.counters.unknown_sender += 1;
                return None;
            }
        };
        let key = sender;
        if src.is_some_and(|s| s != key) {
            self.counters.unauthentic += 1;
            return None;
        }
        let Some(peer) = self.peers.get_mut(&key) else {
            self.counters.unknown_sender += 1;
            return None;
        };
        match peer.pair.open(datagram) {
            Ok(opened) if peer.replay.accept(opened.stamp) => Some((key, opened.message)),
            Ok(_) => {
                self.counters.replayed += 1;
                None
            }
            Err(_) => {
                self.counters.unauthentic += 1;
                None
            }
        }
    }

    /// A disco datagram of version `v`: counted, and said once per wanted peer (its key is
    /// where every version put it), since the pair stays off the direct path until both
    /// sides speak this version.
    fn other_version(&mut self, v: u8, datagram: &[u8]) {
        self.counters.other_version += 1;
        let Some(key) = datagram
            .get(4..36)
            .and_then(|k| <[u8; 32]>::try_from(k).ok())
        else {
            return;
        };
        let key = PublicKey(key);
        if let Some(peer) = self.peers.get_mut(&key)
            && !peer.warned_version
        {
            peer.warned_version = true;
            tracing::warn!(
                peer = %peer.reach.hostname,
                key = %key,
                "{}: its disco messages are version {v}, this plexd speaks version {} (replay-protected); the pair stays on a relay until {} runs this plexd version too",
                peer.reach.hostname,
                plexsphere_wire::reach::DISCO_VERSION,
                peer.reach.hostname
            );
        }
    }
}
