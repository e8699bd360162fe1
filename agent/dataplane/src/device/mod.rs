//! The data plane's core: peers, routing and the packet path, with no sockets and no clock.
//!
//! Time is always a parameter, so tests step it: each input takes the monotonic
//! `now: Instant`, and the wall clock, which only plexd's own protocol needs (its handshake
//! timestamps), is read by the device's owner and handed to [`Device::new`], then with every
//! tick (`handle_timer(now: Now)`), so a wall clock stepped later is followed. Outputs are
//! written into caller-owned batches: datagrams for the network (each with its destination)
//! and packets for the TUN. The device is `Sync`: the runner drives the two directions from
//! two threads; they share the routing table under a read lock and meet only on a peer's own
//! lock, so one flow is never reordered.
//!
//! # Entry points
//!
//! Four: one per input (the host's packets, the network's datagrams, the timer's tick) and
//! the pool's finish. Every caller (the runner's one loop per direction, `crate::loops`, the
//! tests, the benches) goes through them, so there is one packet path to test and measure:
//! - [`Device::handle_tun`]: plaintext packets from the host, any iterator of them (a TUN
//!   read, a queue's chunk, one packet), under one read lock;
//! - [`Device::handle_udp`]: datagrams from the network, each with its source and the local
//!   address it arrived at, likewise;
//! - [`Device::finish_opened`]: a pool job of openings, once worked, delivered in order; a
//!   separate step because it runs later than the input, on the pool's result;
//! - [`Device::handle_timer`]: handshake retries, rekeys and keepalives.
//!
//! An iterator serves a whole read, a chunk and a single packet alike, so there is no
//! per-shape variant; where the crypto happens is an argument, not a second method, so the
//! inline and the pool's paths are the same code up to the seal or open itself.
//!
//! The two packet inputs take a [`Crypto`]: where the sealing or opening happens. `Inline`:
//! the calling thread does it, into the batch given. `Pool`: a data message on a session of
//! plexd's own protocol is only laid out in a [`Job`] for the ordered crypto pool
//! (`crate::pool`), everything else (handshakes, boringtun's sessions) is done inline into the
//! job's batch, in order; a sealed job is sent as it is, an opened one goes through
//! `finish_opened`. One packet or datagram is an array of one (`[packet]`).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use boringtun::noise::rate_limiter::RateLimiter;
use plexsphere_wire::clock::Now;

use crate::machine::{Protocol, Step};
use crate::noise::handshake::INITIATION_LEN;

use crate::allowed_ips::AllowedIps;
use crate::batch::PacketBatch;
use crate::key::{PublicKey, SecretKey};
use crate::peer::Peer;
use crate::policy::{PolicyDrops, PolicyFilter};
use crate::pool::Job;
use crate::relay::{RelayError, RelayTable};

// What the device does, each part adding to `impl Device`: the host's packets out to the
// network (`outbound`), the network's datagrams in to the host (`inbound`, and `pooled` for
// the crypto pool's openings), the access policy (`filter`). This file keeps the device's
// state, its configuration accessors and the timers.
pub(crate) mod filter;
mod inbound;
mod outbound;
mod pooled;

/// Where the packet inputs seal or open; see the module docs.
pub enum Crypto<'a> {
    /// The calling thread seals (opens) each packet (datagram) into this batch: datagrams for
    /// the network (`handle_tun`), packets for the host (`handle_udp`).
    Inline(&'a mut PacketBatch),
    /// Data messages on sessions of plexd's own protocol are laid out in this job for the
    /// crypto pool; the rest is done inline into the job's batch, in order.
    Pool(&'a mut Job),
}

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

/// A wall clock more than this away from where the device's reading says it should be has been
/// stepped (set by hand, or NTP's first sync on a host without a real-time clock): the device
/// takes the timer's new reading (`Device::handle_timer`).
pub const WALL_CLOCK_STEP: Duration = Duration::from_secs(1);

/// Whether `now.wall` is more than [`WALL_CLOCK_STEP`] from `reading.wall` plus the monotonic
/// time since `reading.at`.
fn wall_clock_stepped(reading: Now, now: Now) -> bool {
    let Some(expected) = reading.wall_at(now.at) else {
        return true;
    };
    let off = match now.wall.duration_since(expected) {
        Ok(ahead) => ahead,
        Err(behind) => behind.duration(),
    };
    off > WALL_CLOCK_STEP
}

/// Device-wide configuration and the peer tables; written only by configuration changes (and
/// `clock` by the timer when the wall clock was stepped).
pub(crate) struct State {
    pub private_key: Option<SecretKey>,
    pub public_key: Option<PublicKey>,
    pub listen_port: u16,
    pub fwmark: u32,
    pub protocol: Protocol,
    pub rate_limiter: Arc<RateLimiter>,
    /// Both clocks as the owner read them when it built the device, or as the timer read them
    /// when the wall clock was stepped since: plexd's machines made later take their
    /// handshakes' wall time from it (`crate::noise`).
    pub clock: Now,
    pub peers: HashMap<PublicKey, Arc<Peer>>,
    pub by_index: HashMap<u32, Arc<Peer>>,
    pub routes: AllowedIps<Arc<Peer>>,
    /// The access policy's filter (None: no filter; see `crate::policy`).
    pub policy: Option<PolicyFilter>,
}

/// A userspace WireGuard device; see the module docs.
pub struct Device {
    state: RwLock<State>,
    counters: Counters,
    /// Peers whose packets boringtun queued while it had no session (see `tun_packet`), and
    /// how many there are, so the packet path looks at the set only while one exists.
    pending: Mutex<HashSet<PublicKey>>,
    pending_count: AtomicUsize,
    /// The segmentation probes waiting for replies (see `crate::probe`).
    pub(crate) probes: crate::probe_match::Probes,
    /// The relays this data plane frames for (see `crate::relay`).
    relays: RelayTable,
}

/// What relays name `peer` by: the first 8 bytes of its key.
fn key_prefix(peer: &PublicKey) -> plexsphere_wire::reach::relay::KeyPrefix {
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&peer.0[..8]);
    prefix
}

impl Device {
    /// An empty device: no key, no peers, listen port 0. Configure it with `apply`. `clock`:
    /// both clocks read now by the caller (`Now::system()`, or a test's own); plexd's own
    /// protocol takes its handshakes' wall time from it plus the monotonic time since, so a
    /// wall clock set back meanwhile does not set them back.
    pub fn new(clock: Now) -> Self {
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
                clock,
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

    /// An empty device whose peers use `protocol`; `clock` as for [`Device::new`].
    pub fn with_protocol(protocol: Protocol, clock: Now) -> Self {
        let device = Self::new(clock);
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
    pub fn relay_endpoint(
        &self,
        relay: SocketAddr,
        peer: &PublicKey,
    ) -> Result<SocketAddr, RelayError> {
        self.relays.endpoint(relay, &key_prefix(peer))
    }

    /// The endpoint "through the relay link `link` (TCP/TLS) to `peer"`, to set as the peer's
    /// endpoint; its datagrams go into the link's queue, and the link's reader hands what it
    /// reads for us to the data plane (`crate::relay_link`).
    pub fn relay_link_endpoint(
        &self,
        link: &Arc<crate::relay_link::LinkQueue>,
        peer: &PublicKey,
    ) -> Result<SocketAddr, RelayError> {
        self.relays.link_endpoint(link, &key_prefix(peer))
    }

    /// Whether a datagram from `from` may be `peer`'s: a relay endpoint names the peer by its
    /// key prefix, and a datagram that authenticates as another peer is not let move that
    /// peer's endpoint (counted, dropped).
    fn relay_names(&self, peer: &Peer, from: SocketAddr) -> bool {
        match crate::relay::decode(from) {
            Some((_, prefix)) if key_prefix(&peer.public_key()) != prefix => {
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
    pub fn peer(&self, key: &PublicKey) -> Option<Arc<Peer>> {
        self.read().peers.get(key).cloned()
    }

    /// Drives every peer's timers: handshake retries, rekeys, keepalives. Call it at least
    /// every 250 ms, and the rate limiter is reset from here too. `now` carries both clocks, read
    /// by the caller at the tick: plexd's own machines take the wall clock from it for their
    /// next initiations, and when the wall clock stepped away from the device's reading by more
    /// than [`WALL_CLOCK_STEP`] the device keeps the new reading for machines made later.
    pub fn handle_timer(&self, now: Now, to_network: &mut PacketBatch) {
        let mut state = self.read();
        if wall_clock_stepped(state.clock, now) {
            drop(state);
            self.write().clock = now;
            state = self.read();
        }
        let (clock, now) = (now, now.at);
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
                clock,
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
            if let Some(n) = machine.handle_timeout(slot, clock) {
                sent = n;
            }
            if sent == 0 && keepalive_due && endpoint.is_some() {
                // An empty packet is a keepalive; without a session it starts a handshake.
                if let Step::Network(n) = machine.handle_packet(&[], slot, now) {
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

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::{Duration, Instant, UNIX_EPOCH};

    use super::*;
    use crate::config::{DeviceUpdate, PeerUpdate};
    use crate::noise::{crypto, handshake};

    const OURS: [u8; 32] = [1; 32];
    const THEIRS: [u8; 32] = [2; 32];

    /// A device on plexd's own protocol with one peer (192.0.2.2, 10.0.0.0/24) and `clock`.
    fn plexd_device(clock: Now) -> Device {
        let device = Device::with_protocol(Protocol::Plexd, clock);
        let mut peer = PeerUpdate::new(SecretKey::from_bytes(THEIRS).public_key());
        peer.endpoint = Some(SocketAddr::from(([192, 0, 2, 2], 51820)));
        peer.allowed_ips = vec!["10.0.0.0/24".parse().expect("a network")];
        device
            .apply(DeviceUpdate {
                private_key: Some(Some(SecretKey::from_bytes(OURS))),
                peers: vec![peer],
                ..DeviceUpdate::default()
            })
            .expect("configured");
        device
    }

    /// The TAI64N of the initiation a packet at `at` starts (no session yet), decrypted as the
    /// responder does.
    fn initiation_timestamp(device: &Device, at: Instant) -> [u8; 12] {
        let packet = crate::packet::ipv4_udp(
            Ipv4Addr::new(10, 0, 1, 1),
            Ipv4Addr::new(10, 0, 0, 9),
            b"hello",
        );
        let mut out = PacketBatch::for_datagrams(4);
        device.handle_tun(at, [&packet[..]], Crypto::Inline(&mut out));
        assert_eq!(out.len(), 1, "no session: an initiation leaves");
        let init = out.get(0);
        assert_eq!(init.len(), INITIATION_LEN);
        let ours = SecretKey::from_bytes(OURS).public_key();
        let theirs = SecretKey::from_bytes(THEIRS);
        let responder = handshake::Statics::new(theirs.static_secret(), ours.0, None);
        handshake::consume_initiation(&responder, init)
            .expect("the initiation decrypts")
            .timestamp
    }

    /// The `Now` the device is built with is where plexd's own machines take their handshakes'
    /// wall time: the initiation a packet starts carries that wall time plus the monotonic time
    /// since, as TAI64N (read here as the responder reads it, by decrypting the initiation).
    #[test]
    fn an_initiation_carries_the_wall_time_of_the_devices_clock() {
        let t0 = Instant::now();
        let wall = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let device = plexd_device(Now::new(t0, wall));
        assert_eq!(
            initiation_timestamp(&device, t0 + Duration::from_secs(3)),
            crypto::tai64n(wall + Duration::from_secs(3))
        );
    }

    /// A host without a real-time clock starts plexd at a wrong wall time and NTP steps it
    /// later: the device follows at its next tick, so its initiations carry the real time (a
    /// peer that saw the real time from an earlier run refuses older ones), and a drift under
    /// the step bound keeps the device's reading.
    #[test]
    fn a_wall_clock_stepped_after_the_start_is_followed_from_the_next_tick() {
        let t0 = Instant::now();
        let booted = UNIX_EPOCH + Duration::from_secs(946_684_800); // 2000-01-01
        let device = plexd_device(Now::new(t0, booted));
        let mut out = PacketBatch::for_datagrams(4);
        let t1 = t0 + Duration::from_secs(1);
        device.handle_timer(
            Now::new(t1, booted + Duration::from_millis(1_500)),
            &mut out,
        );
        assert_eq!(
            device.read().clock.wall,
            booted,
            "0.5 s of drift is no step"
        );
        let synced = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let t2 = t0 + Duration::from_secs(2);
        device.handle_timer(Now::new(t2, synced), &mut out);
        assert_eq!(
            initiation_timestamp(&device, t2 + Duration::from_secs(3)),
            crypto::tai64n(synced + Duration::from_secs(3))
        );
    }
}
