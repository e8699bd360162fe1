//! The data plane's core: peers, routing and the packet path, with no sockets and no clock.
//!
//! Inputs are `handle_tun_packets` (plaintext from the host), `handle_udp_datagrams`
//! (WireGuard messages from the network) and `handle_timer(now)`; outputs are written into
//! caller-owned batches: datagrams for the network (each with its destination) and packets for
//! the TUN. Time is always a parameter, so tests step it. The device is `Sync`: the runner
//! drives the two directions from two threads; they share the routing table under a read lock
//! and meet only on a peer's own lock, so one flow is never reordered.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Packet, Tunn, TunnResult};

use crate::machine::{Machine, Protocol, Step};
use crate::noise::handshake::{
    COOKIE_REPLY, DATA, DATA_HEADER, DATA_MIN, INITIATION, INITIATION_LEN, RESPONSE, le32,
};
use crate::noise::{Output, write_data_header};
use crate::pool::{Job, Op, OpKind, Opening};

use crate::allowed_ips::AllowedIps;
use crate::batch::{PacketBatch, WG_OVERHEAD};
use crate::key::{Key, SecretKey};
use crate::peer::{Peer, PeerState};
use crate::policy::PeerPolicy;
use crate::policy::{PolicyDrops, PolicyFilter};
use crate::relay::{RelayError, RelayTable};
use crate::source::Source;
use plexsphere_policy::{Decision, decide};

/// Handshake messages per second the device takes before it asks for cookies (boringtun's
/// device uses the same figure). Each initiation is verified twice (once to find its peer,
/// once inside the peer's state machine), so the effective figure is about half.
pub const HANDSHAKE_RATE_LIMIT: u64 = 100;

/// The smallest output slot a state machine accepts (a handshake initiation).
const MIN_SLOT: usize = INITIATION_LEN;

/// Why packets were dropped, counted since the device started.
#[derive(Debug, Default)]
pub struct Counters {
    /// A TUN packet for an address no peer's allowed IPs cover.
    pub no_route: AtomicU64,
    /// A TUN packet for a peer with no known endpoint.
    pub no_endpoint: AtomicU64,
    /// A TUN packet that is not IPv4/IPv6, or a datagram that is not a WireGuard message.
    pub malformed: AtomicU64,
    /// A datagram that failed authentication, replay or state checks.
    pub rejected: AtomicU64,
    /// A datagram for a peer we do not have (unknown key or index).
    pub unknown_peer: AtomicU64,
    /// A decrypted packet whose source address the sending peer may not use.
    pub not_allowed: AtomicU64,
    /// A packet while the device has no private key.
    pub no_key: AtomicU64,
    /// A datagram for the side channel (not WireGuard) that its full sink dropped.
    pub side_dropped: AtomicU64,
    /// A packet or datagram the queue's AQM (CoDel) dropped from a standing queue.
    pub queue_dropped: AtomicU64,
    /// Not a drop: packets and datagrams handed to the crypto pool to seal or open.
    pub pooled: AtomicU64,
    /// Packets the access policy's filter dropped, per direction and reason.
    pub policy: PolicyDrops,
    /// A WireGuard datagram unwrapped from a relay `recv` that names another peer than the
    /// one it authenticates as (see `crate::relay`): dropped, the endpoint unchanged.
    pub relay_misnamed: AtomicU64,
}

impl Counters {
    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// An authenticated data message or handshake of `len` bytes came from `from` to our `local`
/// address: the peer follows it there (roaming) and is answered from where it sent to (sticky
/// source). A cookie reply never gets here (see `datagram`).
fn follow(peer: &Peer, p: &mut PeerState, from: SocketAddr, local: Option<Source>, len: usize) {
    if p.endpoint != Some(from) {
        tracing::debug!(peer = %peer.public_key(), endpoint = %from, "peer endpoint updated");
    }
    p.seen_at(from, local);
    p.rx_bytes += len as u64;
}

/// Device-wide configuration and the peer tables; written only by configuration changes.
pub(crate) struct State {
    pub private_key: Option<SecretKey>,
    pub public_key: Option<Key>,
    pub listen_port: u16,
    pub fwmark: u32,
    pub protocol: Protocol,
    pub rate_limiter: Arc<RateLimiter>,
    pub peers: HashMap<Key, Arc<Peer>>,
    pub by_index: HashMap<u32, Arc<Peer>>,
    pub routes: AllowedIps<Arc<Peer>>,
    /// The access policy's filter (None: no filter; see `crate::policy`).
    pub policy: Option<PolicyFilter>,
}

/// Gives every peer its slot in the policy filter: the filter's peer whose mesh address
/// the peer's allowed IPs route (once per filter or peer change, never per packet).
pub(crate) fn resolve_policy_slots(state: &State) {
    let Some(policy) = &state.policy else {
        for peer in state.peers.values() {
            peer.lock().policy.slot = None;
        }
        return;
    };
    let slots = policy_slots(policy, &state.routes);
    for (key, peer) in &state.peers {
        peer.lock().policy.slot = slots.get(key).copied();
    }
}

/// Per WireGuard peer, its slot in `policy`: the filter's peer whose mesh address its
/// allowed IPs route (a route prefix never holds a mesh address, so a router's extra
/// prefixes change nothing here).
fn policy_slots(
    policy: &PolicyFilter,
    routes: &AllowedIps<Arc<Peer>>,
) -> HashMap<Key, plexsphere_policy::PeerRef> {
    let mut slots: HashMap<Key, plexsphere_policy::PeerRef> = HashMap::new();
    for (slot, addrs) in &policy.peers {
        for a in addrs {
            if let Some(peer) = routes.get(*a) {
                slots.entry(peer.public_key()).or_insert(*slot);
            }
        }
    }
    slots
}

/// A userspace WireGuard device; see the module docs.
pub struct Device {
    state: RwLock<State>,
    counters: Counters,
    /// Peers whose packets boringtun queued while it had no session (see `tun_packet`), and
    /// how many there are, so the packet path looks at the set only while one exists.
    pending: Mutex<HashSet<Key>>,
    pending_count: AtomicUsize,
    /// The segmentation probes waiting for replies (see `crate::probe`).
    pub(crate) probes: crate::probe_match::Probes,
    /// The relays this data plane frames for (see `crate::relay`).
    relays: RelayTable,
}

impl Default for Device {
    fn default() -> Self {
        Self::new()
    }
}

impl Device {
    /// An empty device: no key, no peers, listen port 0. Configure it with `apply`.
    pub fn new() -> Self {
        let rate_limiter = Arc::new(RateLimiter::new(
            &boringtun::x25519::PublicKey::from([0u8; 32]),
            HANDSHAKE_RATE_LIMIT,
        ));
        Self {
            state: RwLock::new(State {
                private_key: None,
                public_key: None,
                listen_port: 0,
                fwmark: 0,
                protocol: Protocol::default(),
                rate_limiter,
                peers: HashMap::new(),
                by_index: HashMap::new(),
                routes: AllowedIps::new(),
                policy: None,
            }),
            counters: Counters::default(),
            pending: Mutex::new(HashSet::new()),
            pending_count: AtomicUsize::new(0),
            probes: crate::probe_match::Probes::default(),
            relays: RelayTable::new(),
        }
    }

    /// Installs the access policy's filter (None: no filter), atomically for every lane:
    /// packets decided after this call use it. The flows the new filter would not let this
    /// node open are forgotten in the same step, so a revoked flow's replies stop with it.
    pub fn set_policy(&self, policy: Option<PolicyFilter>) {
        let mut state = self.write();
        // Each peer's flows are pruned with its slot in the new filter: a route flow's
        // remote address (a host behind the peer) names no peer of the filter.
        let slots = policy.as_ref().map(|p| policy_slots(p, &state.routes));
        for (key, peer) in &state.peers {
            let flows = &mut peer.lock().policy.flows;
            match (&policy, &slots) {
                (Some(p), Some(slots)) => {
                    decide::prune_peer_flows(&p.filter, slots.get(key).copied(), flows);
                }
                _ => *flows = PeerPolicy::flow_table(),
            }
        }
        state.policy = policy;
        resolve_policy_slots(&state);
    }

    /// The installed filter's version and why it is closed, if it is (None: no filter).
    pub fn policy(&self) -> Option<(Option<u64>, Option<String>)> {
        self.read()
            .policy
            .as_ref()
            .map(|p| (p.version(), p.closed_reason().map(str::to_owned)))
    }

    /// The flows in the peers' flow tables.
    pub fn policy_flows(&self) -> usize {
        self.read()
            .peers
            .values()
            .map(|p| p.lock().policy.flows.len())
            .sum()
    }

    /// The policy's decision on a packet to or from `peer`; a drop is counted and logged
    /// at a bounded rate. Always true without a filter.
    fn policy_passes(
        &self,
        state: &State,
        peer: &Peer,
        p: &mut PeerState,
        inbound: bool,
        packet: &[u8],
        now: Instant,
    ) -> bool {
        let Some(policy) = &state.policy else {
            return true;
        };
        // The peer's own flow table, under the peer's lock the caller holds: both lanes
        // take it for this peer anyway, so a reply finds its flow on any lane, at no extra
        // lock.
        let (slot, flows) = (p.policy.slot, &mut p.policy.flows);
        let decision = if inbound {
            decide::inbound_bytes(&policy.filter, slot, packet, flows, now)
        } else {
            decide::outbound_bytes(&policy.filter, slot, packet, flows, now)
        };
        match decision {
            Decision::Accept(_) => true,
            Decision::Drop(why) => {
                self.counters.policy.count(inbound, &why);
                let slot = p.policy.slot;
                let name = || match slot {
                    Some(slot) => policy.filter.peer_name(slot).to_owned(),
                    None => peer.public_key().to_string(),
                };
                p.policy.log(name, inbound, &why, now);
                false
            }
        }
    }

    /// An empty device whose peers use `protocol`.
    pub fn with_protocol(protocol: Protocol) -> Self {
        let device = Self::new();
        device.write().protocol = protocol;
        device
    }

    /// The protocol implementation the peers use.
    pub fn protocol(&self) -> Protocol {
        self.read().protocol
    }

    /// Switches the peers' protocol implementation; every session is dropped (the peers
    /// handshake again on their next packet).
    pub(crate) fn set_protocol(&self, protocol: Protocol) {
        let mut state = self.write();
        if state.protocol != protocol {
            state.protocol = protocol;
            for peer in state.peers.values() {
                peer.lock().machine = None;
            }
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The relays the packet threads frame for and unwrap from (see `crate::relay`).
    pub fn relays(&self) -> &RelayTable {
        &self.relays
    }

    /// The endpoint "through the relay at `relay` (UDP) to `peer`", to set as the peer's
    /// endpoint; the relay's frames are unwrapped from now on.
    pub fn relay_endpoint(&self, relay: SocketAddr, peer: &Key) -> Result<SocketAddr, RelayError> {
        let mut prefix = [0u8; 8];
        prefix.copy_from_slice(&peer.0[..8]);
        self.relays.endpoint(relay, &prefix)
    }

    /// Whether a datagram from `from` may be `peer`'s: a relay endpoint names the peer by its
    /// key prefix, and a datagram that authenticates as another peer is not let move that
    /// peer's endpoint (counted, dropped).
    fn relay_names(&self, peer: &Peer, from: SocketAddr) -> bool {
        match crate::relay::decode(from) {
            Some((_, prefix)) if peer.public_key().0[..8] != prefix => {
                tracing::trace!(peer = %peer.public_key(), %from, "a relayed datagram names another peer than it authenticates as; dropped");
                Counters::bump(&self.counters.relay_misnamed);
                false
            }
            _ => true,
        }
    }

    /// Counts packets a queue's AQM dropped (see `crate::lane`).
    pub(crate) fn count_queue_dropped(&self, n: usize) {
        if n > 0 {
            self.counters
                .queue_dropped
                .fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Counts a side-channel datagram its sink dropped (see `crate::side`).
    pub(crate) fn count_side_dropped(&self) {
        Counters::bump(&self.counters.side_dropped);
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The peer with this public key.
    pub fn peer(&self, key: &Key) -> Option<Arc<Peer>> {
        self.read().peers.get(key).cloned()
    }

    /// Encrypts packets read from the TUN into `to_network`.
    pub fn handle_tun_packets(
        &self,
        now: Instant,
        packets: &PacketBatch,
        to_network: &mut PacketBatch,
    ) {
        self.handle_tun_iter(now, packets.iter().map(|(p, _)| p), to_network);
    }

    /// Encrypts packets from any source (a queue's chunk) into `to_network`, under one lock.
    pub fn handle_tun_iter<'a>(
        &self,
        now: Instant,
        packets: impl IntoIterator<Item = &'a [u8]>,
        to_network: &mut PacketBatch,
    ) {
        let state = self.read();
        for p in packets {
            self.tun_packet(&state, now, p, to_network, None);
        }
    }

    /// Like `handle_tun_iter`, for the crypto pool: a packet for a peer with a session of
    /// plexd's own protocol is only laid out in `job` (header, counter, plaintext) with an
    /// operation to seal it, which any thread may do (`crate::pool`); the rest as inline.
    pub fn handle_tun_iter_deferred<'a>(
        &self,
        now: Instant,
        packets: impl IntoIterator<Item = &'a [u8]>,
        job: &mut Job,
    ) {
        let state = self.read();
        for p in packets {
            self.tun_packet(&state, now, p, &mut job.batch, Some(&mut job.ops));
        }
    }

    /// One packet from the TUN; see `handle_tun_packets`.
    pub fn handle_tun_packet(&self, now: Instant, packet: &[u8], to_network: &mut PacketBatch) {
        let state = self.read();
        self.tun_packet(&state, now, packet, to_network, None);
    }

    fn tun_packet(
        &self,
        state: &State,
        now: Instant,
        packet: &[u8],
        out: &mut PacketBatch,
        defer: Option<&mut Vec<Op>>,
    ) {
        let Some(dst) = Tunn::dst_address(packet) else {
            Counters::bump(&self.counters.malformed);
            return;
        };
        let Some(peer) = state.routes.get(dst) else {
            tracing::trace!(%dst, "no peer's allowed IPs cover this destination; dropped");
            Counters::bump(&self.counters.no_route);
            return;
        };
        let mut p = peer.lock();
        if !packet.is_empty() && !self.policy_passes(state, peer, &mut p, false, packet, now) {
            return;
        }
        let Some(endpoint) = p.endpoint else {
            Counters::bump(&self.counters.no_endpoint);
            return;
        };
        let Some(machine) = peer.machine(
            &mut p,
            state.private_key.as_ref(),
            &state.rate_limiter,
            state.protocol,
        ) else {
            Counters::bump(&self.counters.no_key);
            return;
        };
        let slot = out.next_slot();
        if slot.len() < (packet.len() + WG_OVERHEAD).max(MIN_SLOT) {
            Counters::bump(&self.counters.malformed);
            return;
        }
        // The pool's path: only while no peer waits for its queue to be flushed (that one
        // ordering case stays inline).
        if let Some(ops) = defer
            && self.pending_count.load(Ordering::Acquire) == 0
            && let Some(t) = machine.plexd()
            && let Some((keys, counter)) = t.reserve_send(now, packet.is_empty())
        {
            write_data_header(&keys, counter, slot);
            slot[DATA_HEADER..DATA_HEADER + packet.len()].copy_from_slice(packet);
            let n = packet.len() + WG_OVERHEAD;
            ops.push(Op::seal(out.len(), keys, counter, packet.len()));
            Counters::bump(&self.counters.pooled);
            p.tx_bytes += n as u64;
            p.last_sent = Some(now);
            out.commit(n, endpoint);
            out.set_src(p.source());
            return;
        }
        let (sent, queued) = match machine.encapsulate(now, packet, slot) {
            // Without a session the machine queues the packet and answers with an initiation.
            Step::Network(n) => (n, slot.first() == Some(&INITIATION)),
            Step::Rejected(e) => {
                tracing::debug!(peer = %peer.public_key(), error = %e, "encapsulate failed");
                return;
            }
            // Queued until the handshake in flight completes.
            _ => (0, true),
        };
        if queued {
            self.set_pending(peer.public_key(), true);
        } else if self.pending_count.load(Ordering::Acquire) > 0 && self.take_pending(peer) {
            // The first packet on a new session: what boringtun queued before it goes first,
            // so the flow keeps its order (their counters are higher; the replay window takes
            // them in any order).
            let this = out.next_slot()[..sent].to_vec();
            self.flush_queue(&mut p, now, endpoint, out);
            out.push(&this, endpoint);
            p.tx_bytes += sent as u64;
            p.last_sent = Some(now);
            return;
        }
        if sent == 0 {
            return;
        }
        p.tx_bytes += sent as u64;
        p.last_sent = Some(now);
        out.commit(sent, endpoint);
        out.set_src(p.source());
    }

    fn set_pending(&self, key: Key, pending: bool) {
        let mut set = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = if pending {
            set.insert(key)
        } else {
            set.remove(&key)
        };
        if changed {
            self.pending_count.store(set.len(), Ordering::Release);
        }
    }

    /// Whether boringtun may hold queued packets of `peer`; forgets it.
    fn take_pending(&self, peer: &Peer) -> bool {
        let mut set = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let was = set.remove(&peer.public_key());
        self.pending_count.store(set.len(), Ordering::Release);
        was
    }

    /// Decrypts datagrams from the network: plaintext into `to_tun`, handshake answers and
    /// queued packets into `to_network`.
    pub fn handle_udp_datagrams(
        &self,
        now: Instant,
        datagrams: &PacketBatch,
        to_network: &mut PacketBatch,
        to_tun: &mut PacketBatch,
    ) {
        self.handle_udp_iter(now, datagrams.datagrams_to(), to_network, to_tun);
    }

    /// Decrypts datagrams from any source (a queue's chunk), under one lock; see
    /// `handle_udp_datagrams`.
    pub(crate) fn handle_udp_iter<'a>(
        &self,
        now: Instant,
        datagrams: impl IntoIterator<Item = (&'a [u8], SocketAddr, Option<Source>)>,
        to_network: &mut PacketBatch,
        to_tun: &mut PacketBatch,
    ) {
        let state = self.read();
        for (datagram, from, local) in datagrams {
            self.datagram(&state, now, (from, local), datagram, to_network, to_tun);
        }
    }

    /// One datagram from `from`; see `handle_udp_datagrams`.
    pub fn handle_udp_datagram(
        &self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
        to_network: &mut PacketBatch,
        to_tun: &mut PacketBatch,
    ) {
        self.handle_udp_datagram_at(now, (from, None), datagram, to_network, to_tun);
    }

    /// One datagram from `from` that arrived at the local address `local` (the reply leaves
    /// from there); see `handle_udp_datagrams`.
    pub(crate) fn handle_udp_datagram_at(
        &self,
        now: Instant,
        (from, local): (SocketAddr, Option<Source>),
        datagram: &[u8],
        to_network: &mut PacketBatch,
        to_tun: &mut PacketBatch,
    ) {
        let state = self.read();
        self.datagram(&state, now, (from, local), datagram, to_network, to_tun);
    }

    /// Like `handle_udp_iter`, for the crypto pool: a data message on a session of plexd's own
    /// protocol is only checked and laid out in `job` with an operation to open it; the rest
    /// (handshakes, other peers) as inline, into `job`'s batch and `to_network`. Once the
    /// job is worked, `finish_opened` delivers it, in order.
    pub(crate) fn handle_udp_iter_deferred<'a>(
        &self,
        now: Instant,
        datagrams: impl IntoIterator<Item = (&'a [u8], SocketAddr, Option<Source>)>,
        to_network: &mut PacketBatch,
        job: &mut Job,
    ) {
        let state = self.read();
        for (d, from, local) in datagrams {
            if state.protocol == Protocol::Plexd
                && d.len() >= DATA_MIN
                && d[0] == DATA
                && self.defer_open(&state, now, (from, local), d, job)
            {
                continue;
            }
            self.datagram(&state, now, (from, local), d, to_network, &mut job.batch);
        }
    }

    /// Lays a data message out for the pool; false when the inline path must take it.
    fn defer_open(
        &self,
        state: &State,
        now: Instant,
        (from, local): (SocketAddr, Option<Source>),
        d: &[u8],
        job: &mut Job,
    ) -> bool {
        let Some(peer) = state.by_index.get(&(le32(d, 4) >> 8)) else {
            return false;
        };
        if !self.relay_names(peer, from) {
            return true;
        }
        let mut p = peer.lock();
        let Some(t) = p.machine.as_mut().and_then(Machine::plexd) else {
            return false;
        };
        let ticket = match t.open_check(now, d) {
            Ok(ticket) => ticket,
            Err(e) => {
                tracing::trace!(peer = %peer.public_key(), %from, error = %e, "datagram rejected");
                Counters::bump(&self.counters.rejected);
                return true;
            }
        };
        let body = &d[DATA_HEADER..];
        let slot = job.batch.next_slot();
        if slot.len() < body.len() {
            Counters::bump(&self.counters.malformed);
            return true;
        }
        slot[..body.len()].copy_from_slice(body);
        let i = job.batch.len();
        job.batch.commit(body.len(), from);
        job.batch.set_src(local);
        job.ops.push(Op {
            slot: i,
            ticket,
            len: body.len(),
            kind: OpKind::Open(Opening {
                peer: peer.clone(),
                from,
                local,
                datagram_len: d.len(),
                opened: None,
            }),
        });
        Counters::bump(&self.counters.pooled);
        true
    }

    /// Delivers a job the pool opened, in the order it was read: each message's counter is
    /// marked in its replay window, the peer follows it (roaming, sticky source), and its
    /// plaintext stays in the batch only if the peer may use its source address. Packets a
    /// new session lets out go to `to_network`. The batch is left with the packets for the
    /// host only.
    pub(crate) fn finish_opened(&self, now: Instant, job: &mut Job, to_network: &mut PacketBatch) {
        let state = self.read();
        for op in job.ops.drain(..) {
            let OpKind::Open(o) = &op.kind else { continue };
            let keep = self.finish_one(&state, now, &op, o, job.batch.get(op.slot), to_network);
            job.batch.truncate(op.slot, keep);
        }
        job.batch.retain_nonempty();
    }

    /// One opened data message (`slot`: its slot, plaintext first): how many of its bytes go
    /// to the host (0: none).
    fn finish_one(
        &self,
        state: &State,
        now: Instant,
        op: &Op,
        o: &Opening,
        slot: &[u8],
        to_network: &mut PacketBatch,
    ) -> usize {
        let peer = &o.peer;
        let Some(n) = o.opened else {
            tracing::trace!(peer = %peer.public_key(), from = %o.from, "data message does not authenticate");
            Counters::bump(&self.counters.rejected);
            return 0;
        };
        let packet = &slot[..n];
        let mut p = peer.lock();
        let finished = match p.machine.as_mut().and_then(Machine::plexd) {
            Some(t) => t.open_finish(now, &op.ticket, packet),
            None => Err(crate::noise::NoiseError::UnknownSession),
        };
        let keep = match finished {
            Ok(Output::Tunnel(len, src))
                if self.allowed(state, peer, &mut p, src, &packet[..len], now) =>
            {
                len
            }
            Ok(_) => 0,
            Err(e) => {
                tracing::trace!(peer = %peer.public_key(), from = %o.from, error = %e, "datagram rejected");
                Counters::bump(&self.counters.rejected);
                return 0;
            }
        };
        follow(peer, &mut p, o.from, o.local, o.datagram_len);
        if self.pending_count.load(Ordering::Acquire) > 0 && self.take_pending(peer) {
            self.flush_queue(&mut p, now, o.from, to_network);
        }
        keep
    }

    fn find_peer(
        &self,
        state: &State,
        (from, local): (SocketAddr, Option<Source>),
        datagram: &[u8],
        to_network: &mut PacketBatch,
    ) -> Option<Arc<Peer>> {
        let receiver = match Tunn::parse_incoming_packet(datagram) {
            Ok(Packet::HandshakeInit(init)) => {
                let (Some(sk), Some(pk)) = (&state.private_key, &state.public_key) else {
                    Counters::bump(&self.counters.no_key);
                    return None;
                };
                // MAC1 and the load check before any Diffie-Hellman, so a flood of forged
                // initiations costs a hash each, and a loaded device answers with a cookie.
                let slot = to_network.next_slot();
                match state
                    .rate_limiter
                    .verify_packet(Some(from.ip()), datagram, slot)
                {
                    Ok(_) => {}
                    Err(TunnResult::WriteToNetwork(cookie)) => {
                        let n = cookie.len();
                        to_network.commit(n, from);
                        to_network.set_src(local);
                        return None;
                    }
                    Err(_) => {
                        Counters::bump(&self.counters.rejected);
                        return None;
                    }
                }
                let found = parse_handshake_anon(&sk.static_secret(), &pk.x25519(), &init)
                    .ok()
                    .and_then(|half| state.peers.get(&Key(half.peer_static_public)).cloned());
                if found.is_none() {
                    Counters::bump(&self.counters.unknown_peer);
                }
                return found;
            }
            Ok(Packet::HandshakeResponse(p)) => p.receiver_idx,
            Ok(Packet::PacketCookieReply(p)) => p.receiver_idx,
            Ok(Packet::PacketData(p)) => p.receiver_idx,
            Err(_) => {
                Counters::bump(&self.counters.malformed);
                return None;
            }
        };
        let found = state.by_index.get(&(receiver >> 8)).cloned();
        if found.is_none() {
            Counters::bump(&self.counters.unknown_peer);
        }
        found
    }

    fn datagram(
        &self,
        state: &State,
        now: Instant,
        (from, local): (SocketAddr, Option<Source>),
        datagram: &[u8],
        to_network: &mut PacketBatch,
        to_tun: &mut PacketBatch,
    ) {
        let Some(peer) = self.find_peer(state, (from, local), datagram, to_network) else {
            return;
        };
        if !self.relay_names(&peer, from) {
            return;
        }
        let kind = datagram.first().copied().unwrap_or(0);
        let mut p = peer.lock();
        let Some(machine) = peer.machine(
            &mut p,
            state.private_key.as_ref(),
            &state.rate_limiter,
            state.protocol,
        ) else {
            Counters::bump(&self.counters.no_key);
            return;
        };
        // Plaintext lands straight in the TUN batch; handshake answers are copied out of it.
        let slot = to_tun.next_slot();
        if slot.len() < datagram.len().max(MIN_SLOT) {
            Counters::bump(&self.counters.malformed);
            return;
        }
        let mut answered = false;
        match machine.decapsulate(now, from.ip(), datagram, slot) {
            Step::Tunnel(n, src) => {
                self.deliver(state, &peer, &mut p, (src, n, now), from, to_tun);
            }
            Step::Network(n) => {
                let buf = &to_tun.next_slot()[..n];
                if buf.first() == Some(&COOKIE_REPLY) {
                    // We are under load and the sender has not proven its address yet:
                    // answer it where it is, but do not trust the address for the peer.
                    to_network.push(buf, from);
                    to_network.set_src(local);
                    return;
                }
                to_network.push(buf, from);
                to_network.set_src(local);
                answered = true;
            }
            Step::Done => {}
            Step::Rejected(e) => {
                tracing::trace!(peer = %peer.public_key(), %from, error = %e, "datagram rejected");
                Counters::bump(&self.counters.rejected);
                return;
            }
        }
        if kind == COOKIE_REPLY {
            // A cookie reply only stores a cookie for our next initiation. Anyone who saw that
            // initiation and knows the peer's public key (every other peer of it does) can
            // make one that opens, so, like the kernel, the peer does not roam on it: only an
            // authenticated data message or handshake moves the endpoint.
            return;
        }
        follow(&peer, &mut p, from, local, datagram.len());
        if answered {
            // An initiation we answered, or a response we confirmed with a keepalive.
            if kind == INITIATION || kind == RESPONSE {
                p.last_handshake = Some(now);
            }
            p.tx_bytes += to_network.get(to_network.len() - 1).len() as u64;
            p.last_sent = Some(now);
            self.flush_queue(&mut p, now, from, to_network);
        } else if self.pending_count.load(Ordering::Acquire) > 0 && self.take_pending(&peer) {
            // Data on the session confirms it (a responder may send only now): what boringtun
            // queued before it leaves now, ahead of any later packet.
            self.flush_queue(&mut p, now, from, to_network);
        }
    }

    /// Sends what boringtun queued while the handshake was in flight.
    fn flush_queue(
        &self,
        p: &mut PeerState,
        now: Instant,
        to: SocketAddr,
        to_network: &mut PacketBatch,
    ) {
        let src = p.source();
        let Some(machine) = p.machine.as_mut() else {
            return;
        };
        loop {
            let slot = to_network.next_slot();
            let Some(n) = machine.next_queued(now, slot) else {
                break;
            };
            to_network.commit(n, to);
            to_network.set_src(src);
            p.tx_bytes += n as u64;
            p.last_sent = Some(now);
        }
    }

    /// A decrypted packet goes to the TUN only if its source is one the peer may use.
    fn deliver(
        &self,
        state: &State,
        peer: &Arc<Peer>,
        p: &mut PeerState,
        (src, len, now): (IpAddr, usize, Instant),
        from: SocketAddr,
        to_tun: &mut PacketBatch,
    ) {
        if self.allowed(state, peer, p, src, &to_tun.next_slot()[..len], now) {
            to_tun.commit(len, from);
        }
    }

    /// Whether a decrypted `packet` from `src` goes to the host: the source is one `peer`
    /// may use (else counted), it is not a probe's echo reply (counted there), and the
    /// policy's filter lets it in (else counted and logged).
    fn allowed(
        &self,
        state: &State,
        peer: &Arc<Peer>,
        p: &mut PeerState,
        src: IpAddr,
        packet: &[u8],
        now: Instant,
    ) -> bool {
        match state.routes.get(src) {
            Some(owner) if Arc::ptr_eq(owner, peer) => {
                !self.probes.claim(packet, src)
                    && self.policy_passes(state, peer, p, true, packet, now)
            }
            _ => {
                tracing::trace!(peer = %peer.public_key(), %src, "source outside the peer's allowed IPs; dropped");
                Counters::bump(&self.counters.not_allowed);
                false
            }
        }
    }

    /// Drives every peer's timers: handshake retries, rekeys, keepalives. Call it at least
    /// every 250 ms, and the rate limiter is reset from here too.
    pub fn handle_timer(&self, now: Instant, to_network: &mut PacketBatch) {
        let state = self.read();
        state.rate_limiter.reset_count();
        for peer in state.peers.values() {
            let mut p = peer.lock();
            let endpoint = p.endpoint;
            let keepalive_due = match (p.keepalive, p.last_sent) {
                (Some(every), Some(last)) => now.saturating_duration_since(last) >= every,
                (Some(_), None) => true,
                (None, _) => false,
            };
            // A peer never used has no state machine and nothing to time, unless a
            // keepalive is due (which starts a handshake).
            if p.machine.is_none() && !(keepalive_due && endpoint.is_some()) {
                continue;
            }
            let Some(machine) = peer.machine(
                &mut p,
                state.private_key.as_ref(),
                &state.rate_limiter,
                state.protocol,
            ) else {
                continue;
            };
            let mut sent = 0;
            let slot = to_network.next_slot();
            if slot.len() < MIN_SLOT {
                // boringtun would panic writing an initiation into it: the caller's batch is wrong.
                Counters::bump(&self.counters.malformed);
                return;
            }
            if let Some(n) = machine.update_timers(now, slot) {
                sent = n;
            }
            if sent == 0 && keepalive_due && endpoint.is_some() {
                // An empty packet is a keepalive; without a session it starts a handshake.
                if let Step::Network(n) = machine.encapsulate(now, &[], slot) {
                    sent = n;
                }
            }
            if let (Some(to), true) = (endpoint, sent > 0) {
                to_network.commit(sent, to);
                to_network.set_src(p.source());
                p.tx_bytes += sent as u64;
                p.last_sent = Some(now);
            }
        }
    }
}
