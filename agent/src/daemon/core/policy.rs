//! The access policy in the core: the signed state's `policy` goes with every apply to the
//! mesh thread, which installs its filter before the peers (the mesh thread's `run_apply`); the
//! answer says whether it was installed, and `plexd status` / `plexd policy` say so.
//!
//! A starting plexd applies the cached state (`on_cache`) with its policy before any
//! state from the API, so the cached filter is in place before the first peer is.

use std::collections::HashSet;
use std::sync::Arc;

use plexsphere_wire::node::{EventKind, PeerSpec, PolicyState};
use uuid::Uuid;

use super::policy_status::{FilterState, PolicyReport, PolicyStatus};
use super::{Core, MeshOp, Now, Pending};
use crate::mesh::MeshError;

/// How many peers outside the view one apply's warning names (the rest are counted).
const OUTSIDE_NAMED: usize = 3;

impl Core {
    /// A new state's policy (kept for the next apply, which `install_state` asks for).
    pub(super) fn take_policy(&mut self, policy: Option<PolicyState>) {
        let same = match (&self.policy, &policy) {
            (Some(a), Some(b)) => **a == *b,
            (None, None) => true,
            _ => false,
        };
        if same {
            return;
        }
        match &policy {
            Some(p) => tracing::info!(
                policy_version = p.version,
                peers = p.view.peers.len(),
                "the signed state carries policy version {} ({} peers in this node's view); installing its filter before the peers",
                p.version,
                p.view.peers.len()
            ),
            None => {
                tracing::info!("the signed state carries no policy: nothing is filtered")
            }
        }
        self.policy = policy.map(Arc::new);
    }

    /// Under a policy, only the view's peers are configured (the control plane sends no
    /// others; a peer it sent anyway, or an event about one, stays off the interface and
    /// is named in the journal).
    pub(super) fn in_view(&self, mut peers: Vec<PeerSpec>) -> Vec<PeerSpec> {
        let Some(policy) = &self.policy else {
            return peers;
        };
        // One set per apply: a scan of the view per peer was O(peers^2) on every apply.
        let named: HashSet<Uuid> = policy.view.peer_ids().collect();
        let mut outside: Vec<String> = vec![];
        peers.retain(|p| {
            let known = named.contains(&p.node_id);
            if !known {
                tracing::debug!(peer = %p.node_id, policy_version = policy.version, "peer {} ({}) is not in policy version {}'s view: not configured", p.hostname, p.node_id, policy.version);
                outside.push(format!("{} ({})", p.hostname, p.node_id));
            }
            known
        });
        // One line per apply, not one per peer: while 1,000 nodes register, every apply
        // would otherwise repeat a line for each peer not yet in the view.
        if !outside.is_empty() {
            let total = outside.len();
            outside.truncate(OUTSIDE_NAMED);
            let tail = if total > OUTSIDE_NAMED {
                format!(" and {} more", total - OUTSIDE_NAMED)
            } else {
                String::new()
            };
            tracing::warn!(
                policy_version = policy.version,
                peers_outside_view = total,
                "{total} peer(s) not in policy version {}'s view, not configured: {}{tail} (they are configured once a signed state's view names them)",
                policy.version,
                outside.join(", ")
            );
        }
        peers
    }

    /// Whether `kind` adds or updates a peer the current policy's view does not name. The
    /// control plane sends a peer event only to nodes its policy connects to the peer, so such
    /// an event means the view this node holds is older than the peer (a node that registered
    /// after this node's last state): the node pulls its state for the new view, which names
    /// the peer and its grants. Without a policy nothing is outside the view.
    pub(super) fn names_peer_outside_view(&self, kind: &EventKind) -> Option<Uuid> {
        let policy = self.policy.as_ref()?;
        let peer = match kind {
            EventKind::PeerAdded { peer } | EventKind::PeerUpdated { peer } => peer,
            _ => return None,
        };
        let known = policy.view.peers.iter().any(|v| v.id == peer.node_id);
        (!known).then_some(peer.node_id)
    }

    /// Asks the mesh thread to apply `set` under the current policy.
    pub(super) fn ask_apply(&mut self, set: Arc<Vec<PeerSpec>>, now: Now) {
        self.feed_names(&set);
        let version = self.policy.as_ref().map(|p| p.version);
        self.emit(super::Effect::Routes(crate::routes::RoutesOp::Peers(
            set.clone(),
        )));
        self.ask_mesh(
            MeshOp::Apply(set.clone(), self.policy.clone()),
            Pending::Apply(set, version),
            now,
        );
    }

    /// The mesh thread (re)installed the policy sent with an apply.
    pub(super) fn policy_installed(
        &mut self,
        version: Option<u64>,
        r: Result<(), MeshError>,
        now: Now,
    ) {
        let peers = self.policy.as_ref().map_or(0, |p| p.view.peers.len());
        self.policy_status = match r {
            Ok(()) => PolicyStatus {
                version,
                filter: if version.is_some() {
                    FilterState::Installed
                } else {
                    FilterState::None
                },
                why: None,
                peers,
                ..PolicyStatus::default()
            },
            Err(e) => {
                let why = e.to_string();
                tracing::error!(policy_version = ?version, "the policy filter is CLOSED: nothing passes to or from any peer until it can be installed: {why}");
                self.error_observation(format!("policy filter closed: {why}"), now);
                PolicyStatus {
                    version,
                    filter: FilterState::Closed,
                    why: Some(why),
                    peers,
                    ..PolicyStatus::default()
                }
            }
        };
    }

    /// What `plexd status` shows of the policy (the executor adds the data plane's drop
    /// counters and flow count).
    pub(super) fn policy_status(&self) -> PolicyStatus {
        self.policy_status.clone()
    }

    /// What `plexd policy` shows.
    pub(super) fn policy_report(&self) -> PolicyReport {
        PolicyReport {
            status: self.policy_status(),
            lines: self
                .policy
                .as_ref()
                .map(|p| p.view.describe())
                .unwrap_or_default(),
            view: self.policy.as_ref().map(|p| p.view.clone()),
        }
    }
}
