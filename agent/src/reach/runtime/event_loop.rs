//! The runtime's loop: one thread, one queue, the engine's effects performed in order. See
//! `mod.rs` for what comes in and goes out. Here: the loop's state and each turn of it (the
//! queue, what the daemon's calls left, the engine's inputs and effects, what the schedule asks
//! for, a key rotation); the relay connections are in `relays.rs`, the peers, their forwarders
//! and paths in `peers.rs`, and the kernel backend's underlay socket in `underlay.rs`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Instant;

use super::shared::{Event, RuntimeSetup, Shared, lock};
use crate::reach::forward::{ForwardLoop, Forwarder, Route};
use crate::reach::io::{Effect, Input, Now, PeerReach, TICK};
use crate::reach::node::Node;
use crate::reach::node::schedule::Due;
use crate::reach::relay_client::tcp::{TcpEvent, TcpLink};
use plexsphere_wire::key::PublicKey;
use plexsphere_wire::reach::relay::{Frame, KeyPrefix};
use plexsphere_wire::reach::{Kind, classify};

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
    /// The engine, the relay set (the relays, their connections and the home relay, decided;
    /// the links are below) and the schedule (when the pass runs and what it does: the
    /// address and handshake reads, STUN, the tick).
    pub(super) node: Node,
    pub(super) setup: RuntimeSetup,
    pub(super) shared: Arc<Shared>,
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
}

impl Loop {
    /// A loop that starts at `now`: its first turn reads the addresses, the handshakes and
    /// STUN at once.
    pub(crate) fn new(setup: RuntimeSetup, shared: Arc<Shared>, now: Now) -> Self {
        Self {
            // STUN transaction ids from the OS's CSPRNG: an id an off-path host could guess
            // would let it answer for a server.
            node: Node::new(
                setup.secret,
                setup.mesh,
                setup.tls.is_some(),
                Box::new(rand_core::OsRng),
                now.at,
            ),
            setup,
            shared,
            links: HashMap::new(),
            relayed: HashMap::new(),
            plane_relays: Vec::new(),
            peers: Vec::new(),
            by_prefix: HashMap::new(),
            fwds: HashMap::new(),
            forwards: None,
        }
    }

    pub(crate) fn run(mut self, rx: &Receiver<Event>) {
        tracing::debug!(port = (self.setup.listen_port)(), "reach runtime started");
        while !self.shared.stop.load(Ordering::Relaxed) {
            // The schedule's next pass (the tick) or STUN retry, a punch the engine timed, a
            // relay connection's retry or keepalive: whichever is first (their
            // `poll_timeout`). The schedule's pass is never further than TICK; the cap is a
            // guard.
            let next = self.node.poll_timeout();
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
            // Datagrams (relayed WireGuard among them) wake the loop often; the schedule's pass
            // (the reads, STUN, the tick, the published views) runs once per tick, and at once
            // after a daemon input. Otherwise only the machine that is due runs.
            if self.pending(now) {
                self.node.schedule.handle_daemon_input(now.at);
            }
            self.node.schedule.handle_timeout(now.at);
            if !self.carry_schedule(now) {
                if self.node.engine_due(now.at) {
                    self.input(Input::Tick, now);
                }
                if self.node.relays_due(now.at) {
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
        self.node.engine.handle(input, now);
        while let Some(e) = self.node.engine.poll_effect() {
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
                Ok(bytes) => self.node.relays.handle_token(bytes),
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
        // A new engine; the relay set registers again; the next pass hands the engine the
        // local addresses again.
        self.node.handle_secret(secret, now.at);
        self.links.clear();
        for (peer, _) in std::mem::take(&mut self.relayed) {
            if let Some(f) = self.fwds.get(&peer) {
                f.fwd.set_route(Route::Hold);
            }
        }
        // The relays again, for the new engine.
        self.carry_relay_outs(now);
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
                if !self.node.relays.handle_send(&relay, dst, datagram, now.at) {
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
                self.node
                    .schedule
                    .handle_stun_datagram(datagram, from, now.at);
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
                    self.node.relays.handle_udp_frame(f, from, now.at);
                    self.carry_relay_outs(now);
                }
                Err(e) => tracing::debug!(%from, "unreadable relay frame: {e}"),
            },
            Kind::WireGuard | Kind::Unknown => {
                self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Carries out what the schedule asks for, until it asks nothing; answers whether that
    /// included the tick.
    fn carry_schedule(&mut self, now: Now) -> bool {
        let mut ticked = false;
        while let Some(due) = self.node.schedule.poll_out() {
            match due {
                Due::ReadAddrs => {
                    let local = (self.setup.local_addrs)();
                    let port = (self.setup.listen_port)();
                    self.node.schedule.handle_local_addrs(local, port, now.at);
                }
                Due::ReadHandshakes => match self.setup.control.handshakes() {
                    Ok(h) => self.input(Input::Handshakes(h), now),
                    Err(e) => tracing::debug!("cannot read the handshakes: {e}"),
                },
                Due::Send { to, datagram } => {
                    if let Err(e) = self.setup.underlay.send(&datagram, to) {
                        tracing::trace!(%to, "STUN send failed: {e}");
                    }
                }
                Due::UdpBlocked(blocked) => self.node.relays.handle_udp_blocked(blocked),
                Due::Engine(input) => self.input(input, now),
                Due::Tick => {
                    ticked = true;
                    self.relays_tick(now);
                    self.input(Input::Tick, now);
                    self.publish();
                }
            }
        }
        ticked
    }

    fn publish(&mut self) {
        let paths = self.node.engine.paths();
        lock(&self.shared.view).paths = paths;
    }
}
