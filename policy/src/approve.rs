//! The control plane's question to `auto_approvers` (docs/policy.md "Auto-approvers"): is
//! this node's route, or its exit, approved without an operator?

use ipnet::IpNet;

use crate::inventory::{Inventory, NodeInfo};
use crate::model::Policy;
use crate::resolve::Resolver;
use crate::selector::Selector;

/// Whether `node`'s route `cidr` (`None`: its exit) is approved by `policy`'s
/// `auto_approvers`. `inv` is the Domain's inventory (for groups and Projects); the node need
/// not be in it.
pub fn auto_approves(
    policy: &Policy,
    inv: &Inventory,
    node: &NodeInfo,
    cidr: Option<IpNet>,
) -> bool {
    let a = &policy.auto_approvers;
    let sels: Vec<&Selector> = match cidr {
        None => a.exit.iter().collect(),
        Some(c) => a
            .routes
            .iter()
            .filter(|(p, _)| p.contains(&c))
            .flat_map(|(_, s)| s.iter())
            .collect(),
    };
    if sels.is_empty() {
        return false;
    }
    let mut one = inv.clone();
    let index = match one.nodes.iter().position(|n| n.id == node.id) {
        Some(i) => i,
        None => {
            one.nodes.push(node.clone());
            one.nodes.len() - 1
        }
    };
    let owned: Vec<Selector> = sels.into_iter().cloned().collect();
    let mut resolver = Resolver::new(policy, &one);
    resolver.nodes(&owned).contains(index)
}
