//! A node's filter as the packet path uses it, built from its [`NodeView`]: per peer a
//! slot (found once by id or address), per slot two grant indexes, per grant a port
//! lookup that is one bit test. No rule is ever scanned per packet.
//!
//! Memory: a peer slot is about 100 bytes plus its addresses; a grant holds its two port
//! sets; each distinct port set other than "none" and "all" is one shared 8 KiB bitmap
//! (65,536 bits), at most [`MAX_PORT_SETS`] of them (32 MiB; a real policy has a handful).
//!
//! Routes (issue 27): a slot also holds the peer's route prefixes, both ways: `routes_out`
//! (this node is the client: the prefixes it may open through the peer, its router) and
//! `routes_in` (this node is the router: what the peer may open in the routes it serves),
//! each flattened into disjoint ranges with the grant of the longest prefix (`routes`), at
//! most [`MAX_ROUTE_PREFIXES_PER_PEER`] prefixes a peer and direction: a longer list refuses
//! the view (fail closed). A lookup is a binary search in one peer's ranges, never a scan of
//! the peers.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use uuid::Uuid;

use crate::limits::MAX_PORT_SETS;
use crate::ports::{PortSet, Proto};
use crate::view::{NodeView, RouteGrant};

mod routes;

use routes::RouteTable;
pub use routes::disjoint;

/// Route prefixes one peer may carry in one direction (`routes_out` or `routes_in` of its
/// [`crate::view::PeerView`]). A real router serves a handful of CIDRs; an exit's
/// `0.0.0.0/0` and `::/0` minus the mesh range, cut to what the rules grant, are a few dozen.
/// Past it the view is refused and the data plane stays closed.
pub const MAX_ROUTE_PREFIXES_PER_PEER: usize = 256;

/// 65,536 bits: one per port.
type Bitmap = [u64; 1024];

#[derive(Debug, Clone)]
enum Ports {
    None,
    All,
    Some(Arc<Bitmap>),
}

impl Ports {
    #[inline]
    fn contains(&self, port: u16) -> bool {
        match self {
            Ports::None => false,
            Ports::All => true,
            Ports::Some(bits) => bits[usize::from(port >> 6)] & (1 << (port & 63)) != 0,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct FastGrant {
    tcp: Ports,
    udp: Ports,
    icmp: bool,
    other: bool,
}

impl FastGrant {
    #[inline]
    pub(crate) fn allows(&self, proto: Proto, port: u16) -> bool {
        match proto {
            Proto::Tcp => self.tcp.contains(port),
            Proto::Udp => self.udp.contains(port),
            Proto::Icmp => self.icmp,
            Proto::Other(_) => self.other,
        }
    }
}

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Slot {
    id: Uuid,
    name: String,
    addrs: Vec<IpAddr>,
    inbound: u32,
    outbound: u32,
    /// Client side: what this node may open through the peer.
    routes_out: RouteTable,
    /// Router side: what the peer may open in the routes this node serves.
    routes_in: RouteTable,
}

/// A peer of the filter, found once with [`NodeFilter::peer`] (the data plane keeps it
/// next to the peer's tunnel); valid for the filter it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerRef(u32);

/// Why a view cannot become a filter (the data plane then keeps the peer closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error(
        "peer {peer} names grant {index}, but the view has {count} grants; the view is corrupt: fetch the node's state again"
    )]
    BadGrant {
        peer: Uuid,
        index: u32,
        count: usize,
    },
    #[error(
        "peer {0} appears twice in the view; the view is corrupt: fetch the node's state again"
    )]
    DuplicatePeer(Uuid),
    #[error(
        "peer {peer} carries {count} route prefixes {direction}, the limit is {MAX_ROUTE_PREFIXES_PER_PEER}: the view is refused (nothing passes); serve fewer or wider routes to this node"
    )]
    TooManyRoutePrefixes {
        peer: Uuid,
        direction: &'static str,
        count: usize,
    },
    #[error(
        "the view has {0} distinct port sets, the limit is {MAX_PORT_SETS}: simplify the policy's port lists"
    )]
    TooManyPortSets(usize),
}

/// The per-packet form of a [`NodeView`].
#[derive(Debug, Clone)]
pub struct NodeFilter {
    node: Uuid,
    own: Vec<IpAddr>,
    slots: Vec<Slot>,
    by_id: HashMap<Uuid, PeerRef>,
    by_addr: HashMap<IpAddr, PeerRef>,
    grants: Vec<FastGrant>,
    lines: Vec<Vec<u32>>,
}

fn bitmap(set: &PortSet) -> Arc<Bitmap> {
    let mut b: Box<Bitmap> = Box::new([0; 1024]);
    for r in set.ranges() {
        for p in r.first..=r.last {
            b[usize::from(p >> 6)] |= 1 << (p & 63);
        }
    }
    Arc::from(b)
}

impl NodeFilter {
    pub fn new(view: &NodeView) -> Result<NodeFilter, ViewError> {
        let mut sets: HashMap<&PortSet, Arc<Bitmap>> = HashMap::new();
        for g in &view.grants {
            for s in [&g.access.tcp, &g.access.udp] {
                if !s.is_empty() && !s.is_all() && !sets.contains_key(s) {
                    if sets.len() >= MAX_PORT_SETS {
                        return Err(ViewError::TooManyPortSets(sets.len() + 1));
                    }
                    sets.insert(s, bitmap(s));
                }
            }
        }
        let ports = |s: &PortSet| {
            if s.is_empty() {
                Ports::None
            } else if s.is_all() {
                Ports::All
            } else {
                Ports::Some(sets.get(s).cloned().unwrap_or_else(|| bitmap(s)))
            }
        };
        let grants: Vec<FastGrant> = view
            .grants
            .iter()
            .map(|g| FastGrant {
                tcp: ports(&g.access.tcp),
                udp: ports(&g.access.udp),
                icmp: g.access.icmp,
                other: g.access.other,
            })
            .collect();
        let count = grants.len();
        let check = |peer: Uuid, i: Option<u32>| match i {
            None => Ok(NONE),
            Some(i) if (i as usize) < count => Ok(i),
            Some(index) => Err(ViewError::BadGrant { peer, index, count }),
        };
        let mut filter = NodeFilter {
            node: view.node,
            own: view.addrs.clone(),
            slots: Vec::with_capacity(view.peers.len()),
            by_id: HashMap::with_capacity(view.peers.len()),
            by_addr: HashMap::with_capacity(view.peers.len()),
            grants,
            lines: view.grants.iter().map(|g| g.lines.clone()).collect(),
        };
        let table = |peer: Uuid, list: &[RouteGrant], direction: &'static str| {
            if list.len() > MAX_ROUTE_PREFIXES_PER_PEER {
                return Err(ViewError::TooManyRoutePrefixes {
                    peer,
                    direction,
                    count: list.len(),
                });
            }
            let mut prefixes = Vec::with_capacity(list.len());
            for r in list {
                prefixes.push((r.prefix, check(peer, Some(r.grant))?));
            }
            Ok(RouteTable::new(&prefixes))
        };
        for p in &view.peers {
            let r = PeerRef(u32::try_from(filter.slots.len()).unwrap_or(u32::MAX));
            if filter.by_id.insert(p.id, r).is_some() {
                return Err(ViewError::DuplicatePeer(p.id));
            }
            for a in &p.addrs {
                filter.by_addr.insert(*a, r);
            }
            filter.slots.push(Slot {
                id: p.id,
                name: p.name.clone(),
                addrs: p.addrs.clone(),
                inbound: check(p.id, p.inbound)?,
                outbound: check(p.id, p.outbound)?,
                routes_out: table(p.id, &p.routes_out, "out (routes_out)")?,
                routes_in: table(p.id, &p.routes_in, "in (routes_in)")?,
            });
        }
        Ok(filter)
    }

    /// A filter that lets nothing through (what a node enforces before it has a policy).
    pub fn closed(node: Uuid, own: Vec<IpAddr>) -> NodeFilter {
        NodeFilter {
            node,
            own,
            slots: Vec::new(),
            by_id: HashMap::new(),
            by_addr: HashMap::new(),
            grants: Vec::new(),
            lines: Vec::new(),
        }
    }

    pub fn node(&self) -> Uuid {
        self.node
    }

    pub fn peer(&self, id: &Uuid) -> Option<PeerRef> {
        self.by_id.get(id).copied()
    }

    pub fn peer_by_addr(&self, addr: &IpAddr) -> Option<PeerRef> {
        self.by_addr.get(addr).copied()
    }

    /// The peer set.
    pub fn peer_ids(&self) -> impl Iterator<Item = Uuid> + '_ {
        self.slots.iter().map(|s| s.id)
    }

    pub fn peer_name(&self, peer: PeerRef) -> &str {
        self.slots
            .get(peer.0 as usize)
            .map_or("?", |s| s.name.as_str())
    }

    #[inline]
    pub fn is_own(&self, addr: &IpAddr) -> bool {
        self.own.iter().any(|a| a == addr)
    }

    #[inline]
    pub fn peer_has(&self, peer: PeerRef, addr: &IpAddr) -> bool {
        self.slots
            .get(peer.0 as usize)
            .is_some_and(|s| s.addrs.iter().any(|a| a == addr))
    }

    #[inline]
    fn grant(&self, index: u32) -> Option<&FastGrant> {
        self.grants.get(index as usize)
    }

    /// Client side: the grant of the longest of `peer`'s `routes_out` prefixes holding
    /// `addr` (None: no route through the peer holds it). A binary search in the peer's
    /// ranges.
    #[inline]
    pub(crate) fn route_out(&self, peer: PeerRef, addr: &IpAddr) -> Option<&FastGrant> {
        let s = self.slots.get(peer.0 as usize)?;
        self.grant(s.routes_out.get(addr)?)
    }

    /// Router side: the grant of the longest of `peer`'s `routes_in` prefixes holding
    /// `addr` (None: this node serves the peer no route holding it).
    #[inline]
    pub(crate) fn route_in(&self, peer: PeerRef, addr: &IpAddr) -> Option<&FastGrant> {
        let s = self.slots.get(peer.0 as usize)?;
        self.grant(s.routes_in.get(addr)?)
    }

    /// May this node open `proto`/`port` on `addr` through `peer`, a route's router?
    /// None: `addr` is in none of the peer's `routes_out` prefixes.
    pub fn route_out_allows(
        &self,
        peer: PeerRef,
        addr: &IpAddr,
        proto: Proto,
        port: u16,
    ) -> Option<bool> {
        self.route_out(peer, addr).map(|g| g.allows(proto, port))
    }

    /// May `peer` open `proto`/`port` on `addr` in a route this node serves? None: `addr`
    /// is in none of the peer's `routes_in` prefixes.
    pub fn route_in_allows(
        &self,
        peer: PeerRef,
        addr: &IpAddr,
        proto: Proto,
        port: u16,
    ) -> Option<bool> {
        self.route_in(peer, addr).map(|g| g.allows(proto, port))
    }

    /// Whether `peer` has route prefixes in either direction.
    pub fn has_routes(&self, peer: PeerRef) -> bool {
        self.slots
            .get(peer.0 as usize)
            .is_some_and(|s| !s.routes_out.is_empty() || !s.routes_in.is_empty())
    }

    /// May `peer` open `proto`/`port` on this node? O(1): an index and a bit test.
    #[inline]
    pub fn inbound_allows(&self, peer: PeerRef, proto: Proto, port: u16) -> bool {
        self.slots
            .get(peer.0 as usize)
            .and_then(|s| self.grant(s.inbound))
            .is_some_and(|g| g.allows(proto, port))
    }

    /// May this node open `proto`/`port` on `peer`? O(1).
    #[inline]
    pub fn outbound_allows(&self, peer: PeerRef, proto: Proto, port: u16) -> bool {
        self.slots
            .get(peer.0 as usize)
            .and_then(|s| self.grant(s.outbound))
            .is_some_and(|g| g.allows(proto, port))
    }

    /// The rule lines behind what `peer` may open on this node (for `plexd policy`).
    pub fn inbound_lines(&self, peer: PeerRef) -> &[u32] {
        self.slots
            .get(peer.0 as usize)
            .and_then(|s| self.lines.get(s.inbound as usize))
            .map_or(&[], |l| l.as_slice())
    }
}
