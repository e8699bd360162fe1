//! Configuration changes and the `get` view of a device.
//!
//! `DeviceUpdate` is what a UAPI `set=1` request says, and what plexd's userspace backend
//! builds directly from its peer diff (`plexd::mesh::userspace`, no UAPI text in between); `Device::apply` carries it out with WireGuard's semantics: an allowed IP belongs
//! to one peer at a time, `replace_*` clears before adding, a new private key rekeys every peer.

use std::collections::hash_map::Entry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use boringtun::noise::rate_limiter::RateLimiter;
use ipnet::IpNet;
use ring::rand::{SecureRandom, SystemRandom};

use crate::device::{Device, HANDSHAKE_RATE_LIMIT, State};
use crate::key::{PublicKey, SecretKey};
use crate::peer::{DeviceSnapshot, Peer, PeerSnapshot};

/// A change to the device; fields left `None`/empty are left as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceUpdate {
    /// `Some(None)` removes the key (all zeros in the UAPI).
    pub private_key: Option<Option<SecretKey>>,
    pub listen_port: Option<u16>,
    pub fwmark: Option<u32>,
    pub replace_peers: bool,
    pub peers: Vec<PeerUpdate>,
}

/// A change to one peer, created if it does not exist (unless `update_only`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerUpdate {
    pub public_key: PublicKey,
    pub remove: bool,
    pub update_only: bool,
    /// `Some(None)` removes the preshared key.
    pub preshared_key: Option<Option<SecretKey>>,
    pub endpoint: Option<SocketAddr>,
    /// Seconds; `Some(0)` turns it off.
    pub persistent_keepalive: Option<u16>,
    pub replace_allowed_ips: bool,
    pub allowed_ips: Vec<IpNet>,
}

impl PeerUpdate {
    pub fn new(public_key: PublicKey) -> Self {
        Self {
            public_key,
            remove: false,
            update_only: false,
            preshared_key: None,
            endpoint: None,
            persistent_keepalive: None,
            replace_allowed_ips: false,
            allowed_ips: Vec::new(),
        }
    }
}

/// Why a configuration change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("no free peer index is left (16 million peers are configured); remove peers first")]
    IndicesExhausted,
}

fn random_index(taken: &std::collections::HashMap<u32, Arc<Peer>>) -> Result<u32, ConfigError> {
    let rng = SystemRandom::new();
    for _ in 0..64 {
        let mut b = [0u8; 4];
        if rng.fill(&mut b).is_err() {
            break;
        }
        let i = u32::from_le_bytes(b) & 0x00ff_ffff;
        if !taken.contains_key(&i) {
            return Ok(i);
        }
    }
    (0..0x0100_0000u32)
        .find(|i| !taken.contains_key(i))
        .ok_or(ConfigError::IndicesExhausted)
}

fn remove_peer(state: &mut State, key: &PublicKey) {
    if let Some(peer) = state.peers.remove(key) {
        state.by_index.remove(&peer.index());
        state.routes.retain(|_, p| !Arc::ptr_eq(p, &peer));
    }
}

impl Device {
    /// Applies `update`. Either all of it is applied or, on error, the part before the peer
    /// that failed.
    pub fn apply(&self, update: DeviceUpdate) -> Result<(), ConfigError> {
        let mut state = self.write();
        let state = &mut *state;
        if let Some(port) = update.listen_port {
            state.listen_port = port;
        }
        if let Some(mark) = update.fwmark {
            state.fwmark = mark;
        }
        if let Some(key) = update.private_key {
            set_private_key(state, key.filter(|k| !k.is_zero()));
        }
        if update.replace_peers {
            state.peers.clear();
            state.by_index.clear();
            state.routes.clear();
        }
        let changed = update.replace_peers || !update.peers.is_empty();
        let applied = update
            .peers
            .into_iter()
            .try_for_each(|change| apply_peer(state, change));
        if changed && state.policy.is_some() {
            crate::device::filter::resolve_policy_slots(state);
        }
        applied
    }

    /// Records the port the runner actually bound (when 0 was asked for).
    pub fn set_listen_port(&self, port: u16) {
        self.write().listen_port = port;
    }

    pub fn listen_port(&self) -> u16 {
        self.read().listen_port
    }

    pub fn public_key(&self) -> Option<PublicKey> {
        self.read().public_key
    }

    /// Everything `get` reports. `now` is the device clock, `wall` the wall clock, read
    /// together (the last handshake is kept on the device clock).
    pub fn snapshot(&self, now: Instant, wall: SystemTime) -> DeviceSnapshot {
        let state = self.read();
        let mut peers: Vec<PeerSnapshot> = state
            .peers
            .values()
            .map(|peer| {
                let p = peer.lock();
                PeerSnapshot {
                    public_key: peer.public_key(),
                    preshared_key: p.preshared_key.clone(),
                    endpoint: p.endpoint,
                    last_handshake: p.last_handshake_wall(now, wall),
                    rx_bytes: p.rx_bytes,
                    tx_bytes: p.tx_bytes,
                    persistent_keepalive: p
                        .keepalive
                        .map(|d| u16::try_from(d.as_secs()).unwrap_or(u16::MAX))
                        .unwrap_or(0),
                    allowed_ips: Vec::new(),
                }
            })
            .collect();
        peers.sort_by_key(|p| p.public_key);
        for (net, owner) in state.routes.iter() {
            if let Ok(i) = peers.binary_search_by_key(&owner.public_key(), |p| p.public_key) {
                peers[i].allowed_ips.push(net);
            }
        }
        for p in &mut peers {
            p.allowed_ips.sort();
        }
        DeviceSnapshot {
            private_key: state.private_key.clone(),
            listen_port: state.listen_port,
            fwmark: state.fwmark,
            peers,
        }
    }
}

fn set_private_key(state: &mut State, key: Option<SecretKey>) {
    if state.private_key == key {
        return;
    }
    let public = key.as_ref().map(SecretKey::public_key);
    // A peer with our own public key would be talking to itself (wireguard-go drops it too).
    if let Some(pk) = public {
        remove_peer(state, &pk);
    }
    state.rate_limiter = Arc::new(RateLimiter::new(
        &crate::key::x25519(&public.unwrap_or(PublicKey([0; 32]))),
        HANDSHAKE_RATE_LIMIT,
    ));
    state.private_key = key;
    state.public_key = public;
    for peer in state.peers.values() {
        let mut p = peer.lock();
        p.rebuild_tunn(
            state.private_key.as_ref(),
            peer.public_key(),
            peer.index(),
            &state.rate_limiter,
        );
    }
}

fn apply_peer(state: &mut State, change: PeerUpdate) -> Result<(), ConfigError> {
    let key = change.public_key;
    if change.remove {
        remove_peer(state, &key);
        return Ok(());
    }
    if state.public_key == Some(key) {
        return Ok(());
    }
    let peer = match state.peers.entry(key) {
        Entry::Occupied(e) => e.get().clone(),
        Entry::Vacant(_) if change.update_only => return Ok(()),
        Entry::Vacant(e) => {
            let index = random_index(&state.by_index)?;
            let peer = Arc::new(Peer::new(key, index));
            peer.lock()
                .rebuild_tunn(state.private_key.as_ref(), key, index, &state.rate_limiter);
            state.by_index.insert(index, peer.clone());
            e.insert(peer.clone());
            peer
        }
    };
    {
        let mut p = peer.lock();
        if let Some(psk) = change.preshared_key {
            let psk = psk.filter(|k| !k.is_zero());
            if p.preshared_key != psk {
                p.preshared_key = psk;
                p.rebuild_tunn(
                    state.private_key.as_ref(),
                    key,
                    peer.index(),
                    &state.rate_limiter,
                );
            }
        }
        if let Some(ep) = change.endpoint {
            p.endpoint = Some(ep);
        }
        if let Some(secs) = change.persistent_keepalive {
            let every = (secs > 0).then(|| Duration::from_secs(u64::from(secs)));
            if every.is_some() && p.keepalive.is_none() {
                // Turning keepalive on sends one at the next tick, as wireguard-go does.
                p.last_sent = None;
            }
            p.keepalive = every;
        }
    }
    if change.replace_allowed_ips {
        state.routes.retain(|_, p| !Arc::ptr_eq(p, &peer));
    }
    for net in change.allowed_ips {
        state.routes.insert(net, peer.clone());
    }
    Ok(())
}
