//! The runtime's loop: one thread, one queue, the node's outputs carried out in order. See
//! `mod.rs` for what comes in and goes out. Here: the loop's state and each turn of it (the
//! queue, what the daemon's calls left, each handed to the node, then the node's one output
//! queue drained); the relay links are in `relays.rs`, the peers' forwarders, endpoints and
//! how each is carried in `peers.rs`, and the kernel backend's underlay socket in
//! `underlay.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Instant;

use super::shared::{Event, RuntimeSetup, Shared, lock};
use crate::reach::forward::{ForwardLoop, Forwarder};
use crate::reach::io::{Now, TICK};
use crate::reach::node::{Node, NodeOut};
use crate::reach::relay_client::tcp::{TcpEvent, TcpLink};
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
    /// The engine, the relay set and the schedule, and the routing between them: the
    /// decisions. The loop hands it what arrives and carries out its outputs.
    pub(super) node: Node,
    pub(super) setup: RuntimeSetup,
    pub(super) shared: Arc<Shared>,
    /// Relays whose connection runs over TCP with TLS: the links the relay set asked for.
    pub(super) links: HashMap<String, TcpLink>,
    pub(super) fwds: HashMap<PublicKey, Fwd>,
    /// The one thread that carries every forwarder (started with the first).
    pub(super) forwards: Option<Arc<ForwardLoop>>,
}

impl Loop {
    /// A loop that starts at `now`: its first turn reads the addresses, the handshakes and
    /// STUN at once.
    pub(crate) fn new(setup: RuntimeSetup, shared: Arc<Shared>, now: Now) -> Self {
        Self {
            // The engine's tx ids and disco nonces, and STUN transaction ids, from the OS's
            // CSPRNG: a nonce that repeats under a pair key would break it, and an id an
            // off-path host could guess would let it answer for a server.
            node: Node::new(
                setup.secret,
                setup.mesh,
                setup.tls.is_some(),
                Box::new(rand_core::OsRng),
                Box::new(rand_core::OsRng),
                now.at,
            ),
            setup,
            shared,
            links: HashMap::new(),
            fwds: HashMap::new(),
            forwards: None,
        }
    }

    pub(crate) fn run(mut self, rx: &Receiver<Event>) {
        tracing::debug!(port = (self.setup.listen_port)(), "reach runtime started");
        while !self.shared.stop.load(Ordering::Relaxed) {
            // The schedule's next pass (the tick) or STUN retry, a punch the engine timed, a
            // relay connection's retry or keepalive: whichever is first (the node's
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
            // The node decides what runs now: its pass (the reads, STUN, the tick, the
            // published views) once per tick and at once after a daemon input, otherwise only
            // the machine that is due.
            if self.pending(now) {
                self.node.handle_daemon_input(now);
            }
            self.node.handle_timeout(now);
            self.drain(now);
        }
        self.fwds.clear();
        self.links.clear();
        tracing::debug!("reach runtime stopped");
    }

    fn event(&mut self, event: Event, now: Now) {
        match event {
            Event::Datagram { datagram, from } => {
                self.node.handle_datagram(&datagram, from, now);
                self.drain(now);
            }
            Event::Tcp { relay, event } => self.tcp(relay, event, now),
            Event::Wake => {}
        }
    }

    /// Carries out the node's outputs, in order, until it has none (a read it asks for is
    /// answered on the spot, and its pass goes on).
    pub(super) fn drain(&mut self, now: Now) {
        while let Some(out) = self.node.poll_out() {
            self.carry(out, now);
        }
    }

    fn carry(&mut self, out: NodeOut, now: Now) {
        match out {
            NodeOut::Send { to, datagram } => {
                if let Err(e) = self.setup.underlay.send(&datagram, to) {
                    tracing::trace!(%to, "send failed: {e}");
                }
            }
            NodeOut::RelayUdp { to, frame } => {
                if let Err(e) = self.setup.underlay.send(&frame.to_datagram(), to) {
                    tracing::trace!(%to, "relay send failed: {e}");
                }
            }
            NodeOut::RelayTcp { relay, frame } => {
                if let Some(link) = self.links.get(&relay)
                    && !link.send(&frame)
                {
                    tracing::debug!(relay, "the TCP connection's queue is full; frame dropped");
                }
            }
            NodeOut::OpenTcp {
                relay,
                addr,
                server_name,
            } => self.open_link(relay, addr, server_name, now),
            NodeOut::CloseTcp { relay } => {
                self.links.remove(&relay);
            }
            NodeOut::Recv { peer, datagram } => match self.fwds.get(&peer) {
                Some(f) => {
                    if let Err(e) = f.fwd.deliver(&datagram) {
                        tracing::trace!("forwarder delivery failed: {e}");
                    }
                }
                None => {
                    self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
                }
            },
            NodeOut::Dropped => {
                self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
            }
            NodeOut::Carry { peer, how } => self.carry_peer(peer, how),
            NodeOut::Candidates {
                reflexive,
                home_relay,
                nat,
            } => {
                let mut v = lock(&self.shared.view);
                v.own.reflexive = reflexive;
                v.own.home_relay = home_relay;
                v.own.nat = nat;
            }
            NodeOut::PlaneRelays(relays) => {
                // The kernel's `PathControl` takes none: its default `set_relays`.
                if let Err(e) = self.setup.control.set_relays(&relays) {
                    tracing::warn!(
                        "the data plane takes frames from only some relays ({e}); the others' peers use loopback forwarders"
                    );
                }
            }
            NodeOut::ReadAddrs => {
                let local = (self.setup.local_addrs)();
                let port = (self.setup.listen_port)();
                self.node.handle_local_addrs(local, port, now);
            }
            NodeOut::ReadHandshakes => match self.setup.control.handshakes() {
                Ok(h) => self.node.handle_handshakes(Some(h), now),
                Err(e) => {
                    tracing::debug!("cannot read the handshakes: {e}");
                    self.node.handle_handshakes(None, now);
                }
            },
            NodeOut::Publish(paths) => lock(&self.shared.view).paths = paths,
        }
    }

    /// Takes what the daemon stored and hands it to the node; answers whether there was
    /// anything.
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
                Ok(bytes) => self.node.handle_token(bytes),
                Err(e) => tracing::warn!("cannot encode the relay token: {e}"),
            }
        }
        if let Some((relays, stun)) = p.relays {
            self.node.handle_relays(relays, stun, now);
            self.drain(now);
        }
        if let Some(peers) = p.peers {
            self.set_peers(peers, now);
        }
        for e in p.effects {
            self.node.handle_effect(e, now);
            self.drain(now);
        }
        any
    }

    /// A key rotation: the node starts over with the new key (relayed peers hold until a
    /// path is chosen anew, the engine gets the relays and peers again, every relay
    /// connection registers again); the loop drops its TLS links.
    fn rekey(&mut self, secret: [u8; 32], now: Now) {
        tracing::info!(
            "reach: the WireGuard key rotated; registering with the relays again and probing every path with the new key"
        );
        self.setup.secret = secret;
        self.links.clear();
        self.node.handle_secret(secret, now);
        self.drain(now);
    }
}
