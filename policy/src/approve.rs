//! The control plane's question to `auto_approvers` (docs/policy.md "Auto-approvers"): is
//! this node's route, or its exit, approved without an operator?
//!
//! [`NodeApprovals::of`] resolves the approvers' selectors once for one node (one resolver
//! over the inventory); each route of the node's report is then a walk over the approvers'
//! prefixes, not another resolution.

use ipnet::IpNet;

use crate::inventory::{Inventory, NodeInfo};
use crate::model::Policy;
use crate::resolve::Resolver;

/// What `auto_approvers` grants one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeApprovals {
    /// Whether the node's exit is approved.
    exit: bool,
    /// The `routes` prefixes whose approvers name the node: a route inside one is approved.
    routes: Vec<IpNet>,
}

impl NodeApprovals {
    /// What `policy`'s `auto_approvers` grant `node`. `inv` is the Domain's inventory (for
    /// groups and Projects); the node need not be in it (then a copy of the inventory with
    /// the node is resolved).
    pub fn of(policy: &Policy, inv: &Inventory, node: &NodeInfo) -> Self {
        let a = &policy.auto_approvers;
        if a.exit.is_empty() && a.routes.is_empty() {
            return Self::default();
        }
        let with_node;
        let (inv, index) = match inv.nodes.iter().position(|n| n.id == node.id) {
            Some(i) => (inv, i),
            None => {
                let mut copy = inv.clone();
                copy.nodes.push(node.clone());
                with_node = copy;
                (&with_node, with_node.nodes.len() - 1)
            }
        };
        let mut resolver = Resolver::new(policy, inv);
        let exit = !a.exit.is_empty() && resolver.nodes(&a.exit).contains(index);
        let routes = a
            .routes
            .iter()
            .filter(|(_, sels)| resolver.nodes(sels).contains(index))
            .map(|(prefix, _)| *prefix)
            .collect();
        Self { exit, routes }
    }

    /// Whether the node's route `cidr` (`None`: its exit) is approved.
    pub fn approves(&self, cidr: Option<IpNet>) -> bool {
        match cidr {
            None => self.exit,
            Some(c) => self.routes.iter().any(|p| p.contains(&c)),
        }
    }
}

/// Whether `node`'s route `cidr` (`None`: its exit) is approved by `policy`'s
/// `auto_approvers` ([`NodeApprovals`] for one question).
pub fn auto_approves(
    policy: &Policy,
    inv: &Inventory,
    node: &NodeInfo,
    cidr: Option<IpNet>,
) -> bool {
    NodeApprovals::of(policy, inv, node).approves(cidr)
}
