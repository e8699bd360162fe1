//! The Domain's access policy as the node API applies it, pure (no store, no clock): the
//! inventory the compiler sees (built from the live node rows a state build reads anyway),
//! whether an inventory is still the one a compile used (the cache key, compared field by
//! field: exact, no hash to collide), a node's view (fail closed for a node the compile does
//! not know), and which peer events a node may receive.
//!
//! `cache.rs` keeps one [`CompiledPolicy`] per Domain; `node::decisions::node_state`
//! puts the node's view and only its peers into its signed state; the event streams
//! (`api/sse.rs`) drop the peer events of nodes the policy does not connect to the stream's
//! node (docs/policy.md "How a change reaches the nodes").

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use plexsphere_policy::{
    Compiled, Inventory, NodeInfo, NodeView, Policy, ProjectInfo, RouteInventory,
};
use plexsphere_wire::node::EventKind;
use uuid::Uuid;

use crate::store::nodes::NodeRow;
use crate::store::projects::Project;

/// The policy version a Domain runs before any document was stored: the default (allow-all)
/// document.
pub(crate) const DEFAULT_POLICY_VERSION: u64 = 0;

/// The tags of a node as the compiler names them (without `tag:`).
pub(crate) fn node_tags(n: &NodeRow) -> &[String] {
    &n.tags
}

/// One node as the compiler sees it.
fn node_info(n: &NodeRow, projects: &[ProjectInfo]) -> NodeInfo {
    let slug = projects
        .iter()
        .find(|p| p.id == n.project_id)
        .map_or_else(|| n.project_id.to_string(), |p| p.slug.clone());
    let (ipv4, ipv6) = match n.mesh_ip {
        IpAddr::V4(a) => (Some(a), None),
        IpAddr::V6(a) => (None, Some(a)),
    };
    NodeInfo {
        id: n.id,
        name: n.hostname.clone(),
        project_id: n.project_id,
        project_slug: slug,
        tags: node_tags(n).to_vec(),
        ipv4,
        ipv6,
    }
}

/// The inventory of a Domain: its Projects and its live (not revoked) nodes, in `live`'s order.
pub fn inventory(live: &[NodeRow], projects: &[Project]) -> Inventory {
    let projects: Vec<ProjectInfo> = projects
        .iter()
        .map(|p| ProjectInfo {
            id: p.id,
            slug: p.slug.clone(),
        })
        .collect();
    let nodes = live
        .iter()
        .filter(|n| n.revoked_at.is_none())
        .map(|n| node_info(n, &projects))
        .collect();
    Inventory {
        projects,
        nodes,
        tags: Vec::new(),
    }
}

/// A policy compiled over one inventory: what the cache keeps per Domain.
#[derive(Debug)]
pub struct CompiledPolicy {
    /// The policy version (`NodeState.policy.version`).
    pub version: u64,
    pub compiled: Compiled,
    projects: Vec<ProjectInfo>,
    /// The routes in service the compile used (part of the cache key).
    pub routes: RouteInventory,
    /// The newest event seq whose change this inventory is known to include (the head read
    /// before the node rows): a subject it does not know with a seq up to here is not live.
    as_of: AtomicU64,
}

impl CompiledPolicy {
    /// Compiles `policy` (version `version`) over `inv`, read at event seq `as_of`.
    pub fn new(version: u64, policy: &Policy, inv: &Inventory, as_of: u64) -> Self {
        Self::with_routes(version, policy, inv, &RouteInventory::default(), as_of)
    }

    /// [`CompiledPolicy::new`] for a Domain whose routes in service are `routes` (issue 27).
    pub(crate) fn with_routes(
        version: u64,
        policy: &Policy,
        inv: &Inventory,
        routes: &RouteInventory,
        as_of: u64,
    ) -> Self {
        Self {
            version,
            compiled: Compiled::with_routes(policy, inv, routes),
            projects: inv.projects.clone(),
            routes: routes.clone(),
            as_of: AtomicU64::new(as_of),
        }
    }

    /// Whether this is the compile of policy `version` over the inventory `live` and
    /// `projects` make: the cache key (node ids, names, Projects, tags and mesh IPs, compared
    /// exactly; endpoints, keys and reports are not part of it).
    pub fn is_for(&self, version: u64, live: &[NodeRow], projects: &[Project]) -> bool {
        if version != self.version || projects.len() != self.projects.len() {
            return false;
        }
        let same_projects = projects
            .iter()
            .zip(&self.projects)
            .all(|(p, q)| p.id == q.id && p.slug == q.slug);
        if !same_projects {
            return false;
        }
        let mut known = self.compiled.nodes().iter();
        for n in live.iter().filter(|n| n.revoked_at.is_none()) {
            let Some(k) = known.next() else {
                return false;
            };
            let ip = match n.mesh_ip {
                IpAddr::V4(a) => k.ipv4 == Some(a) && k.ipv6.is_none(),
                IpAddr::V6(a) => k.ipv6 == Some(a) && k.ipv4.is_none(),
            };
            if k.id != n.id
                || k.name != n.hostname
                || k.project_id != n.project_id
                || k.tags != node_tags(n)
                || !ip
            {
                return false;
            }
        }
        known.next().is_none()
    }

    /// See [`CompiledPolicy::new`]'s `as_of`.
    pub(crate) fn as_of(&self) -> u64 {
        self.as_of.load(Ordering::Relaxed)
    }

    /// The same inventory was read again at `seq`: it includes every change through it.
    pub(crate) fn seen_at(&self, seq: u64) {
        self.as_of.fetch_max(seq, Ordering::Relaxed);
    }

    pub fn knows(&self, node: Uuid) -> bool {
        self.compiled.node_index(node).is_some()
    }

    /// Whether some rule connects `a` and `b` (either way); `None` when the compile does not
    /// know one of them.
    pub(crate) fn connects(&self, a: Uuid, b: Uuid) -> Option<bool> {
        let (i, j) = (self.compiled.node_index(a)?, self.compiled.node_index(b)?);
        Some(self.compiled.connected(i, j))
    }

    /// `me`'s view; a node the compile does not know gets a view with no peer (fail closed:
    /// it learns of nobody and its filter lets nothing in).
    pub fn view(&self, me: &NodeRow) -> NodeView {
        self.compiled.node_view(me.id).unwrap_or_else(|| NodeView {
            node: me.id,
            addrs: vec![me.mesh_ip],
            grants: Vec::new(),
            peers: Vec::new(),
        })
    }
}

/// The node a peer event is about (whose key or endpoints it carries); `None` for every other
/// event (`node_revoked`, `resync`), which the policy does not filter.
pub(crate) fn peer_subject(kind: &EventKind) -> Option<Uuid> {
    match kind {
        EventKind::PeerAdded { peer } | EventKind::PeerUpdated { peer } => Some(peer.node_id),
        EventKind::PeerRemoved { peer_node_id, .. }
        | EventKind::EndpointChanged { peer_node_id, .. } => Some(*peer_node_id),
        EventKind::NodeRevoked | EventKind::Resync { .. } => None,
    }
}

/// Whether a node's stream sends an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Send,
    /// The policy does not connect the node to the event's subject.
    Hide,
    /// This compile does not know the node or the subject: ask a newer one.
    Unknown,
}

/// Whether `me`'s stream sends `kind` under `policy`.
pub(crate) fn verdict(policy: &CompiledPolicy, me: Uuid, kind: &EventKind) -> Verdict {
    let Some(subject) = peer_subject(kind) else {
        return Verdict::Send;
    };
    match policy.connects(me, subject) {
        Some(true) => Verdict::Send,
        Some(false) => Verdict::Hide,
        None => Verdict::Unknown,
    }
}

/// What a stream does with a peer event no compile (the stream's, the Domain's current and
/// previous one, one read from the store after the event) knows both ends of. The subject is
/// then not live any more (it was removed after the event) or `me` is not. A `peer_removed`
/// is sent: a node that had the peer must drop it (revocation must not wait for its next
/// state pull), and it carries only the key of a node that no longer exists, no endpoint.
/// Anything else is hidden: a node that is gone is nobody's peer.
pub(crate) fn unknown_verdict(kind: &EventKind) -> Verdict {
    match kind {
        EventKind::PeerRemoved { .. } => Verdict::Send,
        _ => Verdict::Hide,
    }
}
