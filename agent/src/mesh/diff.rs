//! The peer reconcile, as one pure function: the desired peers (from the verified state and
//! events) against the peers on the live interface yield the minimal update and the list of
//! changes for the journal. No sockets, no clock: time comes in as parameters.
//!
//! Minimal means: a peer that is equal on both sides produces nothing; a changed peer carries
//! only what changed (its endpoint, its allowed IPs replaced, its keepalive); a live peer that
//! is not desired is removed. "No change" is an empty update, and the backend then makes no
//! call at all.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::time::{Instant, SystemTime};

use ipnet::IpNet;
use plexsphere_wire::node::PeerSpec;
use uuid::Uuid;

use super::endpoints::EndpointBook;
pub use crate::reach::io::{EndpointOwners, Owner};
pub use plexsphere_wire::key::PublicKey;

/// A peer as the live interface has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveConfig {
    pub key: PublicKey,
    pub endpoint: Option<SocketAddr>,
    pub allowed_ips: Vec<IpNet>,
    /// Seconds; 0 is off.
    pub keepalive: u16,
    pub last_handshake: Option<SystemTime>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// One operation on one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerOp {
    Remove(PublicKey),
    /// Creates the peer or changes what is `Some`.
    Set {
        key: PublicKey,
        endpoint: Option<SocketAddr>,
        /// Replaces the peer's allowed IPs.
        allowed_ips: Option<Vec<IpNet>>,
        /// Seconds; `Some(0)` turns it off.
        keepalive: Option<u16>,
    },
}

/// The minimal update of the interface's peers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeshUpdate {
    pub ops: Vec<PeerOp>,
}

impl MeshUpdate {
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// What changed on the interface, for the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeshChange {
    Added {
        key: PublicKey,
        node_id: Uuid,
        endpoint: Option<SocketAddr>,
    },
    /// A live peer nobody wants (left, revoked, or added by hand).
    Removed {
        key: PublicKey,
    },
    EndpointChanged {
        key: PublicKey,
        from: Option<SocketAddr>,
        to: SocketAddr,
    },
    AllowedIpsChanged {
        key: PublicKey,
        from: Vec<IpNet>,
        to: Vec<IpNet>,
    },
    KeepaliveChanged {
        key: PublicKey,
        from: u16,
        to: u16,
    },
    /// A desired peer that cannot be configured (bad key, or a key used twice).
    Skipped {
        node_id: Uuid,
        reason: String,
    },
}

impl MeshChange {
    /// The peer the change is about (`None` for a skipped one, which has no usable key).
    pub fn key(&self) -> Option<PublicKey> {
        match self {
            MeshChange::Added { key, .. }
            | MeshChange::Removed { key }
            | MeshChange::EndpointChanged { key, .. }
            | MeshChange::AllowedIpsChanged { key, .. }
            | MeshChange::KeepaliveChanged { key, .. } => Some(*key),
            MeshChange::Skipped { .. } => None,
        }
    }
}

/// The update and the changes it makes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerDiff {
    pub update: MeshUpdate,
    pub changes: Vec<MeshChange>,
}

/// Allowed IPs as WireGuard stores them: host bits cleared, sorted, no duplicates.
pub fn normalize(ips: &[IpNet]) -> Vec<IpNet> {
    let mut v: Vec<IpNet> = ips.iter().map(IpNet::trunc).collect();
    v.sort();
    v.dedup();
    v
}

/// Whether two allowed-IP lists are the same once normalized, without allocating when they
/// are already in WireGuard's form (sorted, host bits clear: what the interface reports and
/// what the control plane sends).
fn same_allowed(a: &[IpNet], b: &[IpNet]) -> bool {
    let plain =
        |v: &[IpNet]| v.iter().all(|n| n.trunc() == *n) && v.windows(2).all(|w| w[0] < w[1]);
    if plain(a) && plain(b) {
        return a == b;
    }
    normalize(a) == normalize(b)
}

/// Every endpoint is the rotation's (no reach runtime).
#[derive(Debug, Clone, Copy, Default)]
pub struct RotationOnly;

impl EndpointOwners for RotationOnly {
    fn owner(&self, _key: &PublicKey) -> Owner {
        Owner::Rotation
    }
}

/// Desired vs live -> the minimal update; `book` tracks each peer's endpoint rotation. Every
/// endpoint is the rotation's; [`diff_with`] lets the reach runtime own some.
pub fn diff(
    desired: &[PeerSpec],
    live: &[LiveConfig],
    book: &mut EndpointBook,
    now: Instant,
    wall: SystemTime,
) -> PeerDiff {
    diff_with(desired, live, book, &RotationOnly, now, wall)
}

/// [`diff`], with the endpoints of the peers `owners` gives to reach left to reach.
pub fn diff_with(
    desired: &[PeerSpec],
    live: &[LiveConfig],
    book: &mut EndpointBook,
    owners: &dyn EndpointOwners,
    now: Instant,
    wall: SystemTime,
) -> PeerDiff {
    let live_by_key: BTreeMap<PublicKey, &LiveConfig> = live.iter().map(|l| (l.key, l)).collect();
    let mut out = PeerDiff::default();
    let mut wanted: HashSet<PublicKey> = HashSet::with_capacity(desired.len());
    let mut sets = Vec::new();
    for spec in desired {
        let Ok(key) = PublicKey::from_base64(&spec.public_key) else {
            out.changes.push(MeshChange::Skipped {
                node_id: spec.node_id,
                reason: "its public key is not base64 of 32 bytes".to_owned(),
            });
            continue;
        };
        if !wanted.insert(key) {
            out.changes.push(MeshChange::Skipped {
                node_id: spec.node_id,
                reason: format!("its public key {key} belongs to another desired peer"),
            });
            continue;
        }
        let keepalive = spec.persistent_keepalive_secs.unwrap_or(0);
        let current = live_by_key.get(&key).copied();
        let endpoint = match owners.owner(&key) {
            Owner::Reach { endpoint } => {
                book.forget(&key);
                match current {
                    None => endpoint.or_else(|| spec.endpoints.first().copied()),
                    Some(_) => None,
                }
            }
            Owner::Rotation => book.decide(
                key,
                &spec.endpoints,
                current.and_then(|l| l.endpoint),
                current.and_then(|l| l.last_handshake),
                now,
                wall,
            ),
        };
        match current {
            None => {
                out.changes.push(MeshChange::Added {
                    key,
                    node_id: spec.node_id,
                    endpoint,
                });
                sets.push(PeerOp::Set {
                    key,
                    endpoint,
                    allowed_ips: Some(normalize(&spec.allowed_ips)),
                    keepalive: (keepalive != 0).then_some(keepalive),
                });
            }
            Some(l) => {
                let allowed_ips = (!same_allowed(&l.allowed_ips, &spec.allowed_ips)).then(|| {
                    let live_allowed = normalize(&l.allowed_ips);
                    let allowed = normalize(&spec.allowed_ips);
                    out.changes.push(MeshChange::AllowedIpsChanged {
                        key,
                        from: live_allowed,
                        to: allowed.clone(),
                    });
                    allowed
                });
                let keepalive = (l.keepalive != keepalive).then(|| {
                    out.changes.push(MeshChange::KeepaliveChanged {
                        key,
                        from: l.keepalive,
                        to: keepalive,
                    });
                    keepalive
                });
                if let Some(to) = endpoint {
                    out.changes.push(MeshChange::EndpointChanged {
                        key,
                        from: l.endpoint,
                        to,
                    });
                }
                if endpoint.is_some() || allowed_ips.is_some() || keepalive.is_some() {
                    sets.push(PeerOp::Set {
                        key,
                        endpoint,
                        allowed_ips,
                        keepalive,
                    });
                }
            }
        }
    }
    book.retain(|k| wanted.contains(k));
    // Removals first: a removed peer's allowed IPs are then free for a new one.
    let mut changes = Vec::with_capacity(out.changes.len());
    for key in live_by_key.keys().filter(|k| !wanted.contains(k)) {
        changes.push(MeshChange::Removed { key: *key });
        out.update.ops.push(PeerOp::Remove(*key));
    }
    changes.append(&mut out.changes);
    out.changes = changes;
    out.update.ops.extend(sets);
    out
}

#[cfg(test)]
#[path = "diff_tests.rs"]
mod tests;
