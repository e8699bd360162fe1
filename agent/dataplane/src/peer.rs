//! One WireGuard peer: its Noise state machine, endpoint, keepalive and counters, behind a
//! lock of its own so the two packet directions and the timers only meet on the same peer.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use boringtun::noise::rate_limiter::RateLimiter;
use ipnet::IpNet;
use plexsphere_wire::clock::Now;

use crate::key::{PublicKey, SecretKey};
use crate::machine::{Machine, Protocol, Sources};
use crate::source::Source;

/// A peer of the device. The public key and index never change; the rest is in `PeerState`.
pub struct Peer {
    public_key: PublicKey,
    /// The 24-bit index boringtun puts in the top bits of our session indices; a received
    /// message's receiver index shifted right by 8 finds the peer.
    index: u32,
    state: Mutex<PeerState>,
}

/// The mutable part of a peer.
pub(crate) struct PeerState {
    /// Built on first use (`Peer::machine`), and boxed: boringtun's `Tunn` holds its eight
    /// session slots inline, about 12 KiB, which an inline `Option` would cost every peer even
    /// while None; so 10k configured peers that never talk cost a pointer each here.
    pub machine: Option<Machine>,
    pub endpoint: Option<SocketAddr>,
    /// The local address the peer last reached us at, and the endpoint it came from: the
    /// sticky source, used only while the endpoint is still that one (a configured endpoint
    /// starts without one).
    pub learned_source: Option<(SocketAddr, Source)>,
    pub preshared_key: Option<SecretKey>,
    /// Persistent keepalive interval; driven by the device's clock, not boringtun's.
    pub keepalive: Option<Duration>,
    /// When we last sent this peer anything (the keepalive timer counts from here).
    pub last_sent: Option<Instant>,
    pub last_handshake: Option<Instant>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    /// Its slot in the policy filter and its drop log's pacing (`crate::policy`).
    pub policy: crate::policy::PeerPolicy,
}

impl Peer {
    pub(crate) fn new(public_key: PublicKey, index: u32) -> Self {
        Self {
            public_key,
            index,
            state: Mutex::new(PeerState {
                machine: None,
                endpoint: None,
                learned_source: None,
                preshared_key: None,
                keepalive: None,
                last_sent: None,
                last_handshake: None,
                rx_bytes: 0,
                tx_bytes: 0,
                policy: crate::policy::PeerPolicy::default(),
            }),
        }
    }

    pub fn public_key(&self) -> PublicKey {
        self.public_key
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    /// The peer's Noise state machine, built the first time a packet, a datagram or a timer
    /// needs it; None while the device has no private key. `clock`: both clocks as the
    /// device's owner read them when it built the device (plexd's own machine takes its
    /// handshakes' wall time from it); its random source is the OS's CSPRNG.
    pub(crate) fn machine<'a>(
        &self,
        p: &'a mut PeerState,
        private_key: Option<&SecretKey>,
        rate_limiter: &Arc<RateLimiter>,
        protocol: Protocol,
        clock: Now,
    ) -> Option<&'a mut Machine> {
        if p.machine.is_none() {
            let sk = private_key?;
            p.machine = Some(Machine::new(
                protocol,
                sk,
                self.public_key,
                p.preshared_key.as_ref().map(|k| *k.bytes()),
                self.index,
                rate_limiter,
                Sources {
                    // A unit struct: boxing it allocates nothing.
                    rng: Box::new(rand_core::OsRng),
                    clock,
                },
            ));
        }
        p.machine.as_mut()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, PeerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current endpoint (for logs and tests).
    pub fn endpoint(&self) -> Option<SocketAddr> {
        self.lock().endpoint
    }
}

impl PeerState {
    /// An authenticated data message or handshake came from `from` to our `local` address:
    /// the endpoint and the source follow it (roaming). Never called for a cookie reply,
    /// which anyone who knows the peer's public key and saw our initiation can make.
    pub(crate) fn seen_at(&mut self, from: SocketAddr, local: Option<Source>) {
        self.endpoint = Some(from);
        self.learned_source = local.map(|l| (from, l));
    }

    /// The address to send to the endpoint from (none: the kernel chooses).
    pub(crate) fn source(&self) -> Option<Source> {
        match self.learned_source {
            Some((at, src)) if Some(at) == self.endpoint => Some(src),
            _ => None,
        }
    }

    /// Drops the Noise state machine after a key change, or a preshared-key change: sessions
    /// in flight are dropped, and the next use builds a new one from the device's current
    /// key and rate limiter and this peer's preshared key (`Peer::machine`), so the arguments
    /// are no longer needed here (kept for the callers in config.rs).
    pub(crate) fn rebuild_tunn(
        &mut self,
        _private_key: Option<&SecretKey>,
        _public_key: PublicKey,
        _index: u32,
        _rate_limiter: &Arc<RateLimiter>,
    ) {
        self.machine = None;
    }

    /// The wall-clock time of the last handshake, given the device clock and the wall clock
    /// read at the same moment.
    pub(crate) fn last_handshake_wall(&self, now: Instant, wall: SystemTime) -> Option<SystemTime> {
        let at = self.last_handshake?;
        wall.checked_sub(now.saturating_duration_since(at))
    }
}

/// What `get` reports about a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSnapshot {
    pub public_key: PublicKey,
    pub preshared_key: Option<SecretKey>,
    pub endpoint: Option<SocketAddr>,
    pub last_handshake: Option<SystemTime>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub persistent_keepalive: u16,
    pub allowed_ips: Vec<IpNet>,
}

/// What `get` reports about the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSnapshot {
    pub private_key: Option<SecretKey>,
    pub listen_port: u16,
    pub fwmark: u32,
    pub peers: Vec<PeerSnapshot>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every configured peer carries a `PeerState`; boringtun's `Tunn` (eight inline session
    /// slots) must stay out of it until the peer is used, or 10k peers cost 117 MiB again.
    #[test]
    fn a_peer_that_never_talked_carries_no_session_memory() {
        let inline = std::mem::size_of::<PeerState>();
        assert!(
            inline < 512,
            "PeerState is {inline} bytes; keep the Tunn boxed (it is {} bytes)",
            std::mem::size_of::<boringtun::noise::Tunn>()
        );
        let peer = Peer::new(PublicKey([7; 32]), 1);
        assert!(peer.lock().machine.is_none(), "built on first use only");
        let rate_limiter = Arc::new(RateLimiter::new(
            &crate::key::x25519(&PublicKey([0; 32])),
            10,
        ));
        let sk = SecretKey::generate().expect("key");
        let mut p = peer.lock();
        for protocol in [Protocol::Boringtun, Protocol::Plexd] {
            assert!(
                peer.machine(&mut p, None, &rate_limiter, protocol, Now::system())
                    .is_none(),
                "no key, no state machine"
            );
            assert!(
                peer.machine(&mut p, Some(&sk), &rate_limiter, protocol, Now::system())
                    .is_some()
            );
            assert!(p.machine.is_some(), "kept once built");
            p.rebuild_tunn(Some(&sk), peer.public_key(), 1, &rate_limiter);
            assert!(p.machine.is_none(), "a key change drops it");
        }
    }
}
