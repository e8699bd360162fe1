//! The desired peer set: a signed `NodeState` applied whole, events applied as deltas on top,
//! and the pure diff between two sets that backends report as peer changes.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use plexsphere_wire::node::{EventKind, NodeState, PeerSpec};
use uuid::Uuid;

/// What an event asks of the daemon beyond the peer set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// The peer set changed (apply it to the mesh).
    Changed,
    /// Nothing to do (a removal of an unknown peer, an endpoint that did not move).
    Unchanged,
    /// An endpoint change for a peer the node does not know: pull the full state.
    UnknownPeer(Uuid),
    /// This node was revoked.
    Revoked,
    /// The stream could not resume: pull the full state.
    Resync(String),
}

/// One change to a peer, as logged at info with a `peer` field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerChange {
    Added(PeerSpec),
    Updated { old: PeerSpec, new: PeerSpec },
    Removed(PeerSpec),
}

impl PeerChange {
    pub fn peer(&self) -> &PeerSpec {
        match self {
            PeerChange::Added(p) | PeerChange::Removed(p) => p,
            PeerChange::Updated { new, .. } => new,
        }
    }

    pub fn verb(&self) -> &'static str {
        match self {
            PeerChange::Added(_) => "peer added",
            PeerChange::Updated { .. } => "peer updated",
            PeerChange::Removed(_) => "peer removed",
        }
    }
}

/// The peers the control plane wants this node to have, by node id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DesiredPeers {
    peers: BTreeMap<Uuid, PeerSpec>,
}

impl DesiredPeers {
    pub fn from_state(state: &NodeState) -> Self {
        Self {
            peers: state.peers.iter().map(|p| (p.node_id, p.clone())).collect(),
        }
    }

    pub fn list(&self) -> Vec<PeerSpec> {
        self.peers.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    pub fn get(&self, id: &Uuid) -> Option<&PeerSpec> {
        self.peers.get(id)
    }

    /// Applies one event as a delta.
    pub fn apply(&mut self, kind: &EventKind) -> Delta {
        match kind {
            EventKind::PeerAdded { peer } | EventKind::PeerUpdated { peer } => {
                match self.peers.insert(peer.node_id, peer.clone()) {
                    Some(old) if old == *peer => Delta::Unchanged,
                    _ => Delta::Changed,
                }
            }
            EventKind::PeerRemoved { peer_node_id, .. } => match self.peers.remove(peer_node_id) {
                Some(_) => Delta::Changed,
                None => Delta::Unchanged,
            },
            EventKind::EndpointChanged {
                peer_node_id,
                endpoints,
            } => match self.peers.get_mut(peer_node_id) {
                Some(p) if p.endpoints == *endpoints => Delta::Unchanged,
                Some(p) => {
                    p.endpoints.clone_from(endpoints);
                    Delta::Changed
                }
                None => Delta::UnknownPeer(*peer_node_id),
            },
            EventKind::NodeRevoked => Delta::Revoked,
            EventKind::Resync { reason } => Delta::Resync(reason.clone()),
        }
    }
}

/// The changes that turn `old` into `new`, by node id (removals first, then additions and
/// updates, each in id order).
pub fn diff(old: &[PeerSpec], new: &[PeerSpec]) -> Vec<PeerChange> {
    let old: BTreeMap<Uuid, &PeerSpec> = old.iter().map(|p| (p.node_id, p)).collect();
    let new: BTreeMap<Uuid, &PeerSpec> = new.iter().map(|p| (p.node_id, p)).collect();
    let mut out = vec![];
    for (id, p) in &old {
        if !new.contains_key(id) {
            out.push(PeerChange::Removed((*p).clone()));
        }
    }
    for (id, p) in &new {
        match old.get(id) {
            None => out.push(PeerChange::Added((*p).clone())),
            Some(o) if o != p => out.push(PeerChange::Updated {
                old: (*o).clone(),
                new: (*p).clone(),
            }),
            Some(_) => {}
        }
    }
    out
}

/// The first endpoint WireGuard would use for a peer.
pub fn first_endpoint(p: &PeerSpec) -> Option<SocketAddr> {
    p.endpoints.first().copied()
}

#[cfg(test)]
mod tests {
    use super::super::accept::tests::{peer, peer_id, state};
    use super::*;

    #[test]
    fn state_is_applied_whole() {
        let d = DesiredPeers::from_state(&state(1, vec![peer(3), peer(4)]));
        assert_eq!(d.len(), 2);
        let d2 = DesiredPeers::from_state(&state(2, vec![peer(4)]));
        assert_eq!(d2.list(), vec![peer(4)]);
    }

    #[test]
    fn events_apply_as_deltas() {
        let mut d = DesiredPeers::from_state(&state(1, vec![peer(3)]));
        assert_eq!(
            d.apply(&EventKind::PeerAdded { peer: peer(4) }),
            Delta::Changed
        );
        assert_eq!(
            d.apply(&EventKind::PeerAdded { peer: peer(4) }),
            Delta::Unchanged
        );
        let mut moved = peer(4);
        moved.hostname = "renamed".into();
        assert_eq!(
            d.apply(&EventKind::PeerUpdated {
                peer: moved.clone()
            }),
            Delta::Changed
        );
        assert_eq!(d.get(&peer_id(4)).unwrap().hostname, "renamed");

        let eps = vec!["198.51.100.7:51820".parse().unwrap()];
        let ev = EventKind::EndpointChanged {
            peer_node_id: peer_id(3),
            endpoints: eps.clone(),
        };
        assert_eq!(d.apply(&ev), Delta::Changed);
        assert_eq!(d.apply(&ev), Delta::Unchanged);
        assert_eq!(first_endpoint(d.get(&peer_id(3)).unwrap()), Some(eps[0]));
        let unknown = EventKind::EndpointChanged {
            peer_node_id: peer_id(9),
            endpoints: eps,
        };
        assert_eq!(d.apply(&unknown), Delta::UnknownPeer(peer_id(9)));

        let rm = EventKind::PeerRemoved {
            peer_node_id: peer_id(3),
            public_key: "k".into(),
        };
        assert_eq!(d.apply(&rm), Delta::Changed);
        assert_eq!(d.apply(&rm), Delta::Unchanged);
        assert_eq!(d.list(), vec![moved]);

        assert_eq!(d.apply(&EventKind::NodeRevoked), Delta::Revoked);
        assert_eq!(
            d.apply(&EventKind::Resync {
                reason: "too old".into()
            }),
            Delta::Resync("too old".into())
        );
        assert_eq!(d.len(), 1, "revoked/resync leave the set to the daemon");
    }

    #[test]
    fn diff_lists_minimal_changes() {
        let mut p4b = peer(4);
        p4b.endpoints.clear();
        let changes = diff(&[peer(3), peer(4)], &[p4b.clone(), peer(5)]);
        assert_eq!(
            changes,
            vec![
                PeerChange::Removed(peer(3)),
                PeerChange::Updated {
                    old: peer(4),
                    new: p4b
                },
                PeerChange::Added(peer(5)),
            ]
        );
        assert!(diff(&[peer(3)], &[peer(3)]).is_empty());
        assert_eq!(changes[0].verb(), "peer removed");
        assert_eq!(changes[2].peer().hostname, "node-5");
    }
}
