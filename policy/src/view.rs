//! One node's share of a compiled policy: its peer set and, per peer, what the peer may
//! open on it (inbound) and what it may open on the peer (outbound). Plain data the control
//! plane can put into the node's signed state; plexd turns it into a
//! [`crate::filter::NodeFilter`] for the packet path.

use std::collections::HashMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::compile::{Compiled, Grant, NO_GRANT};
use crate::ports::Access;

/// A peer of the node: the node talks to it over WireGuard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerView {
    pub id: Uuid,
    pub name: String,
    /// The peer's mesh addresses: the only sources its packets may carry.
    pub addrs: Vec<IpAddr>,
    /// Index into [`NodeView::grants`]: what the peer may open on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbound: Option<u32>,
    /// Index into [`NodeView::grants`]: what this node may open on the peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbound: Option<u32>,
    /// Client side: the subnet routes (and exit prefixes) this node may open through the peer,
    /// which is their primary router, each with what may be opened there. The prefixes are
    /// the route's CIDR cut to what the rules grant (docs/routes.md); the same prefixes are
    /// in the peer's allowed IPs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes_out: Vec<RouteGrant>,
    /// Router side: what the peer may open in the routes this node serves (packets from the
    /// peer to an address that is not this node's, forwarded out of the mesh).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes_in: Vec<RouteGrant>,
}

/// One prefix of a subnet route with the grant that applies to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteGrant {
    pub prefix: ipnet::IpNet,
    /// Index into [`NodeView::grants`].
    pub grant: u32,
}

/// A node's compiled view. Peers appear iff some rule connects them to the node in either
/// direction (WireGuard needs both ends for replies); the grants are deduplicated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    pub node: Uuid,
    /// This node's own mesh addresses (the destinations inbound packets must carry).
    pub addrs: Vec<IpAddr>,
    pub grants: Vec<Grant>,
    pub peers: Vec<PeerView>,
}

impl NodeView {
    /// The peer set's ids.
    pub fn peer_ids(&self) -> impl Iterator<Item = Uuid> + '_ {
        self.peers.iter().map(|p| p.id)
    }

    pub fn grant(&self, index: Option<u32>) -> Option<&Grant> {
        index.and_then(|i| self.grants.get(i as usize))
    }

    /// The filter as lines a person reads (what `plexd policy` shows), one per peer and
    /// direction: `from web (10.64.0.1): may open tcp 5432 (rule lines 2)`.
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        for p in &self.peers {
            let addrs: Vec<String> = p.addrs.iter().map(|a| a.to_string()).collect();
            let who = format!("{} ({})", p.name, addrs.join(", "));
            for (dir, g) in [("from", p.inbound), ("to", p.outbound)] {
                if let Some(g) = self.grant(g) {
                    let lines: Vec<String> = g.lines.iter().map(|l| l.to_string()).collect();
                    let verb = if dir == "from" {
                        "may open here"
                    } else {
                        "this node may open"
                    };
                    out.push(format!(
                        "{dir} {who}: {verb} {} (rule lines {})",
                        g.access,
                        lines.join(", ")
                    ));
                }
            }
        }
        if out.is_empty() {
            out.push("no peers: no rule connects this node to another".to_string());
        }
        out
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[derive(Default)]
struct Interner {
    grants: Vec<Grant>,
    index: HashMap<Grant, u32>,
}

impl Interner {
    fn add(&mut self, g: Grant) -> u32 {
        if let Some(&i) = self.index.get(&g) {
            return i;
        }
        let i = u32::try_from(self.grants.len()).unwrap_or(u32::MAX);
        self.grants.push(g.clone());
        self.index.insert(g, i);
        i
    }
}

impl Compiled {
    /// The view of node `id`, or `None` when the inventory has no such node.
    pub fn node_view(&self, id: Uuid) -> Option<NodeView> {
        let me = self.node_index(id)?;
        let (my_src, my_dst) = (self.src.class[me], self.dst.class[me]);
        let mut interner = Interner::default();
        let (s_count, d_count) = (self.src.sigs.len(), self.dst.sigs.len());
        let (inbound, outbound): (Vec<Option<u32>>, Vec<Option<u32>>) = match &self.table {
            // Tabulated: look the pairs up, interning each global grant once.
            Some(table) => {
                let mut local: HashMap<u32, u32> = HashMap::new();
                let mut pick = |global: u32| {
                    (global != NO_GRANT).then(|| {
                        *local.entry(global).or_insert_with(|| {
                            interner.add(self.table_grants[global as usize].clone())
                        })
                    })
                };
                let inb = (0..s_count)
                    .map(|sc| pick(table[sc * d_count + my_dst as usize]))
                    .collect();
                let out = (0..d_count)
                    .map(|dc| pick(table[my_src as usize * d_count + dc]))
                    .collect();
                (inb, out)
            }
            // Inbound depends only on the peer's source class, outbound on its destination
            // class.
            None => {
                let mut grant_of = |(acc, lines): (Access, Vec<u32>)| {
                    (!acc.is_empty()).then(|| interner.add(Grant { access: acc, lines }))
                };
                let inb = (0..s_count)
                    .map(|sc| grant_of(self.class_access(to_u32(sc), my_dst)))
                    .collect();
                let out = (0..d_count)
                    .map(|dc| grant_of(self.class_access(my_src, to_u32(dc))))
                    .collect();
                (inb, out)
            }
        };
        let mut peers: Vec<PeerView> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != me)
            .filter_map(|(i, node)| {
                let inb = inbound[self.src.class[i] as usize];
                let out = outbound[self.dst.class[i] as usize];
                (inb.is_some() || out.is_some()).then(|| PeerView {
                    routes_out: Vec::new(),
                    routes_in: Vec::new(),
                    id: node.id,
                    name: node.name.clone(),
                    addrs: node.addrs().collect(),
                    inbound: inb,
                    outbound: out,
                })
            })
            .collect();
        self.add_route_grants(id, &mut peers, &mut interner);
        Some(NodeView {
            node: id,
            addrs: self.nodes[me].addrs().collect(),
            grants: interner.grants,
            peers,
        })
    }
}

impl Compiled {
    /// Adds `me`'s route grants to its peers (a router becomes a peer of the nodes that may
    /// use its routes, and they of it): `routes_out` on each router `me` may use,
    /// `routes_in` on each node that may use a route `me` serves.
    fn add_route_grants(&self, me: Uuid, peers: &mut Vec<PeerView>, interner: &mut Interner) {
        for (index, route) in self.route_infos().iter().enumerate() {
            let uses = |client: Uuid| self.route_grants(index, client);
            if route.router == me {
                let clients = self.route_table.clients[index].clone();
                for client in clients {
                    let grants = uses(client);
                    if let Some(peer) = self.peer_entry(peers, client)
                        && !grants.is_empty()
                    {
                        for g in grants {
                            let grant = interner.add(Grant {
                                access: g.access,
                                lines: g.lines,
                            });
                            peer.routes_in.push(RouteGrant {
                                prefix: g.prefix,
                                grant,
                            });
                        }
                    }
                }
            } else {
                let grants = uses(me);
                if grants.is_empty() {
                    continue;
                }
                if let Some(peer) = self.peer_entry(peers, route.router) {
                    for g in grants {
                        let grant = interner.add(Grant {
                            access: g.access,
                            lines: g.lines,
                        });
                        peer.routes_out.push(RouteGrant {
                            prefix: g.prefix,
                            grant,
                        });
                    }
                }
            }
        }
    }

    /// The peer entry of node `id`, added (with no node-to-node grant) when missing; `None`
    /// for a node the compile does not know.
    fn peer_entry<'a>(&self, peers: &'a mut Vec<PeerView>, id: Uuid) -> Option<&'a mut PeerView> {
        if let Some(i) = peers.iter().position(|p| p.id == id) {
            return peers.get_mut(i);
        }
        let node = &self.nodes[self.node_index(id)?];
        peers.push(PeerView {
            id,
            name: node.name.clone(),
            addrs: node.addrs().collect(),
            inbound: None,
            outbound: None,
            routes_out: Vec::new(),
            routes_in: Vec::new(),
        });
        peers.last_mut()
    }
}
