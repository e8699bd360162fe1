//! What the engine sends and what it does with the disco messages it gets: probe rounds,
//! heartbeats, pongs, call-me-maybe punching, learned candidates. Every send goes through a
//! per-peer budget ([`MAX_PINGS_PER_SEC`], [`MAX_PONGS_PER_SEC`]); every answer to a message
//! through its source's budget first (`guard`). An address is a candidate only when
//! peers may send to it (`plexsphere_wire::endpoint`: no loopback, link-local, metadata
//! service, mesh range, multicast or port 0) and this node would not reach it through the
//! mesh (a subnet route a peer serves, `Engine::may_send`), whether the state, a call-me-maybe
//! or a ping's source names it.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Instant;

use ipnet::IpNet;
use plexsphere_wire::endpoint;
use plexsphere_wire::reach::disco::Message;

use super::guard::Origin;
use super::peer::{Dest, Peer};
use super::{
    Counters, DIRECT_PROBE_INTERVAL, Engine, GONE_WAIT, HEARTBEAT_INTERVAL, MAX_PINGS_PER_SEC,
    MAX_PONGS_PER_SEC, PROBE_INTERVAL, RETRY_INTERVAL, Sealer,
};
use crate::reach::io::{Effect, Path, PeerReach};
use plexsphere_wire::key::PublicKey;

/// Where sends go while one input is handled: the sealer and tx ids, the drop counters, the
/// effects being answered, and the time.
pub(super) struct Outbox<'a> {
    pub sealer: &'a mut Sealer,
    pub counters: &'a mut Counters,
    pub effects: &'a mut Vec<Effect>,
    pub now: Instant,
}

impl<'a> Outbox<'a> {
    pub fn new(
        sealer: &'a mut Sealer,
        counters: &'a mut Counters,
        effects: &'a mut Vec<Effect>,
        now: Instant,
    ) -> Self {
        Self {
            sealer,
            counters,
            effects,
            now,
        }
    }

    /// Seals `message` for `peer` and adds the effect that carries it to `dest`, if the
    /// peer's budget allows. A ping's tx id is remembered for its pong.
    pub fn send(&mut self, key: PublicKey, peer: &mut Peer, dest: Dest, message: Message) {
        let allowed = match message {
            Message::Pong { .. } => peer.pongs.take(self.now),
            Message::Ping { .. } | Message::CallMeMaybe { .. } => peer.pings.take(self.now),
        };
        if !allowed {
            self.counters.rate_limited += 1;
            return;
        }
        let datagram = self.sealer.seal(&peer.pair, &message);
        if datagram.is_empty() {
            // Sealing failed (the AEAD refused); nothing safe to send.
            return;
        }
        if let Message::Ping { tx } = message {
            peer.sent_ping(tx, dest.clone(), self.now);
        }
        self.effects.push(match dest {
            Dest::Direct(to) => Effect::SendDirect { to, datagram },
            Dest::Relay(relay) => Effect::SendRelayed {
                relay,
                dst: key,
                datagram,
            },
        });
    }

    /// A ping with a fresh tx id.
    pub fn ping(&mut self, key: PublicKey, peer: &mut Peer, dest: Dest) {
        let tx = self.sealer.tx();
        self.send(key, peer, dest, Message::Ping { tx });
    }
}

impl Engine {
    /// The addresses of `addrs` peers may send to ([`endpoint::sendable`]), IPv4-mapped ones
    /// as IPv4, without duplicates, in their order; the others are counted.
    fn usable(&mut self, addrs: Vec<SocketAddr>) -> Vec<SocketAddr> {
        let mut out: Vec<SocketAddr> = Vec::with_capacity(addrs.len());
        for addr in addrs.into_iter().map(endpoint::canonical) {
            if !self.may_send(addr) {
                self.counters.unusable += 1;
            } else if !out.contains(&addr) {
                out.push(addr);
            }
        }
        out
    }

    /// Whether a disco datagram may go to `addr` (or be answered there): an address peers may
    /// send to ([`endpoint::sendable`]) that this node would not reach through the mesh itself.
    /// Without the second check a peer's LAN address inside a subnet route another peer serves
    /// became a "direct" path through that router's tunnel (WireGuard inside WireGuard), which
    /// died with the router: seen as a failover that took 17 s instead of 4.
    fn may_send(&self, addr: SocketAddr) -> bool {
        let ip = addr.ip();
        let through_mesh = self.routed.iter().any(|net| {
            net.contains(&ip) && !self.local.addrs.iter().any(|own| net.contains(&own.ip()))
        });
        endpoint::sendable(addr, self.mesh) && !through_mesh
    }

    /// The whole wanted set: new peers are probed at once, changed ones too, gone ones forgotten.
    pub(super) fn set_peers(&mut self, peers: Vec<PeerReach>, now: Instant, out: &mut Vec<Effect>) {
        let own = self.sealer.own;
        let wanted: Vec<PeerReach> = peers.into_iter().filter(|p| p.key != own).collect();
        // A set, not the list: at 10k peers a change must not cost 10k x 10k comparisons.
        let keys: HashSet<PublicKey> = wanted.iter().map(|p| p.key).collect();
        self.peers.retain(|key, _| keys.contains(key));
        let mut routed: Vec<IpNet> = wanted
            .iter()
            .flat_map(|p| p.routes.iter().copied())
            .collect();
        routed.sort_unstable();
        routed.dedup();
        self.routed = routed;
        for mut reach in wanted {
            reach.endpoints = self.usable(std::mem::take(&mut reach.endpoints));
            let key = reach.key;
            let changed = match self.peers.get_mut(&key) {
                Some(peer) => peer.set_reach(reach),
                None => {
                    let pair = self.pair_key(&key);
                    let peer = Peer::new(reach, pair, MAX_PINGS_PER_SEC, MAX_PONGS_PER_SEC);
                    self.peers.insert(key, peer);
                    true
                }
            };
            if changed {
                self.probe(key, now, out);
            }
        }
    }

    pub(super) fn probe_all(&mut self, now: Instant, out: &mut Vec<Effect>) {
        let keys: Vec<PublicKey> = self.peers.keys().copied().collect();
        for peer in self.peers.values_mut() {
            // Our addresses or network changed: new tuples, which no router holds yet.
            peer.reset_punches();
        }
        for key in keys {
            self.probe(key, now, out);
        }
    }

    /// A probe round: a ping to every direct candidate that answers lately and through the
    /// relays [`Self::probe_relays`] names; the candidates that do not answer (cold) wait for
    /// the punch the relay's pong starts (`punch`). Without a relay to ping through,
    /// cold candidates are pinged at once: nothing can time them; unless every relay said the
    /// peer is not registered, within [`GONE_WAIT`] (`registering`).
    pub(super) fn probe(&mut self, key: PublicKey, now: Instant, out: &mut Vec<Effect>) {
        let Some(peer) = self.peers.get(&key) else {
            return;
        };
        let relays = self.probe_relays(peer);
        let untimed = relays.is_empty() && !self.registering(peer, now);
        let Some(peer) = self.peers.get_mut(&key) else {
            return;
        };
        peer.last_probe = Some(now);
        let now_pinged: Vec<SocketAddr> = peer
            .candidates
            .iter()
            .filter(|c| untimed || c.alive(now))
            .map(|c| c.addr)
            .collect();
        // Every round with a relay ends in a punch, cold candidates or not: its call-me-maybe
        // brings the peer to our addresses (ours may be new, after roaming). Not while the
        // pair is quiet after failed punches (`punch`).
        peer.punch_wanted = !relays.is_empty() && !peer.quiet(now);
        let dests = now_pinged
            .into_iter()
            .map(Dest::Direct)
            .chain(relays.into_iter().map(Dest::Relay));
        self.ping_each(key, dests, now, out);
    }

    /// Pings the peer at each of `dests` in turn, each a fresh tx id within the peer's budget.
    /// Every ping loop (probe round, call-me-maybe, due punch) goes through here.
    pub(super) fn ping_each(
        &mut self,
        key: PublicKey,
        dests: impl IntoIterator<Item = Dest>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let Some(peer) = self.peers.get_mut(&key) else {
            return;
        };
        let mut post = Outbox::new(&mut self.sealer, &mut self.counters, out, now);
        for dest in dests {
            post.ping(key, peer, dest);
        }
    }

    /// Whether a relay we could ping `peer` through said, within [`GONE_WAIT`], that the peer
    /// is not registered: it has not started or not reached a relay yet. When it does, it comes
    /// to us through a relay and the punch is timed then; until [`GONE_WAIT`] has passed its
    /// cold candidates are not pinged untimed (found by the simulator: a peer whose candidates
    /// reached us before it registered anywhere was pinged at once, and its input-accepting
    /// router kept an entry of its own).
    fn registering(&self, peer: &Peer, now: Instant) -> bool {
        self.local.relays.iter().any(|s| {
            !self.local.down.contains_key(&s.name)
                && peer
                    .gone
                    .get(&s.name)
                    .is_some_and(|at| now.saturating_duration_since(*at) < GONE_WAIT)
        })
    }

    /// The relays a probe round goes through: the one the peer is on and its home relay when
    /// usable, else every relay of the state that is not down and did not say the peer is gone.
    fn probe_relays(&self, peer: &Peer) -> Vec<String> {
        let open = |r: &str| {
            self.local.relays.iter().any(|s| s.name == r)
                && !self.local.down.contains_key(r)
                && !peer.gone.contains_key(r)
        };
        let mut relays: Vec<String> = Vec::new();
        if let Path::Relay { relay, .. } = &peer.path
            && open(relay)
        {
            relays.push(relay.clone());
        }
        if let Some(home) = &peer.reach.home_relay
            && open(home)
            && !relays.contains(home)
        {
            relays.push(home.clone());
        }
        if relays.is_empty() {
            relays = self
                .local
                .relays
                .iter()
                .map(|s| s.name.clone())
                .filter(|r| open(r))
                .collect();
        }
        relays
    }

    /// Time passed: expiry, the heartbeat on a direct path, scheduled probe rounds.
    pub(super) fn tick(&mut self, now: Instant, out: &mut Vec<Effect>) {
        self.fire_punches(now, out);
        let keys: Vec<PublicKey> = self.peers.keys().copied().collect();
        for key in keys {
            let Some(peer) = self.peers.get_mut(&key) else {
                continue;
            };
            peer.expire(now);
            let since_probe = peer.last_probe.map(|p| now.saturating_duration_since(p));
            let due = match &peer.path {
                Path::Direct { endpoint } => {
                    if let Some(c) = peer.candidate(*endpoint) {
                        let gap = if c.unanswered > 0 {
                            RETRY_INTERVAL
                        } else {
                            HEARTBEAT_INTERVAL
                        };
                        let beat = c
                            .last_ping
                            .is_none_or(|p| now.saturating_duration_since(p) >= gap);
                        // A dead path gets no more heartbeats; `choose_all` leaves it.
                        if beat && !c.dead(now) {
                            let mut post =
                                Outbox::new(&mut self.sealer, &mut self.counters, out, now);
                            let dest = Dest::Direct(*endpoint);
                            post.ping(key, peer, dest);
                        }
                    }
                    since_probe.is_none_or(|s| s >= DIRECT_PROBE_INTERVAL)
                }
                _ => since_probe.is_none_or(|s| s >= PROBE_INTERVAL),
            };
            if due {
                self.probe(key, now, out);
            }
        }
    }

    /// A disco datagram from `from` on the WireGuard socket.
    pub(super) fn disco_direct(
        &mut self,
        from: SocketAddr,
        datagram: &[u8],
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let Some((key, message)) = self.open(None, datagram) else {
            return;
        };
        let answers = !matches!(message, Message::Pong { .. });
        if answers && !self.may_send(from) {
            // Nothing is answered to, learned from or punched for an address peers may not
            // send to (a spoofed 169.254.169.254, loopback, the mesh range) or that this node
            // reaches through the mesh (a router's masquerade of a ping it tunnelled).
            self.counters.unusable += 1;
            return;
        }
        let Some(peer) = self.peers.get_mut(&key) else {
            return;
        };
        if answers && !peer.sources.take(Origin::Addr(from.ip()), now) {
            self.counters.rate_limited += 1;
            return;
        }
        let mut post = Outbox::new(&mut self.sealer, &mut self.counters, out, now);
        match message {
            Message::Ping { tx } => {
                let pong = Message::Pong { tx, observed: from };
                post.send(key, peer, Dest::Direct(from), pong);
                // A new address is learned; one that does not answer us yet is pinged back at
                // once, while the peer's NAT holds the mapping its ping just opened.
                let known_alive = peer.candidate(from).is_some_and(|c| c.alive(now));
                let new = peer.learn(from, now);
                if new || (!known_alive && peer.candidate(from).is_some()) {
                    post.ping(key, peer, Dest::Direct(from));
                }
            }
            Message::Pong { tx, .. } => {
                if peer
                    .take_pong(&tx, &Dest::Direct(from), None, now)
                    .is_none()
                {
                    post.counters.stray_pongs += 1;
                }
            }
            Message::CallMeMaybe { addrs } => self.punch(key, addrs, now, out),
        }
    }

    /// A disco datagram the relay `relay` carried from `src`.
    pub(super) fn disco_relayed(
        &mut self,
        relay: &str,
        src: PublicKey,
        datagram: &[u8],
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let Some((key, message)) = self.open(Some(src), datagram) else {
            return;
        };
        let up_since = self.local.up_since.get(relay).copied();
        let Some(peer) = self.peers.get_mut(&key) else {
            return;
        };
        // Whatever the relay carried from the peer proves the peer is registered there now.
        peer.gone.remove(relay);
        let answers = !matches!(message, Message::Pong { .. });
        if answers && !peer.sources.take(Origin::Relay(relay.to_owned()), now) {
            self.counters.rate_limited += 1;
            return;
        }
        let dest = Dest::Relay(relay.to_owned());
        match message {
            Message::Ping { tx } => {
                let mut post = Outbox::new(&mut self.sealer, &mut self.counters, out, now);
                let observed = SocketAddr::from(([0, 0, 0, 0], 0));
                let pong = Message::Pong { tx, observed };
                post.send(key, peer, dest.clone(), pong);
                // A peer with no path yet is pinged back through the relay that reached us.
                if peer.path == Path::None {
                    post.ping(key, peer, dest);
                }
            }
            Message::Pong { tx, .. } => match peer.take_pong(&tx, &dest, up_since, now) {
                // The peer is there and knows us, and the round trip is measured: punch.
                Some(rtt) if peer.punch_wanted => self.start_punch(key, relay, rtt, now, out),
                Some(_) => {}
                None => self.counters.stray_pongs += 1,
            },
            Message::CallMeMaybe { addrs } => self.punch(key, addrs, now, out),
        }
    }

    /// "Probe me now at these addresses": ping every distinct one peers may send to at once
    /// (the peer times its own pings to ours, `punch`), unless the pair's punches failed too
    /// often lately (the peer is told nothing; it counts the same call-me-maybes).
    fn punch(
        &mut self,
        key: PublicKey,
        addrs: Vec<SocketAddr>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let addrs = self.usable(addrs);
        let Some(peer) = self.peers.get_mut(&key) else {
            return;
        };
        if !peer.count_punch(now) {
            return;
        }
        // Learning them all before the pings leaves the same candidates and the same pings as
        // learning each just before its ping: `learn` does not read ping state.
        for addr in &addrs {
            peer.learn(*addr, now);
        }
        self.ping_each(key, addrs.into_iter().map(Dest::Direct), now, out);
    }
}
