//! The runtime's loop: one thread, one queue, the engine's effects performed in order. See
//! `runtime.rs` for what comes in and goes out.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, PoisonError};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime};

use base64::Engine as _;
use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::reach::relay::Frame;
use plexsphere_wire::reach::{Kind, MAX_DATAGRAM, classify};

use super::super::engine::Engine;
use super::super::forward::{Forwarder, Route};
use super::super::io::{Effect, Input, Now, Path, PeerReach, TICK, Transport};
use super::super::relay_client::{Identity, Note, RelayConn};
use super::super::stun::{self, Poll, StunProbe};
use super::{
    ADDRS_EVERY, Event, HANDSHAKES_EVERY, Mode, RELAY_IDLE, RuntimeSetup, STUN_EVERY, Shared, lock,
};
use crate::mesh::key::PeerKey;

struct Relay {
    spec: RelaySpec,
    key: [u8; 32],
    udp: SocketAddr,
}

struct Fwd {
    fwd: Arc<Forwarder>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Fwd {
    fn drop(&mut self) {
        self.fwd.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub(super) struct Loop {
    engine: Engine,
    setup: RuntimeSetup,
    shared: Arc<Shared>,
    id: Identity,
    relays: Vec<Relay>,
    stun_servers: Vec<SocketAddr>,
    conns: HashMap<String, RelayConn>,
    home: usize,
    home_up: Option<String>,
    token: Option<Vec<u8>>,
    peers: Vec<PeerReach>,
    fwds: HashMap<PeerKey, Fwd>,
    probe: Option<StunProbe>,
    next_stun: Instant,
    local: Vec<IpAddr>,
    next_addrs: Instant,
    next_handshakes: Instant,
    said_tcp_only: bool,
}

fn now() -> Now {
    Now {
        mono: Instant::now(),
        wall: SystemTime::now(),
    }
}

fn random_id() -> [u8; 12] {
    use rand_core::RngCore as _;
    let mut id = [0u8; 12];
    rand_core::OsRng.fill_bytes(&mut id);
    id
}

impl Loop {
    pub(super) fn new(setup: RuntimeSetup, shared: Arc<Shared>) -> Self {
        let t = Instant::now();
        Self {
            engine: Engine::new(setup.secret),
            id: Identity::new(setup.secret),
            setup,
            shared,
            relays: Vec::new(),
            stun_servers: Vec::new(),
            conns: HashMap::new(),
            home: 0,
            home_up: None,
            token: None,
            peers: Vec::new(),
            fwds: HashMap::new(),
            probe: None,
            next_stun: t,
            local: Vec::new(),
            next_addrs: t,
            next_handshakes: t,
            said_tcp_only: false,
        }
    }

    pub(super) fn run(mut self, rx: &Receiver<Event>) {
        tracing::debug!(mode = ?self.setup.mode, port = (self.setup.listen_port)(), "reach runtime started");
        while !self.shared.stop.load(Ordering::Relaxed) {
            match rx.recv_timeout(TICK) {
                Ok(Event::Datagram { datagram, from }) => self.datagram(&datagram, from),
                Ok(Event::Wake) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            // Whatever else queued up meanwhile, without waiting.
            while let Ok(ev) = rx.try_recv() {
                if let Event::Datagram { datagram, from } = ev {
                    self.datagram(&datagram, from);
                }
            }
            self.pending();
            self.timers();
            self.publish();
        }
        self.fwds.clear();
        tracing::debug!("reach runtime stopped");
    }

    fn input(&mut self, input: Input) {
        let effects = self.engine.handle(now(), input);
        for e in effects {
            self.perform(e);
        }
    }

    fn pending(&mut self) {
        let p = std::mem::take(&mut *lock(&self.shared.pending));
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
            let Some(udp) = spec.udp else {
                if !self.said_tcp_only {
                    self.said_tcp_only = true;
                    tracing::warn!(relay = %spec.name, "relay {} has no UDP address; relays over TCP are not implemented in this plexd, so it is not used", spec.name);
                }
                continue;
            };
            relays.push(Relay {
                spec: spec.clone(),
                key,
                udp,
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
            self.relays = relays;
            self.home = 0;
            self.input(Input::Relays(specs));
        }
        if changed || stun_changed {
            self.next_stun = Instant::now();
        }
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
        let wanted: Vec<PeerKey> = peers.iter().map(|p| p.key).collect();
        self.fwds.retain(|k, _| wanted.contains(k));
        {
            let mut owners = self
                .shared
                .owners
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            owners.retain(|k, _| wanted.contains(k));
        }
        self.shared
            .by_direct
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, f| self.fwds.values().any(|x| Arc::ptr_eq(&x.fwd, f)));
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
            .map(|r| r.udp)
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
                self.fwds.remove(&peer);
                self.set_endpoint(peer, *endpoint);
            }
            (Mode::Kernel, Path::Direct { endpoint }) => {
                if let Some(f) = self.forwarder(peer) {
                    f.set_route(Route::Direct(*endpoint));
                    self.index_direct(peer, Some(*endpoint), &f);
                }
            }
            (_, Path::Relay { relay, transport }) => {
                let Some(udp) = self.relay_udp(relay) else {
                    tracing::warn!(peer_key = %peer, relay = %relay, "the path names a relay the state does not have; unchanged");
                    return;
                };
                if *transport == Transport::Tcp {
                    tracing::warn!(peer_key = %peer, relay = %relay, "relays over TCP are not implemented in this plexd; using UDP");
                }
                let t = Instant::now();
                let _ = self.conn(relay, t);
                if let Some(f) = self.forwarder(peer) {
                    f.set_route(Route::Relay {
                        relay: udp,
                        dst: peer.0,
                    });
                    self.index_direct(peer, None, &f);
                }
            }
        }
        tracing::info!(peer_key = %peer, path = ?path, "reach: path set");
    }

    /// The connection to relay `name`, opened on demand.
    fn conn(&mut self, name: &str, t: Instant) -> Option<&mut RelayConn> {
        if !self.conns.contains_key(name) {
            let r = self.relays.iter().find(|r| r.spec.name == name)?;
            let c = RelayConn::new(name.to_owned(), r.key, self.token.clone(), t);
            self.conns.insert(name.to_owned(), c);
        }
        self.conns.get_mut(name)
    }

    fn send_frame(&self, relay: &str, frame: &Frame) {
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
                    p.handle(datagram, from);
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
                    .find(|r| r.udp == from)
                    .map(|r| r.spec.name.clone())
                else {
                    tracing::trace!(%from, "relay frame from an address no relay has; dropped");
                    return;
                };
                let frame = match Frame::from_datagram(datagram) {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::debug!(relay = %name, "unreadable relay frame: {e}");
                        return;
                    }
                };
                let t = Instant::now();
                let Some(conn) = self.conns.get_mut(&name) else {
                    return;
                };
                let (out, notes) = conn.handle(frame, &self.id, t);
                for f in out {
                    self.send_frame(&name, &f);
                }
                self.notes(&name, notes);
            }
            Kind::WireGuard | Kind::Unknown => {
                self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn notes(&mut self, relay: &str, notes: Vec<Note>) {
        for n in notes {
            match n {
                Note::Up { rtt } => {
                    tracing::info!(relay, "registered with relay {relay}");
                    self.input(Input::RelayUp {
                        relay: relay.to_owned(),
                        transport: Transport::Udp,
                        rtt,
                    });
                    let home = self.relays.get(self.home).map(|r| r.spec.name.as_str());
                    if home == Some(relay) && self.home_up.as_deref() != Some(relay) {
                        self.home_up = Some(relay.to_owned());
                        self.input(Input::HomeRelay(Some(relay.to_owned())));
                    }
                }
                Note::Down { why } => {
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
                Note::Recv { src, payload } => match classify(&payload) {
                    Kind::WireGuard => match self.fwds.get(&PeerKey(src)) {
                        Some(f) => {
                            if let Err(e) = f.fwd.deliver(&payload) {
                                tracing::trace!("forwarder delivery failed: {e}");
                            }
                        }
                        None => {
                            self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
                        }
                    },
                    Kind::Disco => self.input(Input::DiscoRelayed {
                        relay: relay.to_owned(),
                        src: PeerKey(src),
                        datagram: payload,
                    }),
                    _ => {
                        self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
                    }
                },
                Note::PeerGone { dst } => self.input(Input::PeerGone {
                    relay: relay.to_owned(),
                    dst: PeerKey(dst),
                }),
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

    fn stun(&mut self, t: Instant) {
        if self.probe.is_none() && t >= self.next_stun {
            self.next_stun = t + STUN_EVERY;
            let mut servers = self.stun_servers.clone();
            servers.extend(self.relays.iter().map(|r| r.udp));
            if !servers.is_empty() {
                self.probe = Some(StunProbe::new(&servers, t, random_id));
            }
        }
        let Some(p) = &mut self.probe else { return };
        match p.poll(t) {
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
        }
        let names: Vec<String> = self.conns.keys().cloned().collect();
        for name in names {
            let Some(c) = self.conns.get_mut(&name) else {
                continue;
            };
            let (out, notes) = c.poll(&self.id, t);
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
pub(super) fn serve_underlay(shared: &Shared, socket: &UdpSocket) {
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
            super::offer(shared, d, from);
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
