//! A compile's answers about subnet routes and exits (`route_grants` builds the table):
//! which routes are in service and what a client may open through each.

use ipnet::IpNet;
use uuid::Uuid;

use crate::compile::Compiled;
use crate::inventory::RouteInfo;
use crate::ports::Access;
use crate::route_grants::{PrefixGrant, overlap};

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
