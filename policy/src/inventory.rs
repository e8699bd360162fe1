//! What the compiler needs to know about a Domain: its Projects, its nodes (id, name,
//! Project, tags, mesh addresses) and the tags it knows of (on nodes or on bootstrap
//! tokens). The control plane builds it from its store; tests build it by hand.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectInfo {
    pub id: Uuid,
    pub slug: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: Uuid,
    pub name: String,
    pub project_id: Uuid,
    pub project_slug: String,
    /// Tag names without the `tag:` prefix.
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub ipv4: Option<Ipv4Addr>,
    #[serde(default)]
    pub ipv6: Option<Ipv6Addr>,
}

impl NodeInfo {
    /// The node's mesh addresses (IPv4 first).
    pub fn addrs(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ipv4
            .map(IpAddr::V4)
            .into_iter()
            .chain(self.ipv6.map(IpAddr::V6))
    }

    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| t == tag)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Inventory {
    pub projects: Vec<ProjectInfo>,
    pub nodes: Vec<NodeInfo>,
    /// Tags the Domain knows besides those on nodes (e.g. carried by bootstrap tokens).
    #[serde(default)]
    pub tags: Vec<String>,
}

impl Inventory {
    /// A node by id (in its text form) or by name (the first one of that name).
    pub fn find_node(&self, name_or_id: &str) -> Option<&NodeInfo> {
        if let Ok(id) = Uuid::parse_str(name_or_id) {
            return self.nodes.iter().find(|n| n.id == id);
        }
        self.nodes.iter().find(|n| n.name == name_or_id)
    }

    pub fn index_of(&self, id: Uuid) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// Whether the Domain knows `tag` (on a node or in [`Inventory::tags`]).
    pub fn knows_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| t == tag) || self.nodes.iter().any(|n| n.has_tag(tag))
    }
}

/// A subnet route or an exit in service (issue 27, docs/routes.md): its router (the primary
/// the control plane chose, for a route) and, for an exit, the nodes whose `use_exit` names
/// it. Only approved routes that carry traffic are listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteInfo {
    pub router: Uuid,
    /// The route's CIDR; for an exit `0.0.0.0/0` (it stands for `::/0` too).
    pub cidr: ipnet::IpNet,
    #[serde(default)]
    pub exit: bool,
    /// For an exit: the nodes that use it (sorted).
    #[serde(default)]
    pub users: Vec<Uuid>,
}

/// The routes of a Domain as the compiler sees them, beside the [`Inventory`]: the mesh
/// ranges (an exit's prefixes leave them out) and the routes in service, at most
/// [`crate::limits::MAX_ROUTES`] (more are ignored; the control plane refuses reports
/// beyond its own lower limit first).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RouteInventory {
    pub mesh: Vec<ipnet::IpNet>,
    pub routes: Vec<RouteInfo>,
}
