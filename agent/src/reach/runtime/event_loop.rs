//! The runtime's loop: one thread, one queue, the engine's effects performed in order. See
//! `mod.rs` for what comes in and goes out. Here: the loop's state and each turn of it (the
//! queue, what the daemon's calls left, the engine's inputs and effects, the timers and STUN,
//! a key rotation); the relay connections are in `relays.rs`, the peers, their forwarders
//! and paths in `peers.rs`, and the kernel backend's underlay socket in `underlay.rs`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Instant;

use plexsphere_wire::reach::relay::{Frame, KeyPrefix};
use plexsphere_wire::reach::{Kind, classify};
use rand_core::CryptoRngCore;

use super::shared::{ADDRS_EVERY, Event, HANDSHAKES_EVERY, RuntimeSetup, STUN_EVERY, Shared, lock};
use crate::reach::engine::Engine;
use crate::reach::forward::{ForwardLoop, Forwarder, Route};
use crate::reach::io::{Effect, Input, Now, PeerReach, TICK};
use crate::reach::node::relays::RelaySet;
use crate::reach::relay_client::tcp::{TcpEvent, TcpLink};
use crate::reach::stun::{self, Poll, StunProbe};
use plexsphere_wire::key::PublicKey;

pub(super) struct Fwd {
    pub(super) fwd: Arc<Forwarder>,
    /// The loop that carries it, and its token there.
    pub(super) carried: (Arc<ForwardLoop>, u64),
}

/// A forwarder that goes away leaves the loop (its socket closes with it).
impl Drop for Fwd {
    fn drop(&mut self) {
        self.carried.0.remove(self.carried.1);
    }
}

pub(crate) struct Loop {
    pub(super) engine: Engine,
    pub(super) setup: RuntimeSetup,
    pub(super) shared: Arc<Shared>,
    /// The relays, their connections and the home relay, decided (the links are below).
    pub(super) relay_set: RelaySet,
    pub(super) stun_servers: Vec<SocketAddr>,
    /// Relays whose connection runs over TCP with TLS: the links the relay set asked for.
    pub(super) links: HashMap<String, TcpLink>,
    /// The relay each relayed peer goes through (its forwarder's, or the data plane's relay
    /// endpoint's).
    pub(super) relayed: HashMap<PublicKey, String>,
    /// The relays the data plane unwraps frames from, as last told (`PathControl::set_relays`).
    pub(super) plane_relays: Vec<SocketAddr>,
    pub(super) peers: Vec<PeerReach>,
    /// Each wanted peer by its key prefix (relays name the sender of a datagram by it); a
    /// prefix two peers share maps to neither.
    pub(super) by_prefix: HashMap<KeyPrefix, Option<PublicKey>>,
    pub(super) fwds: HashMap<PublicKey, Fwd>,
    /// The one thread that carries every forwarder (started with the first).
    pub(super) forwards: Option<Arc<ForwardLoop>>,
    pub(super) probe: Option<StunProbe>,
    pub(super) next_stun: Instant,
    pub(super) local: Vec<IpAddr>,
    pub(super) next_addrs: Instant,
    pub(super) next_handshakes: Instant,
    pub(super) next_tick: Instant,
    /// STUN transaction ids (the OS's CSPRNG: an id an off-path host could guess would let
    /// it answer for a server).
    pub(super) rng: Box<dyn CryptoRngCore + Send>,
}

impl Loop {
    /// A loop that starts at `now`: its first turn reads the addresses, the handshakes and
    /// STUN at once.
    pub(crate) fn new(setup: RuntimeSetup, shared: Arc<Shared>, now: Now) -> Self {
        let t = now.at;
        Self {
            engine: Engine::new(setup.secret, setup.mesh),
            relay_set: RelaySet::new(setup.secret, setup.tls.is_some()),
            setup,
            shared,
            stun_servers: Vec::new(),
            links: HashMap::new(),
            relayed: HashMap::new(),
            plane_relays: Vec::new(),
            peers: Vec::new(),
            by_prefix: HashMap::new(),
            fwds: HashMap::new(),
            forwards: None,
            probe: None,
            next_stun: t,
            local: Vec::new(),
            next_addrs: t,
            next_handshakes: t,
            next_tick: t,
            rng: Box::new(rand_core::OsRng),
        }
    }

    pub(crate) fn run(mut self, rx: &Receiver<Event>) {
        tracing::debug!(port = (self.setup.listen_port)(), "reach runtime started");
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
            let first = rx.recv_timeout(wait);
            // The one clock read of the turn: everything it handles happens at `now`, and the
            // code below reads no clock.
            let now = Now::system();
            match first {
                Ok(ev) => self.event(ev, now),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            // TCP connections that ended: taken before the queue is drained, so every frame a
            // connection read before its end (queued before it) is handled first.
            let closed = std::mem::take(&mut *lock(&self.shared.closed));
            // Whatever else queued up meanwhile, without waiting.
            while let Ok(ev) = rx.try_recv() {
                self.event(ev, now);
            }
            for (relay, why) in closed {
                self.tcp(relay, TcpEvent::Closed(why), now);
            }
            // Datagrams (relayed WireGuard among them) wake the loop often; the timers and the
            // published views run once per tick.
            let changed = self.pending(now);
            if changed || now.at >= self.next_tick {
                self.next_tick = now.at + TICK;
                self.timers(now);
                self.publish();
            } else {
                if self.engine.poll_timeout().is_some_and(|at| at <= now.at) {
                    self.input(Input::Tick, now);
                }
                if self.relays_due().is_some_and(|at| at <= now.at) {
                    self.stun(now);
                    self.relays_tick(now);
                }
            }
            self.sync_plane_relays();
        }
        self.fwds.clear();
        self.links.clear();
        tracing::debug!("reach runtime stopped");
    }

    fn event(&mut self, event: Event, now: Now) {
        match event {
            Event::Datagram { datagram, from } => self.datagram(&datagram, from, now),
            Event::Tcp { relay, event } => self.tcp(relay, event, now),
            Event::Wake => {}
        }
    }

    pub(super) fn input(&mut self, input: Input, now: Now) {
        self.engine.handle(input, now);
        while let Some(e) = self.engine.poll_effect() {
            self.perform(e, now);
        }
    }

    /// Takes what the daemon stored; answers whether there was anything.
    fn pending(&mut self, now: Now) -> bool {
        let p = std::mem::take(&mut *lock(&self.shared.pending));
        let any = p.peers.is_some()
            || p.relays.is_some()
            || p.token.is_some()
            || p.secret.is_some()
            || !p.effects.is_empty();
        // Before the token: a rotation's new token goes to the connections of the new key.
        if let Some(secret) = p.secret {
            self.rekey(secret, now);
        }
        if let Some(token) = p.token {
            match serde_json::to_vec(&token) {
                Ok(bytes) => self.relay_set.handle_token(bytes),
                Err(e) => tracing::warn!("cannot encode the relay token: {e}"),
            }
        }
        if let Some((relays, stun)) = p.relays {
            self.set_relays(relays, stun, now);
        }
        if let Some(peers) = p.peers {
            self.set_peers(peers, now);
        }
        for e in p.effects {
            self.perform(e, now);
        }
        any
    }

    /// A key rotation: the disco keys and relay registrations derive from the WireGuard key,
    /// so the engine starts over with the new one (its paths are probed again), every relay
    /// connection registers again, and relayed peers hold until a path is chosen anew.
    fn rekey(&mut self, secret: [u8; 32], now: Now) {
        tracing::info!(
            "reach: the WireGuard key rotated; registering with the relays again and probing every path with the new key"
        );
        self.setup.secret = secret;
        self.engine = Engine::new(secret, self.setup.mesh);
        self.relay_set.handle_secret(secret);
        self.links.clear();
        for (peer, _) in std::mem::take(&mut self.relayed) {
            if let Some(f) = self.fwds.get(&peer) {
                f.fwd.set_route(Route::Hold);
            }
        }
        // The relays again, for the new engine.
        self.carry_relay_outs(now);
        // The next timer pass hands the engine the local addresses again.
        self.local.clear();
        self.next_addrs = now.at;
        let peers = self.peers.clone();
        self.input(Input::Peers(peers), now);
    }

    fn perform(&mut self, effect: Effect, now: Now) {
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
                if !self.relay_set.handle_send(&relay, dst, datagram, now.at) {
                    tracing::debug!(relay = %relay, "no such relay in the state; disco dropped");
                    return;
                }
                self.carry_relay_outs(now);
            }
            Effect::SetPath { peer, path } => self.set_path(peer, path, now),
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

    fn datagram(&mut self, datagram: &[u8], from: SocketAddr, now: Now) {
        match classify(datagram) {
            Kind::Stun => {
                if let Some(p) = &mut self.probe {
                    p.handle_datagram(datagram, from);
                }
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
                    self.relay_set.handle_udp_frame(f, from, now.at);
                    self.carry_relay_outs(now);
                }
                Err(e) => tracing::debug!(%from, "unreadable relay frame: {e}"),
            },
            Kind::WireGuard | Kind::Unknown => {
                self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn timers(&mut self, now: Now) {
        let t = now.at;
        if t >= self.next_addrs {
            self.next_addrs = t + ADDRS_EVERY;
            let mut local = (self.setup.local_addrs)();
            local.sort();
            local.dedup();
            if local != self.local {
                let first = self.local.is_empty();
                self.local = local;
                let port = (self.setup.listen_port)();
                self.input(
                    Input::LocalAddrs(
                        self.local
                            .iter()
                            .map(|ip| SocketAddr::new(*ip, port))
                            .collect(),
                    ),
                    now,
                );
                if !first {
                    tracing::info!("the host's addresses changed; probing every path again");
                    self.input(Input::NetworkChanged, now);
                }
                self.next_stun = t;
            }
        }
        if t >= self.next_handshakes {
            self.next_handshakes = t + HANDSHAKES_EVERY;
            match self.setup.control.handshakes() {
                Ok(h) => self.input(Input::Handshakes(h), now),
                Err(e) => tracing::debug!("cannot read the handshakes: {e}"),
            }
        }
        self.stun(now);
        self.relays_tick(now);
        self.input(Input::Tick, now);
    }

    fn stun(&mut self, now: Now) {
        let t = now.at;
        if self.probe.is_none() && t >= self.next_stun {
            self.next_stun = t + STUN_EVERY;
            let mut servers = self.stun_servers.clone();
            servers.extend(self.relay_set.relays().iter().filter_map(|r| r.udp));
            if !servers.is_empty() {
                let rng = &mut self.rng;
                self.probe = Some(StunProbe::new(&servers, t, || {
                    let mut id = [0u8; 12];
                    rng.fill_bytes(&mut id);
                    id
                }));
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
                self.relay_set.handle_udp_blocked(nat.udp_blocked);
                self.input(Input::Reflexive { addrs, nat }, now);
            }
        }
    }

    fn publish(&mut self) {
        let paths = self.engine.paths();
        lock(&self.shared.view).paths = paths;
    }
}
