//! The compiler: (policy, inventory) -> [`Compiled`], pure.
//!
//! Each rule's `src` and `dst` become node sets (bitsets, set algebra for groups and
//! subtraction). Each node gets two signatures: the set of rules that have it as a source,
//! and the set that have it as a destination. Nodes with the same signature are one class:
//! the policy cannot tell them apart on that side. What a node of source class S may open
//! on a node of destination class D is the union of the rules in both signatures, so the
//! work is per pair of classes, not per pair of nodes (a fleet has few classes: its roles).
//!
//! Cost: O(rules x nodes / 64) to resolve, O(sum of set sizes) for the signatures; a node's
//! view ([`Compiled::node_view`], in `view`) then costs O((classes) x rules / 64 + nodes).

use std::collections::HashMap;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::bitset::BitSet;
use crate::inventory::{Inventory, NodeInfo, RouteInventory};
use crate::model::Policy;
use crate::ports::Access;
use crate::resolve::Resolver;

/// What one peer may open, with the lines of the rules that allow it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Grant {
    pub access: Access,
    pub lines: Vec<u32>,
}

/// What one rule grants, and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CompiledRule {
    pub access: Access,
    pub line: u32,
}

/// A rule whose destination names address prefixes (`*` or a CIDR): what decides who may use
/// a subnet route or an exit and what they may open in it (`route_grants`); node-to-node
/// traffic is covered by the classes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRule {
    /// Index of the rule in the document, and its line.
    pub rule: usize,
    pub line: u32,
    /// The nodes the rule's `src` selects, sorted by id.
    pub src_nodes: Vec<Uuid>,
    /// The address prefixes the rule's `src` names (traffic from routed subnets).
    pub src_prefixes: Vec<IpNet>,
    pub dst_prefixes: Vec<IpNet>,
    pub access: Access,
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// One side's partition of the nodes into classes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Side {
    /// Class of each node.
    pub class: Vec<u32>,
    /// The rules of each class (its signature).
    pub sigs: Vec<BitSet>,
    /// The nodes of each class.
    pub members: Vec<Vec<u32>>,
}

impl Side {
    fn build(node_count: usize, rule_sets: &[BitSet]) -> Side {
        let mut sigs_by_node = vec![BitSet::new(rule_sets.len()); node_count];
        for (r, set) in rule_sets.iter().enumerate() {
            for n in set.iter() {
                sigs_by_node[n].insert(r);
            }
        }
        let mut index: HashMap<BitSet, u32> = HashMap::new();
        let mut side = Side::default();
        for (n, sig) in sigs_by_node.into_iter().enumerate() {
            let next = u32::try_from(side.sigs.len()).unwrap_or(u32::MAX);
            let c = *index.entry(sig.clone()).or_insert_with(|| {
                side.sigs.push(sig);
                side.members.push(Vec::new());
                next
            });
            side.class.push(c);
            side.members[c as usize].push(u32::try_from(n).unwrap_or(u32::MAX));
        }
        side
    }
}

/// A policy compiled over one inventory.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub(crate) nodes: Vec<NodeInfo>,
    by_id: HashMap<Uuid, usize>,
    pub(crate) rules: Vec<CompiledRule>,
    pub(crate) src: Side,
    pub(crate) dst: Side,
    routes: Vec<RouteRule>,
    /// The grant of every (source class, destination class) pair, when there are at most
    /// [`CLASS_TABLE_MAX`] pairs: an index into `table_grants` (or `NO_GRANT`), row-major
    /// by source class. With it a node's view costs one step per class and per node.
    pub(crate) table: Option<Vec<u32>>,
    pub(crate) table_grants: Vec<Grant>,
    /// The subnet routes and exits in service, with who may use each (`route_grants`).
    pub(crate) route_table: crate::route_grants::RouteTable,
}

/// Class pairs up to which [`Compiled::new`] tabulates every pair's grant (a real fleet has
/// a few hundred; past this, views compute their pairs on demand).
pub const CLASS_TABLE_MAX: usize = 65_536;
pub(crate) const NO_GRANT: u32 = u32::MAX;

impl Compiled {
    /// The compile of a Domain without routes.
    pub fn new(policy: &Policy, inv: &Inventory) -> Compiled {
        Self::with_routes(policy, inv, &RouteInventory::default())
    }

    /// The compile of a Domain whose routes in service are `routes` (issue 27): views then
    /// carry `routes_out`/`routes_in`, and routers are peers of the nodes that may use them.
    pub fn with_routes(policy: &Policy, inv: &Inventory, routes: &RouteInventory) -> Compiled {
        let mut resolver = Resolver::new(policy, inv);
        let mut src_sets = Vec::with_capacity(policy.rules.len());
        let mut dst_sets = Vec::with_capacity(policy.rules.len());
        let mut prefix_rules = Vec::new();
        for (i, r) in policy.rules.iter().enumerate() {
            let s = resolver.nodes(&r.src);
            let dst_prefixes = resolver.prefixes(&r.dst);
            if !dst_prefixes.is_empty() {
                let mut src_nodes: Vec<Uuid> = s.iter().map(|n| inv.nodes[n].id).collect();
                src_nodes.sort_unstable();
                prefix_rules.push(RouteRule {
                    rule: i,
                    line: r.at.line,
                    src_nodes,
                    src_prefixes: resolver.prefixes(&r.src),
                    dst_prefixes,
                    access: r.access(),
                });
            }
            src_sets.push(s);
            dst_sets.push(resolver.nodes(&r.dst));
        }
        let n = inv.nodes.len();
        let mut c = Compiled {
            nodes: inv.nodes.clone(),
            by_id: inv
                .nodes
                .iter()
                .enumerate()
                .map(|(i, x)| (x.id, i))
                .collect(),
            rules: policy
                .rules
                .iter()
                .map(|r| CompiledRule {
                    access: r.access(),
                    line: r.at.line,
                })
                .collect(),
            src: Side::build(n, &src_sets),
            dst: Side::build(n, &dst_sets),
            route_table: crate::route_grants::RouteTable::build(routes, &prefix_rules),
            routes: prefix_rules,
            table: None,
            table_grants: Vec::new(),
        };
        c.tabulate();
        c
    }

    /// The same policy without the class table, so views compute their pairs on demand (what
    /// a fleet with more than [`CLASS_TABLE_MAX`] class pairs gets); for tests and benches.
    pub fn untabulated(mut self) -> Compiled {
        self.table = None;
        self.table_grants = Vec::new();
        self
    }

    fn tabulate(&mut self) {
        let (s, d) = (self.src.sigs.len(), self.dst.sigs.len());
        if s.saturating_mul(d) > CLASS_TABLE_MAX {
            return;
        }
        let mut index: HashMap<Grant, u32> = HashMap::new();
        let mut grants = Vec::new();
        let mut table = Vec::with_capacity(s * d);
        for sc in 0..s {
            for dc in 0..d {
                let (access, lines) = self.class_access(to_u32(sc), to_u32(dc));
                if access.is_empty() {
                    table.push(NO_GRANT);
                    continue;
                }
                let g = Grant { access, lines };
                let id = *index.entry(g.clone()).or_insert_with(|| {
                    grants.push(g);
                    to_u32(grants.len() - 1)
                });
                table.push(id);
            }
        }
        self.table = Some(table);
        self.table_grants = grants;
    }

    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    pub fn node_index(&self, id: Uuid) -> Option<usize> {
        self.by_id.get(&id).copied()
    }

    /// Rules with address-prefix destinations (what subnet routes and exits are granted by).
    pub fn routes(&self) -> &[RouteRule] {
        &self.routes
    }

    /// How many source and destination classes the inventory fell into.
    pub fn class_counts(&self) -> (usize, usize) {
        (self.src.sigs.len(), self.dst.sigs.len())
    }

    /// What a node of source class `sc` may open on a node of destination class `dc`, and
    /// the lines of the rules that grant it.
    pub(crate) fn class_access(&self, sc: u32, dc: u32) -> (Access, Vec<u32>) {
        let mut acc = Access::default();
        let mut lines = Vec::new();
        if let (Some(s), Some(d)) = (
            self.src.sigs.get(sc as usize),
            self.dst.sigs.get(dc as usize),
        ) {
            for r in s.common(d) {
                acc.add_access(&self.rules[r].access);
                lines.push(self.rules[r].line);
            }
        }
        (acc, lines)
    }

    /// What node `src` may open on node `dst` (indexes into [`Compiled::nodes`]).
    pub fn access(&self, src: usize, dst: usize) -> (Access, Vec<u32>) {
        match (self.src.class.get(src), self.dst.class.get(dst)) {
            (Some(&s), Some(&d)) => self.class_access(s, d),
            _ => (Access::default(), Vec::new()),
        }
    }

    /// Whether two nodes are WireGuard peers (some rule connects them either way, or one
    /// routes for the other).
    pub fn connected(&self, a: usize, b: usize) -> bool {
        let meets = |s: usize, d: usize| match (self.src.class.get(s), self.dst.class.get(d)) {
            (Some(&sc), Some(&dc)) => self.src.sigs[sc as usize].meets(&self.dst.sigs[dc as usize]),
            _ => false,
        };
        a != b
            && (meets(a, b)
                || meets(b, a)
                || match (self.nodes.get(a), self.nodes.get(b)) {
                    (Some(x), Some(y)) => self.route_table.links(x.id, y.id),
                    _ => false,
                })
    }
}
