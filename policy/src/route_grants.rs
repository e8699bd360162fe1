//! Subnet routes and exits in a compile (issue 27, docs/routes.md "Policy"): who may use
//! which route and what they may open in it.
//!
//! A node X may use a route (approved, in service) iff a rule's `src` holds X and its `dst`
//! prefixes overlap the route's CIDR (`*` holds every prefix). X may then open, in each
//! prefix of the overlap, what those rules grant; where two rules' overlaps nest, the inner
//! prefix gets both grants (WireGuard's allowed IPs, the kernel's routes and the router's
//! filter all take the longest prefix). An exit is used only by the nodes that name it
//! (`use_exit`), and its prefixes are `0.0.0.0/0` and `::/0` without the mesh ranges.
//!
//! Cost: the compile finds each route's possible users once (O(routes x prefix rules x
//! their sources)); a node's grants cost O(prefix rules) per route it uses.

use std::collections::HashSet;

use ipnet::IpNet;
use uuid::Uuid;

use crate::compile::{Compiled, RouteRule};
use crate::inventory::{RouteInfo, RouteInventory};
use crate::limits::MAX_ROUTES;
use crate::ports::Access;
use crate::resolve::subtract;

/// The routes of a compile, with what each may carry and who may use it.
#[derive(Debug, Clone, Default)]
pub(crate) struct RouteTable {
    pub routes: Vec<RouteInfo>,
    /// Per route: the prefixes it carries (the CIDR; for an exit both default routes
    /// without the mesh ranges).
    pub base: Vec<Vec<IpNet>>,
    /// Per route: the nodes some rule lets use it, sorted (never the router itself).
    pub clients: Vec<Vec<Uuid>>,
}

/// The overlap of two prefixes: the longer one when one holds the other.
pub fn overlap(a: IpNet, b: IpNet) -> Option<IpNet> {
    if a.contains(&b) {
        Some(b)
    } else if b.contains(&a) {
        Some(a)
    } else {
        None
    }
}

/// What a route carries: its CIDR, or for an exit `0.0.0.0/0` and `::/0` without `mesh`.
pub fn carried(route: &RouteInfo, mesh: &[IpNet]) -> Vec<IpNet> {
    if !route.exit {
        return vec![route.cidr];
    }
    let mut out = Vec::new();
    for all in ["0.0.0.0/0", "::/0"] {
        let Ok(all) = all.parse::<IpNet>() else {
            continue;
        };
        let mut set = vec![all];
        for m in mesh {
            set = set.into_iter().flat_map(|p| subtract(p, *m)).collect();
        }
        out.extend(set);
    }
    out
}

fn rule_overlaps(rule: &RouteRule, base: &[IpNet]) -> bool {
    rule.dst_prefixes
        .iter()
        .any(|d| base.iter().any(|b| overlap(*b, *d).is_some()))
}

impl RouteTable {
    pub fn build(inv: &RouteInventory, rules: &[RouteRule]) -> RouteTable {
        let routes: Vec<RouteInfo> = inv.routes.iter().take(MAX_ROUTES).cloned().collect();
        let base: Vec<Vec<IpNet>> = routes.iter().map(|r| carried(r, &inv.mesh)).collect();
        let clients = routes
            .iter()
            .zip(&base)
            .map(|(r, b)| {
                let mut set: HashSet<Uuid> = HashSet::new();
                for rule in rules.iter().filter(|rule| rule_overlaps(rule, b)) {
                    set.extend(rule.src_nodes.iter().copied());
                }
                set.remove(&r.router);
                if r.exit {
                    set.retain(|c| r.users.binary_search(c).is_ok());
                }
                let mut v: Vec<Uuid> = set.into_iter().collect();
                v.sort_unstable();
                v
            })
            .collect();
        RouteTable {
            routes,
            base,
            clients,
        }
    }

    /// Whether `a` routes for `b` or `b` for `a` (they are then WireGuard peers).
    pub fn links(&self, a: Uuid, b: Uuid) -> bool {
        self.routes.iter().zip(&self.clients).any(|(r, c)| {
            (r.router == a && c.binary_search(&b).is_ok())
                || (r.router == b && c.binary_search(&a).is_ok())
        })
    }
}

/// One prefix a node may open through a router, with what and the rule lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixGrant {
    pub prefix: IpNet,
    pub access: Access,
    pub lines: Vec<u32>,
}

impl Compiled {
    /// The routes this compile knows (in service), in the order given.
    pub fn route_infos(&self) -> &[RouteInfo] {
        &self.route_table.routes
    }

    /// What `client` may open through route `index` (of [`Compiled::route_infos`]), one
    /// entry per prefix, sorted; empty when it may not use the route.
    pub fn route_grants(&self, index: usize, client: Uuid) -> Vec<PrefixGrant> {
        let t = &self.route_table;
        let Some(clients) = t.clients.get(index) else {
            return Vec::new();
        };
        if clients.binary_search(&client).is_err() {
            return Vec::new();
        }
        let base = &t.base[index];
        let mut entries: Vec<(IpNet, &Access, u32)> = Vec::new();
        for rule in self.routes() {
            if rule.src_nodes.binary_search(&client).is_err() {
                continue;
            }
            for d in &rule.dst_prefixes {
                for b in base {
                    if let Some(p) = overlap(*b, *d) {
                        entries.push((p, &rule.access, rule.line));
                    }
                }
            }
        }
        let mut prefixes: Vec<IpNet> = entries.iter().map(|e| e.0).collect();
        prefixes.sort_unstable();
        prefixes.dedup();
        prefixes
            .into_iter()
            .map(|p| {
                let mut access = Access::default();
                let mut lines = Vec::new();
                for (q, a, line) in &entries {
                    if q.contains(&p) {
                        access.add_access(a);
                        lines.push(*line);
                    }
                }
                lines.sort_unstable();
                lines.dedup();
                PrefixGrant {
                    prefix: p,
                    access,
                    lines,
                }
            })
            .filter(|g| !g.access.is_empty())
            .collect()
    }
}
