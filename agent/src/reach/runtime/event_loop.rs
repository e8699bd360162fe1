//! The runtime's loop: one thread, one queue, the engine's effects performed in order. See
//! `mod.rs` for what comes in and goes out.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use base64::Engine as _;
use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::reach::relay::{Frame, KeyPrefix, prefix};
use plexsphere_wire::reach::{Kind, MAX_DATAGRAM, classify};

use super::shared::{
    ADDRS_EVERY, Event, HANDSHAKES_EVERY, Mode, RELAY_IDLE, RuntimeSetup, STUN_EVERY, Shared, lock,
    offer,
};
use crate::peer_key::PeerKey;
use crate::reach::engine::Engine;
use crate::reach::forward::{Forwarder, Route};
use crate::reach::io::{Effect, Input, Now, Path, PeerReach, TICK, Transport};
use crate::reach::relay_client::tcp::{TcpEvent, TcpLink};
use crate::reach::relay_client::{Identity, Note, RelayConn};
use crate::reach::stun::{self, Poll, StunProbe};

struct Relay {
    spec: RelaySpec,
    key: [u8; 32],
    udp: Option<SocketAddr>,
    /// The TLS address and the name its certificate must carry.
    tls: Option<(SocketAddr, String)>,
}

struct Fwd {
    fwd: Arc<Forwarder>,
    thread: Option<JoinHandle<()>>,
}

/// A forwarder that goes away stops its thread, which ends by itself within its poll (no
/// join: removing a thousand peers at once must not wait for a thousand polls in turn).
impl Drop for Fwd {
    fn drop(&mut self) {
        self.fwd.stop();
        drop(self.thread.take());
    }
}

pub(crate) struct Loop {
    engine: Engine,
    setup: RuntimeSetup,
    shared: Arc<Shared>,
    id: Identity,
    relays: Vec<Relay>,
    stun_servers: Vec<SocketAddr>,
    conns: HashMap<String, RelayConn>,
    /// Relays whose connection runs over TCP with TLS.
    links: HashMap<String, TcpLink>,
    /// The last sealed-frame counter accepted from each relay: a new connection to it goes on
    /// from there, so frames captured earlier stay replays.
    floors: HashMap<String, u64>,
    /// The relay each relayed peer goes through (its forwarder's, or the data plane's relay
    /// endpoint's).
    relayed: HashMap<PeerKey, String>,
    /// The relays the data plane unwraps frames from, as last told (`PathControl::set_relays`).
    plane_relays: Vec<SocketAddr>,
    udp_blocked: bool,
    home: usize,
    home_up: Option<String>,
    token: Option<Vec<u8>>,
    peers: Vec<PeerReach>,
    /// Each wanted peer by its key prefix (relays name the sender of a datagram by it); a
    /// prefix two peers share maps to neither.
    by_prefix: HashMap<KeyPrefix, Option<PeerKey>>,
    fwds: HashMap<PeerKey, Fwd>,
    probe: Option<StunProbe>,
    next_stun: Instant,
    local: Vec<IpAddr>,
    next_addrs: Instant,
    next_handshakes: Instant,
    next_tick: Instant,
    said_tcp_only: bool,
}

fn now() -> Now {
    Now::system()
}

fn random_id() -> [u8; 12] {
    use rand_core::RngCore as _;
    let mut id = [0u8; 12];
    rand_core::OsRng.fill_bytes(&mut id);
    id
}

impl Loop {
    pub(crate) fn new(setup: RuntimeSetup, shared: Arc<Shared>) -> Self {
        let t = Instant::now();
        Self {
            engine: Engine::new(setup.secret, setup.mesh),
            id: Identity::new(setup.secret),
            setup,
            shared,
            relays: Vec::new(),
            stun_servers: Vec::new(),
            conns: HashMap::new(),
            links: HashMap::new(),
            floors: HashMap::new(),
            relayed: HashMap::new(),
            plane_relays: Vec::new(),
            udp_blocked: false,
            home: 0,
            home_up: None,
            token: None,
            peers: Vec::new(),
            by_prefix: HashMap::new(),
            fwds: HashMap::new(),
            probe: None,
            next_stun: t,
            local: Vec::new(),
            next_addrs: t,
            next_handshakes: t,
            next_tick: t,
            said_tcp_only: false,
        }
    }

    pub(crate) fn run(mut self, rx: &Receiver<Event>) {
        tracing::debug!(mode = ?self.setup.mode, port = (self.setup.listen_port)(), "reach runtime started");
        while !self.shared.stop.load(Ordering::Relaxed) {
            // A punch the engine timed, a relay connection's retry or keepalive and a STUN
            // retry wake the loop before the tick (their `poll_timeout`).
            let next = [self.engine.poll_timeout(), self.relays_due()]
                .into_iter()
                .flatten()
                .min();
            let wait = next.map_or(TICK, |at| {
                at.saturating_duration_since(Instant::now()).min(TICK)
            });
            match rx.recv_timeout(wait) {
                Ok(Event::Datagram { datagram, from }) => self.datagram(&datagram, from),
                Ok(Event::Tcp { relay, event }) => self.tcp(relay, event),
                Ok(Event::Wake) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            // Whatever else queued up meanwhile, without waiting.
            while let Ok(ev) = rx.try_recv() {
                match ev {
                    Event::Datagram { datagram, from } => self.datagram(&datagram, from),
                    Event::Tcp { relay, event } => self.tcp(relay, event),
                    Event::Wake => {}
                }
            }
            // Datagrams (relayed WireGuard among them) wake the loop often; the timers and the
            // published views run once per tick.
            let changed = self.pending();
            if changed || Instant::now() >= self.next_tick {
                self.next_tick = Instant::now() + TICK;
                self.timers();
                self.publish();
            } else {
                let t = Instant::now();
                if self.engine.poll_timeout().is_some_and(|at| at <= t) {
                    self.input(Input::Tick);
                }
                if self.relays_due().is_some_and(|at| at <= t) {
                    self.stun(t);
                    self.relays_tick(t);
                }
            }
            self.sync_plane_relays();
        }
        self.fwds.clear();
        self.links.clear();
        tracing::debug!("reach runtime stopped");
    }

    fn input(&mut self, input: Input) {
        self.engine.handle(input, now());
        while let Some(e) = self.engine.poll_effect() {
            self.perform(e);
        }
    }

    /// Takes what the daemon stored; answers whether there was anything.
    fn pending(&mut self) -> bool {
        let p = std::mem::take(&mut *lock(&self.shared.pending));
        let any = p.peers.is_some()
            || p.relays.is_some()
            || p.token.is_some()
            || p.secret.is_some()
            || !p.effects.is_empty();
        // Before the token: a rotation's new token goes to the connections of the new key.
        if let Some(secret) = p.secret {
            self.rekey(secret);
        }
        if let Some(token) = p.token {
            match serde_json::to_vec(&token) {
                Ok(bytes) => {
                    for c in self.conns.values_mut() {
                        c.set_token(bytes.clone());
                    }
                    self.token = Some(bytes);
                }
                Err(e) => tracing::warn!("cannot encode the relay token: {e}"),
            }
        }
        if let Some((relays, stun)) = p.relays {
            self.set_relays(relays, stun);
        }
        if let Some(peers) = p.peers {
            self.set_peers(peers);
        }
        for e in p.effects {
            self.perform(e);
        }
        any
    }

    /// A key rotation: the disco keys and relay registrations derive from the WireGuard key,
    /// so the engine starts over with the new one (its paths are probed again), every relay
    /// connection registers again, and relayed peers hold until a path is chosen anew.
    fn rekey(&mut self, secret: [u8; 32]) {
        tracing::info!(
            "reach: the WireGuard key rotated; registering with the relays again and probing every path with the new key"
        );
        self.setup.secret = secret;
        self.engine = Engine::new(secret, self.setup.mesh);
        self.id = Identity::new(secret);
        self.conns.clear();
        self.links.clear();
        self.home_up = None;
        for (peer, _) in std::mem::take(&mut self.relayed) {
            if let Some(f) = self.fwds.get(&peer) {
                f.fwd.set_route(Route::Hold);
            }
        }
        let specs: Vec<RelaySpec> = self.relays.iter().map(|r| r.spec.clone()).collect();
        if !specs.is_empty() {
            self.input(Input::Relays(specs));
        }
        // The next timer pass hands the engine the local addresses again.
        self.local.clear();
        self.next_addrs = Instant::now();
        let peers = self.peers.clone();
        self.input(Input::Peers(peers));
    }

    fn set_relays(&mut self, specs: Vec<RelaySpec>, stun: Vec<SocketAddr>) {
        let mut relays = Vec::new();
        for spec in &specs {
            let key = base64::engine::general_purpose::STANDARD
                .decode(spec.public_key.trim())
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok());
            let Some(key) = key else {
                tracing::warn!(relay = %spec.name, "relay {}: its public key is not base64 of 32 bytes; not used", spec.name);
                continue;
            };
            let tls = match (spec.tls, &spec.tls_server_name) {
                (Some(a), Some(n)) => Some((a, n.clone())),
                _ => None,
            };
            if spec.udp.is_none() && (tls.is_none() || self.setup.tls.is_none()) {
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
        let stun_changed = stun != self.stun_servers;
        self.stun_servers = stun;
        if changed {
            self.conns
                .retain(|name, _| relays.iter().any(|r| r.spec.name == *name));
            let conns = &self.conns;
            self.links.retain(|name, _| conns.contains_key(name));
            self.relays = relays;
            self.home = 0;
            self.input(Input::Relays(specs));
        }
        if changed || stun_changed {
            self.next_stun = Instant::now();
        }
    }

    /// The wanted peer whose key starts with `p`, unless two share it.
    fn key_of(&self, p: &KeyPrefix) -> Option<PeerKey> {
        self.by_prefix.get(p).copied().flatten()
    }

    fn set_peers(&mut self, peers: Vec<PeerReach>) {
        if self.setup.mode == Mode::Kernel {
            // Every peer is carried by a forwarder; a new one starts at its first candidate.
            for p in &peers {
                if !self.fwds.contains_key(&p.key)
                    && let Some(f) = self.forwarder(p.key)
                    && let Some(ep) = p.endpoints.first()
                {
                    f.set_route(Route::Direct(*ep));
                    self.index_direct(p.key, Some(*ep), &f);
                }
            }
        }
        // Sets, not lists: a change at 10k peers must not cost 10k x 10k comparisons.
        let wanted: HashSet<PeerKey> = peers.iter().map(|p| p.key).collect();
        self.fwds.retain(|k, _| wanted.contains(k));
        {
            let mut owners = self
                .shared
                .owners
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            owners.retain(|k, _| wanted.contains(k));
        }
        let live: HashSet<_> = self.fwds.values().map(|x| Arc::as_ptr(&x.fwd)).collect();
        self.shared
            .by_direct
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, f| live.contains(&Arc::as_ptr(f)));
        self.by_prefix.clear();
        for p in &peers {
            self.by_prefix
                .entry(prefix(&p.key.0))
                .and_modify(|k| *k = None)
                .or_insert(Some(p.key));
        }
        self.peers = peers.clone();
        self.input(Input::Peers(peers));
    }

    /// The peer's forwarder, opened (and made its endpoint) if it has none.
    fn forwarder(&mut self, peer: PeerKey) -> Option<Arc<Forwarder>> {
        if let Some(f) = self.fwds.get(&peer) {
            return Some(f.fwd.clone());
        }
        let opened = Forwarder::open((self.setup.wg_port)()).and_then(|f| {
            let t = f.spawn(self.setup.underlay.clone())?;
            Ok((f, t))
        });
        let (f, thread) = match opened {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(peer_key = %peer, "cannot open a loopback forwarder: {e}");
                return None;
            }
        };
        self.set_endpoint(peer, f.addr());
        self.fwds.insert(
            peer,
            Fwd {
                fwd: f.clone(),
                thread: Some(thread),
            },
        );
        Some(f)
    }

    fn set_endpoint(&mut self, peer: PeerKey, endpoint: SocketAddr) {
        if let Err(e) = self.setup.control.set_endpoint(peer, endpoint) {
            tracing::warn!(peer_key = %peer, %endpoint, "cannot set the peer's endpoint: {e}");
        }
        self.shared
            .owners
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(peer, Some(endpoint));
    }

    fn index_direct(&self, peer: PeerKey, ep: Option<SocketAddr>, f: &Arc<Forwarder>) {
        let mut by = self
            .shared
            .by_direct
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        by.retain(|_, x| !Arc::ptr_eq(x, f));
        if let Some(ep) = ep {
            by.insert(ep, f.clone());
        }
        let _ = peer;
    }

    fn relay_udp(&self, name: &str) -> Option<SocketAddr> {
        self.relays
            .iter()
            .find(|r| r.spec.name == name)
            .and_then(|r| r.udp)
    }

    /// How a forwarder reaches `dst` through relay `name` now.
    fn relay_route(&self, name: &str, dst: PeerKey) -> Route {
        if let Some(link) = self.links.get(name) {
            return Route::RelayTcp {
                link: link.sender(),
                dst: dst.0,
            };
        }
        match self.relay_udp(name) {
            Some(relay) => Route::Relay { relay, dst: dst.0 },
            None => Route::Hold,
        }
    }

    /// Carries the peers relayed through relay `name` over its current transport.
    fn reroute(&mut self, name: &str) {
        let peers: Vec<PeerKey> = self
            .relayed
            .iter()
            .filter(|(_, relay)| relay.as_str() == name)
            .map(|(peer, _)| *peer)
            .collect();
        for peer in peers {
            self.carry_relayed(peer, name);
        }
    }

    /// Carries `peer` through relay `name`: over UDP with the userspace data plane, as the
    /// data plane's own relay endpoint (no forwarder); otherwise (TCP, the kernel, a data
    /// plane that cannot take one more relay) through the peer's forwarder.
    fn carry_relayed(&mut self, peer: PeerKey, name: &str) {
        if self.setup.mode == Mode::Userspace
            && !self.links.contains_key(name)
            && let Some(udp) = self.relay_udp(name)
        {
            match self.setup.control.relay_endpoint(udp, peer) {
                Ok(Some(endpoint)) => {
                    self.fwds.remove(&peer);
                    self.set_endpoint(peer, endpoint);
                    return;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(peer_key = %peer, relay = name, "the data plane cannot carry the peer through relay {name} itself ({e}); using a loopback forwarder");
                }
            }
        }
        if let Some(f) = self.forwarder(peer) {
            f.set_route(self.relay_route(name, peer));
            self.index_direct(peer, None, &f);
        }
    }

    /// Tells the data plane which relays' frames to unwrap: those with a connection over UDP
    /// (registered, or registering). Only when that set changed.
    fn sync_plane_relays(&mut self) {
        if self.setup.mode != Mode::Userspace {
            return;
        }
        let mut relays: Vec<SocketAddr> = self
            .conns
            .keys()
            .filter(|name| !self.links.contains_key(*name))
            .filter_map(|name| self.relay_udp(name))
            .collect();
        relays.sort();
        relays.dedup();
        if relays == self.plane_relays {
            return;
        }
        if let Err(e) = self.setup.control.set_relays(&relays) {
            tracing::warn!(
                "the data plane takes frames from only some relays ({e}); the others' peers use loopback forwarders"
            );
        }
        self.plane_relays = relays;
    }

    /// Moves relay `name` to TCP with TLS; `false` when it has no TLS address or this node no
    /// TLS trust.
    fn open_tcp(&mut self, name: &str, t: Instant) -> bool {
        if self.links.contains_key(name) {
            return true;
        }
        let (Some(tls), Some(r)) = (
            self.setup.tls.clone(),
            self.relays.iter().find(|r| r.spec.name == name),
        ) else {
            return false;
        };
        let Some((addr, server_name)) = r.tls.clone() else {
            return false;
        };
        let key = r.key;
        let shared = self.shared.clone();
        let relay = name.to_owned();
        let link = TcpLink::open(addr, server_name, tls, move |event| {
            let _ = shared.events.try_send(Event::Tcp {
                relay: relay.clone(),
                event,
            });
        });
        match link {
            Ok(link) => {
                tracing::info!(relay = name, %addr, "relay {name}: over TCP with TLS to {addr}");
                self.links.insert(name.to_owned(), link);
                let mut c = RelayConn::new(name.to_owned(), key, self.token.clone(), t);
                c.resume_counter(self.floors.get(name).copied().unwrap_or(0));
                self.conns.insert(name.to_owned(), c);
                self.reroute(name);
                true
            }
            Err(e) => {
                tracing::warn!(
                    relay = name,
                    "cannot start a TCP connection to relay {name}: {e}"
                );
                false
            }
        }
    }

    fn tcp(&mut self, relay: String, event: TcpEvent) {
        match event {
            TcpEvent::Frame(frame) => self.relay_frame(&relay, frame),
            TcpEvent::Closed(why) => {
                self.links.remove(&relay);
                self.reroute(&relay);
                if let Some(c) = self.conns.get_mut(&relay) {
                    let notes = c.lost(format!("the TCP connection ended: {why}"), Instant::now());
                    self.notes(&relay, notes);
                }
            }
        }
    }

    fn perform(&mut self, effect: Effect) {
        match effect {
            Effect::SendDirect { to, datagram } => {
                if let Err(e) = self.setup.underlay.send(&datagram, to) {
                    tracing::trace!(%to, "disco send failed: {e}");
                }
            }
            Effect::SendRelayed {
                relay,
                dst,
                datagram,
            } => {
                let t = Instant::now();
                let Some(conn) = self.conn(&relay, t) else {
                    tracing::debug!(relay = %relay, "no such relay in the state; disco dropped");
                    return;
                };
                if let Some(frame) = conn.send(dst.0, datagram, t) {
                    self.send_frame(&relay, &frame);
                }
            }
            Effect::SetPath { peer, path } => self.set_path(peer, path),
            Effect::Candidates {
                reflexive,
                home_relay,
                nat,
            } => {
                let mut v = lock(&self.shared.view);
                v.own.reflexive = reflexive;
                v.own.home_relay = home_relay;
                v.own.nat = nat;
            }
        }
    }

    fn set_path(&mut self, peer: PeerKey, path: Path) {
        match (self.setup.mode, &path) {
            (_, Path::None) => {}
            (Mode::Userspace, Path::Direct { endpoint }) => {
                // Straight from the WireGuard socket: no forwarder in the way.
                self.relayed.remove(&peer);
                self.fwds.remove(&peer);
                self.set_endpoint(peer, *endpoint);
            }
            (Mode::Kernel, Path::Direct { endpoint }) => {
                self.relayed.remove(&peer);
                if let Some(f) = self.forwarder(peer) {
                    f.set_route(Route::Direct(*endpoint));
                    self.index_direct(peer, Some(*endpoint), &f);
                }
            }
            (_, Path::Relay { relay, transport }) => {
                if !self.relays.iter().any(|r| r.spec.name == *relay) {
                    tracing::warn!(peer_key = %peer, relay = %relay, "the path names a relay the state does not have; unchanged");
                    return;
                }
                let t = Instant::now();
                let _ = self.conn(relay, t);
                if *transport == Transport::Tcp {
                    let _ = self.open_tcp(relay, t);
                }
                self.relayed.insert(peer, relay.clone());
                self.carry_relayed(peer, relay);
            }
        }
        tracing::info!(peer_key = %peer, path = ?path, "reach: path set");
    }

    /// The connection to relay `name`, opened on demand.
    fn conn(&mut self, name: &str, t: Instant) -> Option<&mut RelayConn> {
        if !self.conns.contains_key(name) {
            let r = self.relays.iter().find(|r| r.spec.name == name)?;
            let tcp_first = r.udp.is_none() || self.udp_blocked;
            let mut c = RelayConn::new(name.to_owned(), r.key, self.token.clone(), t);
            c.resume_counter(self.floors.get(name).copied().unwrap_or(0));
            self.conns.insert(name.to_owned(), c);
            if tcp_first {
                self.open_tcp(name, t);
            }
        }
        self.conns.get_mut(name)
    }

    fn send_frame(&self, relay: &str, frame: &Frame) {
        if let Some(link) = self.links.get(relay) {
            if !link.send(frame) {
                tracing::debug!(relay, "the TCP connection's queue is full; frame dropped");
            }
            return;
        }
        if let Some(udp) = self.relay_udp(relay)
            && let Err(e) = self.setup.underlay.send(&frame.to_datagram(), udp)
        {
            tracing::trace!(relay, "relay send failed: {e}");
        }
    }

    fn datagram(&mut self, datagram: &[u8], from: SocketAddr) {
        match classify(datagram) {
            Kind::Stun => {
                if let Some(p) = &mut self.probe {
                    p.handle_datagram(datagram, from);
                }
            }
            Kind::Disco => self.input(Input::DiscoDirect {
                from,
                datagram: datagram.to_vec(),
            }),
            Kind::Relay => {
                let Some(name) = self
                    .relays
                    .iter()
                    .find(|r| r.udp == Some(from))
                    .map(|r| r.spec.name.clone())
                else {
                    tracing::trace!(%from, "relay frame from an address no relay has; dropped");
                    return;
                };
                if self.links.contains_key(&name) {
                    // The connection runs over TCP with TLS: a UDP frame from the relay's
                    // address is not part of it (a spoofer's, or a late one).
                    self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
                    tracing::trace!(relay = %name, "UDP relay frame for a connection over TCP; dropped");
                    return;
                }
                match Frame::from_datagram(datagram) {
                    Ok(f) => self.relay_frame(&name, f),
                    Err(e) => tracing::debug!(relay = %name, "unreadable relay frame: {e}"),
                }
            }
            Kind::WireGuard | Kind::Unknown => {
                self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn relay_frame(&mut self, name: &str, frame: Frame) {
        let t = Instant::now();
        let Some(conn) = self.conns.get_mut(name) else {
            return;
        };
        let (out, notes) = conn.handle_frame(frame, &self.id, t);
        self.floors.insert(name.to_owned(), conn.counter());
        for f in out {
            self.send_frame(name, &f);
        }
        self.notes(name, notes);
    }

    fn notes(&mut self, relay: &str, notes: Vec<Note>) {
        for n in notes {
            match n {
                Note::Up { rtt } => {
                    tracing::info!(relay, "registered with relay {relay}");
                    let transport = if self.links.contains_key(relay) {
                        Transport::Tcp
                    } else {
                        Transport::Udp
                    };
                    self.input(Input::RelayUp {
                        relay: relay.to_owned(),
                        transport,
                        rtt,
                    });
                    let home = self.relays.get(self.home).map(|r| r.spec.name.as_str());
                    if home == Some(relay) && self.home_up.as_deref() != Some(relay) {
                        self.home_up = Some(relay.to_owned());
                        self.input(Input::HomeRelay(Some(relay.to_owned())));
                    }
                }
                Note::Down { why, unanswered } => {
                    if unanswered
                        && !self.links.contains_key(relay)
                        && self.open_tcp(relay, Instant::now())
                    {
                        tracing::info!(relay, "relay {relay}: {why} over UDP; trying TCP");
                        continue;
                    }
                    tracing::warn!(relay, "relay {relay} is down: {why}");
                    self.input(Input::RelayDown {
                        relay: relay.to_owned(),
                        why,
                    });
                    let home = self.relays.get(self.home).map(|r| r.spec.name.clone());
                    if home.as_deref() == Some(relay) && !self.relays.is_empty() {
                        // The next relay of the state becomes the home candidate.
                        self.home = (self.home + 1) % self.relays.len();
                        if self.home_up.take().is_some() {
                            self.input(Input::HomeRelay(None));
                        }
                    }
                }
                Note::Recv { src, payload } => match (classify(&payload), self.key_of(&src)) {
                    (_, None) => {
                        self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
                    }
                    (Kind::WireGuard, Some(src)) => match self.fwds.get(&src) {
                        Some(f) => {
                            if let Err(e) = f.fwd.deliver(&payload) {
                                tracing::trace!("forwarder delivery failed: {e}");
                            }
                        }
                        None => {
                            self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
                        }
                    },
                    (Kind::Disco, Some(src)) => self.input(Input::DiscoRelayed {
                        relay: relay.to_owned(),
                        src,
                        datagram: payload,
                    }),
                    _ => {
                        self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
                    }
                },
                Note::PeerGone { dst } => {
                    if let Some(dst) = self.key_of(&dst) {
                        self.input(Input::PeerGone {
                            relay: relay.to_owned(),
                            dst,
                        });
                    }
                }
            }
        }
    }

    fn timers(&mut self) {
        let t = Instant::now();
        if t >= self.next_addrs {
            self.next_addrs = t + ADDRS_EVERY;
            let mut local = (self.setup.local_addrs)();
            local.sort();
            local.dedup();
            if local != self.local {
                let first = self.local.is_empty();
                self.local = local;
                let port = (self.setup.listen_port)();
                self.input(Input::LocalAddrs(
                    self.local
                        .iter()
                        .map(|ip| SocketAddr::new(*ip, port))
                        .collect(),
                ));
                if !first {
                    tracing::info!("the host's addresses changed; probing every path again");
                    self.input(Input::NetworkChanged);
                }
                self.next_stun = t;
            }
        }
        if t >= self.next_handshakes {
            self.next_handshakes = t + HANDSHAKES_EVERY;
            match self.setup.control.handshakes() {
                Ok(h) => self.input(Input::Handshakes(h)),
                Err(e) => tracing::debug!("cannot read the handshakes: {e}"),
            }
        }
        self.stun(t);
        self.relays_tick(t);
        self.input(Input::Tick);
    }

    /// The earliest deadline of the relay connections and the running STUN probe: when
    /// `relays_tick` or `stun` next has something to do before the tick.
    fn relays_due(&self) -> Option<Instant> {
        let probe = self.probe.as_ref().and_then(StunProbe::poll_timeout);
        self.conns
            .values()
            .filter_map(RelayConn::poll_timeout)
            .chain(probe)
            .min()
    }

    fn stun(&mut self, t: Instant) {
        if self.probe.is_none() && t >= self.next_stun {
            self.next_stun = t + STUN_EVERY;
            let mut servers = self.stun_servers.clone();
            servers.extend(self.relays.iter().filter_map(|r| r.udp));
            if !servers.is_empty() {
                self.probe = Some(StunProbe::new(&servers, t, random_id));
            }
        }
        let Some(p) = &mut self.probe else { return };
        match p.poll_probe(t) {
            Poll::Send(out) => {
                for (to, d) in out {
                    if let Err(e) = self.setup.underlay.send(&d, to) {
                        tracing::trace!(%to, "STUN send failed: {e}");
                    }
                }
            }
            Poll::Done(answers) => {
                self.probe = None;
                let (addrs, nat) =
                    stun::nat_report(&answers, &self.local, (self.setup.listen_port)());
                tracing::debug!(reflexive = ?addrs, nat = ?nat, "STUN done");
                self.udp_blocked = nat.udp_blocked;
                self.input(Input::Reflexive { addrs, nat });
            }
        }
    }

    fn relays_tick(&mut self, t: Instant) {
        // The home candidate keeps a connection; others close when idle.
        if let Some(home) = self.relays.get(self.home).map(|r| r.spec.name.clone()) {
            let _ = self.conn(&home, t);
            self.conns.retain(|name, c| {
                *name == home || t.saturating_duration_since(c.last_used) < RELAY_IDLE
            });
            let conns = &self.conns;
            self.links.retain(|name, _| conns.contains_key(name));
        }
        let names: Vec<String> = self.conns.keys().cloned().collect();
        for name in names {
            let Some(c) = self.conns.get_mut(&name) else {
                continue;
            };
            let (out, notes) = c.poll_frames(&self.id, t);
            for f in out {
                self.send_frame(&name, &f);
            }
            self.notes(&name, notes);
        }
    }

    fn publish(&mut self) {
        let paths = self.engine.paths();
        lock(&self.shared.view).paths = paths;
    }
}

/// The kernel backend's underlay socket: see `Runtime::serve_underlay`.
pub(crate) fn serve_underlay(shared: &Shared, socket: &UdpSocket) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    while !shared.stop.load(Ordering::Relaxed) {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) => {
                tracing::debug!("underlay read failed: {e}");
                continue;
            }
        };
        let d = &buf[..n];
        let from = unmap(from);
        if classify(d) == Kind::WireGuard {
            let f = shared
                .by_direct
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&from)
                .cloned();
            match f {
                Some(f) => {
                    let _ = f.deliver(d);
                }
                None => {
                    shared.unknown_src.fetch_add(1, Ordering::Relaxed);
                }
            }
        } else {
            offer(shared, d, from);
        }
    }
}

/// ::ffff:a.b.c.d as a.b.c.d, the way peers' endpoints are written.
fn unmap(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        a => a,
    }
}
