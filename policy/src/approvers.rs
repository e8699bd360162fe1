//! `auto_approvers` (issue 27, docs/policy.md "Auto-approvers"): which nodes' routes and
//! exits the control plane approves without an operator.
//!
//! ```yaml
//! auto_approvers:
//!   routes: { "10.1.0.0/16": [tag:lan-router] }   # a route inside the prefix, from a node the selectors hold
//!   exit: [tag:exit]                               # an exit offered by a node the selectors hold
//! ```
//!
//! A route is approved when its CIDR lies inside one of the keys (equal counts) and the
//! advertising node is held by that key's selectors. A denial an operator made is never
//! overturned (the control plane asks only for pending rows). Selector names are checked
//! against the Domain like the rules' (`check`).

use ipnet::IpNet;
use serde_yaml::Value;

use crate::error::{Collector, ErrorKind, Location, PolicyError};
use crate::fields::selectors;
use crate::inventory::{Inventory, NodeInfo};
use crate::locate::Locator;
use crate::model::Policy;
use crate::resolve::Resolver;
use crate::selector::Selector;

/// The document's `auto_approvers`, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AutoApprovers {
    /// Per prefix: the nodes whose routes inside it are approved.
    pub routes: Vec<(IpNet, Vec<Selector>)>,
    /// The nodes whose exits are approved.
    pub exit: Vec<Selector>,
}

/// The raw YAML shape.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApprovers {
    #[serde(default)]
    routes: serde_yaml::Mapping,
    #[serde(default)]
    exit: Option<Value>,
}

/// Parses `auto_approvers`: every key a network prefix (`10.1.0.0/16`, not `10.1.0.7/16`),
/// every value selectors.
pub(crate) fn parse(raw: &RawApprovers, loc: &Locator, errs: &mut Collector) -> AutoApprovers {
    let line = loc.section_line("auto_approvers");
    let at = Location::new(line, 1);
    let until = loc.section_end("auto_approvers");
    let mut out = AutoApprovers::default();
    for (key, value) in &raw.routes {
        let text = match key {
            Value::String(s) => s.clone(),
            other => format!("{other:?}"),
        };
        let place = loc.find(&text, at, until);
        let what = format!("auto_approvers routes {text}");
        let prefix = match text.parse::<IpNet>() {
            Ok(p) if p.trunc() == p => p,
            Ok(p) => {
                errs.push(PolicyError::new(
                    ErrorKind::Invalid,
                    place,
                    format!("{what}: not a network address, write {}", p.trunc()),
                ));
                continue;
            }
            Err(_) => {
                errs.push(PolicyError::new(
                    ErrorKind::Invalid,
                    place,
                    format!("{what}: a key is a network prefix like 10.1.0.0/16"),
                ));
                continue;
            }
        };
        let sels = selectors(value, &what, place, until, loc, errs);
        out.routes.push((prefix, sels));
    }
    if let Some(v) = &raw.exit {
        out.exit = selectors(v, "auto_approvers exit", at, until, loc, errs);
    }
    out
}

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
