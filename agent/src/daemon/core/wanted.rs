//! The peer set the node wants: a signed `NodeState` applied whole, events applied as deltas
//! on top. What changed on the interface is the mesh diff's business
//! (`crate::mesh::diff`); [`change_lines`] names those changes for the journal.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use plexsphere_wire::node::{EventKind, NodeState, PeerSpec};
use uuid::Uuid;

use crate::mesh::diff::MeshChange;
use plexsphere_wire::key::PublicKey;

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

    pub fn iter(&self) -> impl Iterator<Item = &PeerSpec> {
        self.peers.values()
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
                home_relay,
            } => match self.peers.get_mut(peer_node_id) {
                Some(p) if p.endpoints == *endpoints && p.home_relay == *home_relay => {
                    Delta::Unchanged
                }
                Some(p) => {
                    p.endpoints.clone_from(endpoints);
                    p.home_relay.clone_from(home_relay);
                    Delta::Changed
                }
                None => Delta::UnknownPeer(*peer_node_id),
            },
            EventKind::NodeRevoked => Delta::Revoked,
            EventKind::Resync { reason } => Delta::Resync(reason.clone()),
        }
    }
}

/// One change on the interface as people read it: which peer, and what happened to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeLine {
    /// `peer added`, `peer updated` or `peer removed`, for a peer plexd configured.
    Peer { verb: &'static str, peer: PeerSpec },
    /// A live peer no wanted set ever named (added by hand) was removed.
    Stranger(PublicKey),
    /// A wanted peer that cannot be configured.
    Skipped { node_id: Uuid, reason: String },
}

impl ChangeLine {
    /// The journal's text (the structured fields are added where it is logged).
    pub fn text(&self) -> String {
        match self {
            ChangeLine::Peer { verb, peer } => format!(
                "{verb} {} ({}, mesh IP {}, endpoint {})",
                peer.node_id,
                peer.hostname,
                peer.mesh_ip,
                first_endpoint(peer).map_or_else(|| "none yet".to_owned(), |e| e.to_string())
            ),
            ChangeLine::Stranger(key) => {
                format!("removed the peer {key}, which no state of this node names")
            }
            ChangeLine::Skipped { node_id, reason } => {
                format!("peer {node_id} not configured: {reason}")
            }
        }
    }
}

/// Names the changes the mesh diff made: one line per peer, additions and updates from the
/// set that was applied (`after`), removals from the set applied before it (`before`).
pub fn change_lines(
    changes: &[MeshChange],
    before: &[PeerSpec],
    after: &[PeerSpec],
) -> Vec<ChangeLine> {
    if changes.is_empty() {
        return vec![];
    }
    // One pass over each set, for the few keys that changed (not a map of every peer).
    let named: Vec<(String, PublicKey)> = changes
        .iter()
        .filter_map(MeshChange::key)
        .map(|k| (k.to_base64(), k))
        .collect();
    // A few keys are looked for by a scan, many (a first state) through a map.
    let many: HashMap<&str, PublicKey> = if named.len() > 8 {
        named.iter().map(|(t, k)| (t.as_str(), *k)).collect()
    } else {
        HashMap::new()
    };
    let lookup = |text: &str| -> Option<PublicKey> {
        if named.len() > 8 {
            many.get(text).copied()
        } else {
            named.iter().find(|(t, _)| t == text).map(|(_, k)| *k)
        }
    };
    let by_key = |set: &[PeerSpec]| -> HashMap<PublicKey, PeerSpec> {
        set.iter()
            .filter_map(|p| Some((lookup(&p.public_key)?, p.clone())))
            .collect()
    };
    let (before, after) = (by_key(before), by_key(after));
    let mut updated: Vec<PublicKey> = vec![];
    let mut out = vec![];
    for c in changes {
        match c {
            MeshChange::Added { key, .. } => {
                if let Some(p) = after.get(key) {
                    out.push(ChangeLine::Peer {
                        verb: "peer added",
                        peer: p.clone(),
                    });
                }
            }
            MeshChange::Removed { key } => out.push(match before.get(key) {
                Some(p) => ChangeLine::Peer {
                    verb: "peer removed",
                    peer: p.clone(),
                },
                None => ChangeLine::Stranger(*key),
            }),
            MeshChange::EndpointChanged { key, .. }
            | MeshChange::AllowedIpsChanged { key, .. }
            | MeshChange::KeepaliveChanged { key, .. } => {
                if updated.contains(key) {
                    continue;
                }
                updated.push(*key);
                if let Some(p) = after.get(key) {
                    out.push(ChangeLine::Peer {
                        verb: "peer updated",
                        peer: p.clone(),
                    });
                }
            }
            MeshChange::Skipped { node_id, reason } => out.push(ChangeLine::Skipped {
                node_id: *node_id,
                reason: reason.clone(),
            }),
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
    use super::*;
    use crate::daemon::core::accept_fixtures::{peer, peer_id, state};

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
            home_relay: None,
        };
        assert_eq!(d.apply(&ev), Delta::Changed);
        assert_eq!(d.apply(&ev), Delta::Unchanged);
        assert_eq!(first_endpoint(d.get(&peer_id(3)).unwrap()), Some(eps[0]));
        let unknown = EventKind::EndpointChanged {
            peer_node_id: peer_id(9),
            endpoints: eps,
            home_relay: None,
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
    fn change_lines_name_each_peer_once() {
        use crate::mesh::contract::{Mesh as _, NoneMesh};
        let mut mesh = NoneMesh::default();
        let before = vec![peer(3), peer(4)];
        mesh.apply(std::sync::Arc::new(before.clone())).unwrap();
        let mut moved = peer(4);
        moved.endpoints = vec!["198.51.100.4:51820".parse().unwrap()];
        moved.persistent_keepalive_secs = Some(25);
        let after = vec![moved.clone(), peer(5)];
        let changes = mesh.apply(std::sync::Arc::new(after.clone())).unwrap();
        let lines = change_lines(&changes, &before, &after);
        assert_eq!(
            lines,
            vec![
                ChangeLine::Peer {
                    verb: "peer removed",
                    peer: peer(3)
                },
                ChangeLine::Peer {
                    verb: "peer updated",
                    peer: moved
                },
                ChangeLine::Peer {
                    verb: "peer added",
                    peer: peer(5)
                },
            ]
        );
        assert_eq!(
            lines[2].text(),
            format!(
                "peer added {} (node-5, mesh IP 10.64.1.5, endpoint 192.0.2.5:51820)",
                peer_id(5)
            )
        );
        let stranger = PublicKey([9; 32]);
        assert_eq!(
            change_lines(&[MeshChange::Removed { key: stranger }], &[], &[]),
            vec![ChangeLine::Stranger(stranger)]
        );
    }
}
