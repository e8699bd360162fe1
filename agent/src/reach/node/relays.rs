//! The relay set as a sans-IO machine: the state's relays as usable ones (a key, a UDP
//! address, a TLS address), one connection ([`RelayConn`]) to each in use, in a `BTreeMap` so
//! every pass visits them in one order, which of them is home, the move to TCP with TLS (the
//! relay has no UDP address, the last STUN run said UDP is blocked, or the relay never answered
//! over UDP), idle closes, the replay floors, the relay token. No sockets, no clock: the
//! runtime hands it what arrived with the time and carries out [`RelayOut`]s
//! ([`RelaySet::poll_out`]) until it answers `None`; the TCP links themselves stay the
//! runtime's (it opens one on [`RelayOut::OpenTcp`] and reports its end with
//! [`RelaySet::handle_tcp_closed`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use plexsphere_wire::key::PublicKey;
use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::reach::relay::{Frame, KeyPrefix};

use crate::reach::io::{Input, Transport};
use crate::reach::relay_client::{Identity, Note, RelayConn};

/// A relay connection other than the home relay's closes after this long unused.
pub const RELAY_IDLE: Duration = Duration::from_secs(60);

/// One relay of the state this node can use.
#[derive(Debug, Clone)]
pub struct Relay {
    pub spec: RelaySpec,
    pub key: PublicKey,
    pub udp: Option<SocketAddr>,
    /// The TLS address and the name its certificate must carry.
    pub tls: Option<(SocketAddr, String)>,
}

/// What the runtime carries out for the relay set, in order.
#[derive(Debug)]
pub enum RelayOut {
    /// A frame to the relay's UDP address.
    Udp { to: SocketAddr, frame: Frame },
    /// A frame on the relay's TCP connection.
    Tcp { relay: String, frame: Frame },
    /// Open a TCP connection with TLS to the relay (its certificate must name `server_name`).
    OpenTcp {
        relay: String,
        addr: SocketAddr,
        server_name: String,
    },
    /// Close the relay's TCP connection (without reporting its end back).
    CloseTcp { relay: String },
    /// The relay's transport changed: carry the peers relayed through it anew.
    Reroute { relay: String },
    /// An input for the engine.
    Engine(Input),
    /// A datagram a peer sent through the relay, from the peer whose key starts with `src`.
    Recv {
        relay: String,
        src: KeyPrefix,
        payload: Vec<u8>,
    },
    /// The relay says the peer whose key starts with `dst` is not registered with it.
    PeerGone { relay: String, dst: KeyPrefix },
    /// A frame that is not part of any connection was dropped (counted as an unknown source).
    Dropped,
}

/// The relay set; see the module docs.
pub struct RelaySet {
    id: Identity,
    /// Whether this node has TLS trust for relays (without it, relays are UDP only).
    tls_trust: bool,
    relays: Vec<Relay>,
    conns: BTreeMap<String, RelayConn>,
    /// Relays whose connection runs over TCP with TLS (a link was asked for).
    over_tcp: BTreeSet<String>,
    /// The last sealed-frame counter accepted from each relay: a new connection to it goes on
    /// from there, so frames captured earlier stay replays.
    floors: BTreeMap<String, u64>,
    /// The home candidate: an index into `relays`.
    home: usize,
    /// The home relay the engine was told of.
    home_up: Option<String>,
    udp_blocked: bool,
    token: Option<Vec<u8>>,
    said_tcp_only: bool,
    out: VecDeque<RelayOut>,
    /// UDP frames for a connection over TCP, dropped.
    pub udp_for_tcp: u64,
}

impl RelaySet {
    /// A TLS link whose relay no longer has a connection closes (`RelayOut::CloseTcp`).
    fn close_tcp_without_a_connection(&mut self) {
        let gone: Vec<String> = self
            .over_tcp
            .iter()
            .filter(|name| !self.conns.contains_key(*name))
            .cloned()
            .collect();
        for relay in gone {
            self.over_tcp.remove(&relay);
            self.out.push_back(RelayOut::CloseTcp { relay });
        }
    }

    pub fn new(secret: [u8; 32], tls_trust: bool) -> Self {
        Self {
            id: Identity::new(secret),
            tls_trust,
            relays: Vec::new(),
            conns: BTreeMap::new(),
            over_tcp: BTreeSet::new(),
            floors: BTreeMap::new(),
            home: 0,
            home_up: None,
            udp_blocked: false,
            token: None,
            said_tcp_only: false,
            out: VecDeque::new(),
            udp_for_tcp: 0,
        }
    }

    /// The next thing to carry out.
    pub fn poll_out(&mut self) -> Option<RelayOut> {
        self.out.pop_front()
    }

    /// When [`Self::handle_timeout`] next has something to do (a connection's retry,
    /// keepalive, give-up, ...); the home connection and idle closes are checked with it and
    /// on the runtime's tick.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns
            .values()
            .filter_map(RelayConn::poll_timeout)
            .min()
    }

    /// The relays, in the state's order.
    pub fn relays(&self) -> &[Relay] {
        &self.relays
    }

    /// The relays with a connection now, by name, in order.
    pub fn connections(&self) -> Vec<String> {
        self.conns.keys().cloned().collect()
    }

    pub fn has(&self, name: &str) -> bool {
        self.relay(name).is_some()
    }

    fn relay(&self, name: &str) -> Option<&Relay> {
        self.relays.iter().find(|r| r.spec.name == name)
    }

    /// The relay's UDP address.
    pub fn udp_of(&self, name: &str) -> Option<SocketAddr> {
        self.relay(name).and_then(|r| r.udp)
    }

    /// Whether the relay's connection runs over TCP.
    pub fn is_over_tcp(&self, name: &str) -> bool {
        self.over_tcp.contains(name)
    }

    /// The UDP addresses of the relays with a connection over UDP (registered or registering):
    /// the ones whose frames the data plane may unwrap. Sorted, without duplicates.
    pub fn plane_relays(&self) -> Vec<SocketAddr> {
        let mut relays: Vec<SocketAddr> = self
            .conns
            .keys()
            .filter(|name| !self.over_tcp.contains(*name))
            .filter_map(|name| self.udp_of(name))
            .collect();
        relays.sort();
        relays.dedup();
        relays
    }

    /// The state's relays. Answers whether the usable set changed (STUN then runs again).
    pub fn handle_relays(&mut self, specs: Vec<RelaySpec>) -> bool {
        let mut relays = Vec::new();
        for spec in &specs {
            let Ok(key) = PublicKey::from_base64(&spec.public_key) else {
                tracing::warn!(relay = %spec.name, "relay {}: its public key is not base64 of 32 bytes; not used", spec.name);
                continue;
            };
            let tls = match (spec.tls, &spec.tls_server_name) {
                (Some(a), Some(n)) => Some((a, n.clone())),
                _ => None,
            };
            if spec.udp.is_none() && (tls.is_none() || !self.tls_trust) {
                if !self.said_tcp_only {
                    self.said_tcp_only = true;
                    tracing::warn!(relay = %spec.name, "relay {} has no UDP address, and no TLS address with a server name (or this node has no TLS trust for relays); not used", spec.name);
                }
                continue;
            }
            relays.push(Relay {
                spec: spec.clone(),
                key,
                udp: spec.udp,
                tls,
            });
        }
        let changed = relays.len() != self.relays.len()
            || relays
                .iter()
                .zip(&self.relays)
                .any(|(a, b)| a.spec != b.spec);
        if changed {
            self.conns
                .retain(|name, _| relays.iter().any(|r| r.spec.name == *name));
            self.close_tcp_without_a_connection();
            self.relays = relays;
            self.home = 0;
            self.out.push_back(RelayOut::Engine(Input::Relays(specs)));
        }
        changed
    }

    /// A new relay token (the JSON of its signed envelope), for every connection.
    pub fn handle_token(&mut self, token: Vec<u8>) {
        for c in self.conns.values_mut() {
            c.handle_token(token.clone());
        }
        self.token = Some(token);
    }

    /// What the last STUN run said: whether UDP is blocked (new connections start over TCP).
    pub fn handle_udp_blocked(&mut self, blocked: bool) {
        self.udp_blocked = blocked;
    }

    /// A key rotation: every connection registers again under the new key.
    pub fn handle_secret(&mut self, secret: [u8; 32]) {
        self.id = Identity::new(secret);
        self.conns.clear();
        for relay in std::mem::take(&mut self.over_tcp) {
            self.out.push_back(RelayOut::CloseTcp { relay });
        }
        self.home_up = None;
        let specs: Vec<RelaySpec> = self.relays.iter().map(|r| r.spec.clone()).collect();
        if !specs.is_empty() {
            self.out.push_back(RelayOut::Engine(Input::Relays(specs)));
        }
    }

    /// A datagram through relay `relay` to `dst`: sent, or queued until it registers. `false`
    /// when the state has no such relay.
    pub fn handle_send(
        &mut self,
        relay: &str,
        dst: PublicKey,
        datagram: Vec<u8>,
        now: Instant,
    ) -> bool {
        let Some(conn) = self.conn(relay, now) else {
            return false;
        };
        conn.handle_send(dst, datagram, now);
        self.drain(relay, now);
        true
    }

    /// A path through `relay` was chosen: its connection opens (over TCP when `transport`
    /// says so). `false` when the state has no such relay.
    pub fn handle_path(&mut self, relay: &str, transport: Transport, now: Instant) -> bool {
        if self.conn(relay, now).is_none() {
            return false;
        }
        if transport == Transport::Tcp {
            self.open_tcp(relay, now);
        }
        true
    }

    /// A relay frame that arrived over UDP from `from`.
    pub fn handle_udp_frame(&mut self, frame: Frame, from: SocketAddr, now: Instant) {
        let Some(name) = self
            .relays
            .iter()
            .find(|r| r.udp == Some(from))
            .map(|r| r.spec.name.clone())
        else {
            tracing::trace!(%from, "relay frame from an address no relay has; dropped");
            return;
        };
        if self.over_tcp.contains(&name) {
            // The connection runs over TCP with TLS: a UDP frame from the relay's address is
            // not part of it (a spoofer's, or a late one).
            self.udp_for_tcp += 1;
            self.out.push_back(RelayOut::Dropped);
            tracing::trace!(relay = %name, "UDP relay frame for a connection over TCP; dropped");
            return;
        }
        self.handle_frame(&name, frame, now);
    }

    /// A relay frame that arrived on the relay's TCP connection.
    pub fn handle_tcp_frame(&mut self, relay: &str, frame: Frame, now: Instant) {
        self.handle_frame(relay, frame, now);
    }

    /// The relay's TCP connection ended (or could not open): back to UDP, retried later.
    pub fn handle_tcp_closed(&mut self, relay: &str, why: &str, now: Instant) {
        self.over_tcp.remove(relay);
        self.out.push_back(RelayOut::Reroute {
            relay: relay.to_owned(),
        });
        if let Some(c) = self.conns.get_mut(relay) {
            c.handle_lost(format!("the TCP connection ended: {why}"), now);
            self.drain(relay, now);
        }
    }

    /// Time passed: the home candidate keeps a connection, the others close when idle, and
    /// every connection's timers run.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(home) = self.relays.get(self.home).map(|r| r.spec.name.clone()) {
            let _ = self.conn(&home, now);
            self.conns.retain(|name, c| {
                *name == home || now.saturating_duration_since(c.last_used) < RELAY_IDLE
            });
            self.close_tcp_without_a_connection();
        }
        let names: Vec<String> = self.conns.keys().cloned().collect();
        for name in names {
            let Some(c) = self.conns.get_mut(&name) else {
                continue;
            };
            c.handle_timeout(&self.id, now);
            self.drain(&name, now);
        }
    }

    /// The connection to relay `name`, opened on demand (over TCP first when the relay has no
    /// UDP address or UDP is blocked).
    fn conn(&mut self, name: &str, now: Instant) -> Option<&mut RelayConn> {
        if !self.conns.contains_key(name) {
            let r = self.relay(name)?;
            let tcp_first = r.udp.is_none() || self.udp_blocked;
            let mut c = RelayConn::new(name.to_owned(), r.key, self.token.clone(), now);
            c.resume_counter(self.floors.get(name).copied().unwrap_or(0));
            self.conns.insert(name.to_owned(), c);
            if tcp_first {
                self.open_tcp(name, now);
            }
        }
        self.conns.get_mut(name)
    }

    /// Moves relay `name` to TCP with TLS; `false` when it has no TLS address or this node no
    /// TLS trust.
    fn open_tcp(&mut self, name: &str, now: Instant) -> bool {
        if self.over_tcp.contains(name) {
            return true;
        }
        if !self.tls_trust {
            return false;
        }
        let Some(r) = self.relay(name) else {
            return false;
        };
        let Some((addr, server_name)) = r.tls.clone() else {
            return false;
        };
        let key = r.key;
        tracing::info!(relay = name, %addr, "relay {name}: over TCP with TLS to {addr}");
        self.over_tcp.insert(name.to_owned());
        self.out.push_back(RelayOut::OpenTcp {
            relay: name.to_owned(),
            addr,
            server_name,
        });
        let mut c = RelayConn::new(name.to_owned(), key, self.token.clone(), now);
        c.resume_counter(self.floors.get(name).copied().unwrap_or(0));
        self.conns.insert(name.to_owned(), c);
        self.out.push_back(RelayOut::Reroute {
            relay: name.to_owned(),
        });
        true
    }

    fn send_frame(&mut self, relay: &str, frame: Frame) {
        if self.over_tcp.contains(relay) {
            self.out.push_back(RelayOut::Tcp {
                relay: relay.to_owned(),
                frame,
            });
        } else if let Some(to) = self.udp_of(relay) {
            self.out.push_back(RelayOut::Udp { to, frame });
        }
    }

    fn handle_frame(&mut self, name: &str, frame: Frame, now: Instant) {
        let Some(conn) = self.conns.get_mut(name) else {
            return;
        };
        conn.handle_frame(frame, &self.id, now);
        self.floors.insert(name.to_owned(), conn.counter());
        self.drain(name, now);
    }

    /// Carries out what relay `name`'s connection queued for its last input: its frames, then
    /// its notes (within one input the connection makes its frames before its notes). The
    /// notes are taken first and then acted on, because a note can replace the connection (a
    /// `Down` unanswered over UDP opens one over TCP) and the rest still count.
    fn drain(&mut self, name: &str, now: Instant) {
        while let Some(frame) = self.conns.get_mut(name).and_then(RelayConn::poll_transmit) {
            self.send_frame(name, frame);
        }
        let notes: Vec<Note> = match self.conns.get_mut(name) {
            Some(c) => std::iter::from_fn(|| c.poll_note()).collect(),
            None => Vec::new(),
        };
        self.notes(name, notes, now);
    }

    fn notes(&mut self, relay: &str, notes: Vec<Note>, now: Instant) {
        for n in notes {
            match n {
                Note::Up { rtt } => {
                    tracing::info!(relay, "registered with relay {relay}");
                    let transport = if self.over_tcp.contains(relay) {
                        Transport::Tcp
                    } else {
                        Transport::Udp
                    };
                    self.out.push_back(RelayOut::Engine(Input::RelayUp {
                        relay: relay.to_owned(),
                        transport,
                        rtt,
                    }));
                    let home = self.relays.get(self.home).map(|r| r.spec.name.as_str());
                    if home == Some(relay) && self.home_up.as_deref() != Some(relay) {
                        self.home_up = Some(relay.to_owned());
                        self.out
                            .push_back(RelayOut::Engine(Input::HomeRelay(Some(relay.to_owned()))));
                    }
                }
                Note::Down { why, unanswered } => {
                    if unanswered && !self.over_tcp.contains(relay) && self.open_tcp(relay, now) {
                        tracing::info!(relay, "relay {relay}: {why} over UDP; trying TCP");
                        continue;
                    }
                    tracing::warn!(relay, "relay {relay} is down: {why}");
                    self.out.push_back(RelayOut::Engine(Input::RelayDown {
                        relay: relay.to_owned(),
                        why,
                    }));
                    let home = self.relays.get(self.home).map(|r| r.spec.name.clone());
                    if home.as_deref() == Some(relay) && !self.relays.is_empty() {
                        // The next relay of the state becomes the home candidate.
                        self.home = (self.home + 1) % self.relays.len();
                        if self.home_up.take().is_some() {
                            self.out.push_back(RelayOut::Engine(Input::HomeRelay(None)));
                        }
                    }
                }
                Note::Recv { src, payload } => self.out.push_back(RelayOut::Recv {
                    relay: relay.to_owned(),
                    src,
                    payload,
                }),
                Note::PeerGone { dst } => self.out.push_back(RelayOut::PeerGone {
                    relay: relay.to_owned(),
                    dst,
                }),
            }
        }
    }
}
