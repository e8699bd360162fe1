//! The decision the data plane asks for every packet: Accept or Drop, with the reason.
//!
//! Inbound (a packet decrypted from `peer`, about to reach the host) — the security
//! boundary, since the sender may be the attacker:
//!
//! | check | outcome |
//! |---|---|
//! | no such peer in the filter | Drop `UnknownPeer` |
//! | destination is not this node | Drop `NotForThisNode` |
//! | source is not one of the peer's mesh addresses | Drop `SpoofedSource` |
//! | the rules let the peer open this proto/port here | Accept `Rule` |
//! | a reply to a flow this node opened (flow table) | Accept `Reply` |
//! | an ICMP error about a flow this node opened or answered | Accept `IcmpError` |
//! | a later fragment (no ports; the first was checked) | Accept `LaterFragment` |
//! | anything else | Drop `NoRule` |
//!
//! Outbound (a packet from the host to `peer`): a reply to what the peer may open here
//! passes; a new flow passes only where the rules let this node open it on the peer, and
//! is recorded in the flow table so its replies pass the inbound check.
//!
//! Routed traffic (issue 27, subnet routes and exits; docs/policy.md "Routed traffic"): the
//! filter's slot of a peer also holds its `routes_out` (this node is the client, the peer its
//! router) and `routes_in` (this node is the router, the peer its client), prefixes with
//! grants, looked up longest prefix first in that one peer's ranges.
//!
//! | side, direction | packet | outcome |
//! |---|---|---|
//! | router, inbound from client X | destination not this node, in none of X's `routes_in` | Drop `NotForThisNode` |
//! | router, inbound from X | destination in X's `routes_in`, source not X's mesh address | Drop `SpoofedSource` |
//! | router, inbound from X | the prefix's grant allows proto/port: forwarded, the flow recorded | Accept `Rule` |
//! | router, inbound from X | an ICMP error about a reply of a recorded flow | Accept `IcmpError` |
//! | router, inbound from X | anything else | Drop `RouteDenied` |
//! | router, outbound to X | source in X's `routes_in`, destination X: a reply of a recorded flow (or an ICMP error about one) | Accept `Reply` / `IcmpError` |
//! | router, outbound to X | source in X's `routes_in`, no flow (a LAN host opening, an injected reply) | Drop `RouteDenied` |
//! | client, outbound to router R | destination in R's `routes_out`: the grant allows it, the flow recorded | Accept `Rule` |
//! | client, outbound to R | destination neither R's mesh address nor in R's `routes_out` | Drop `RouteDenied` |
//! | client, inbound from R | source in R's `routes_out`, destination this node: a reply of a recorded flow (or an ICMP error about one) | Accept `Reply` / `IcmpError` |
//! | client, inbound from R | source in R's `routes_out`, no flow | Drop `RouteDenied` |
//!
//! A later fragment passes wherever its addresses pass the checks above (its first
//! fragment was decided). Every other case is the direct one of the tables above.

use std::fmt;
use std::time::Instant;

use crate::filter::{NodeFilter, PeerRef};
use crate::flow::{FlowKey, FlowTable};
use crate::packet::{self, Icmp, L4, Packet, PacketError};
use crate::ports::Proto;

mod routes;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    Rule,
    Reply,
    IcmpError,
    LaterFragment,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    UnknownPeer,
    NotForThisNode,
    NotFromThisNode,
    SpoofedSource,
    /// No rule allows this protocol and port (0 for icmp and other protocols).
    NoRule {
        proto: Proto,
        port: u16,
    },
    Malformed(PacketError),
    /// Routed traffic no route grant allows: a new flow the grant of the route's prefix
    /// does not allow, or a packet from inside a route that is no reply of a recorded flow
    /// (0 for icmp and other protocols).
    RouteDenied {
        proto: Proto,
        port: u16,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Accept(Accept),
    Drop(Drop),
}

impl Decision {
    pub fn is_accept(&self) -> bool {
        matches!(self, Decision::Accept(_))
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Accept(Accept::Rule) => f.write_str("accepted: a rule allows it"),
            Decision::Accept(Accept::Reply) => {
                f.write_str("accepted: a reply to a flow this node opened")
            }
            Decision::Accept(Accept::IcmpError) => {
                f.write_str("accepted: an ICMP error about a flow of this node")
            }
            Decision::Accept(Accept::LaterFragment) => {
                f.write_str("accepted: a later fragment from a peer")
            }
            Decision::Drop(Drop::UnknownPeer) => {
                f.write_str("dropped: the peer is not in this node's filter")
            }
            Decision::Drop(Drop::NotForThisNode) => {
                f.write_str("dropped: the destination is not this node")
            }
            Decision::Drop(Drop::NotFromThisNode) => {
                f.write_str("dropped: the source is not this node")
            }
            Decision::Drop(Drop::SpoofedSource) => {
                f.write_str("dropped: the source address is not the peer's")
            }
            Decision::Drop(Drop::NoRule { proto, port }) => {
                if proto.has_ports() {
                    write!(f, "dropped: no rule allows {proto}/{port}")
                } else {
                    write!(f, "dropped: no rule allows {proto}")
                }
            }
            Decision::Drop(Drop::Malformed(e)) => write!(f, "dropped: {e}"),
            Decision::Drop(Drop::RouteDenied { proto, port }) => {
                if proto.has_ports() {
                    write!(
                        f,
                        "dropped: routed {proto}/{port} that no route grant allows and no flow answers"
                    )
                } else {
                    write!(
                        f,
                        "dropped: routed {proto} that no route grant allows and no flow answers"
                    )
                }
            }
        }
    }
}

fn no_rule(pkt: &Packet) -> Decision {
    let (proto, port) = pkt.proto_port();
    Decision::Drop(Drop::NoRule { proto, port })
}

fn route_denied(pkt: &Packet) -> Decision {
    let (proto, port) = pkt.proto_port();
    Decision::Drop(Drop::RouteDenied { proto, port })
}

/// The inbound decision for a parsed packet from `peer` (None: the tunnel's peer is not in
/// the filter).
pub fn inbound(
    filter: &NodeFilter,
    peer: Option<PeerRef>,
    pkt: &Packet,
    flows: &mut FlowTable,
    now: Instant,
) -> Decision {
    let Some(peer) = peer else {
        return Decision::Drop(Drop::UnknownPeer);
    };
    if !filter.is_own(&pkt.dst) {
        return routes::forward_in(filter, peer, pkt, flows, now);
    }
    if !filter.peer_has(peer, &pkt.src) {
        if filter.route_out(peer, &pkt.src).is_some() {
            return routes::reply_in(filter, peer, pkt, flows, now);
        }
        return Decision::Drop(Drop::SpoofedSource);
    }
    let reply = |proto, local_port, remote_port, flows: &mut FlowTable| {
        let key = FlowKey {
            proto,
            local: pkt.dst,
            local_port,
            remote: pkt.src,
            remote_port,
        };
        flows.reply(&key, now)
    };
    let ok = match pkt.l4 {
        L4::Tcp { sport, dport } | L4::Udp { sport, dport } => {
            let (proto, _) = pkt.proto_port();
            if filter.inbound_allows(peer, proto, dport) {
                return Decision::Accept(Accept::Rule);
            }
            reply(proto, dport, sport, flows)
        }
        L4::Icmp(Icmp::EchoReply { id }) => {
            if filter.inbound_allows(peer, Proto::Icmp, 0) {
                return Decision::Accept(Accept::Rule);
            }
            reply(Proto::Icmp, id, 0, flows)
        }
        L4::Icmp(Icmp::Error(Some(inner))) => {
            if filter.inbound_allows(peer, Proto::Icmp, 0) {
                return Decision::Accept(Accept::Rule);
            }
            let about_ours = filter.is_own(&inner.src) && filter.peer_has(peer, &inner.dst);
            // From the router itself, about a flow this node opened through it.
            if filter.is_own(&inner.src) && filter.route_out(peer, &inner.dst).is_some() {
                return routes::icmp_error_in(pkt, &inner, flows, now);
            }
            let key = FlowKey {
                proto: inner.proto,
                local: inner.src,
                local_port: inner.sport,
                remote: inner.dst,
                remote_port: inner.dport,
            };
            // About a flow this node opened, or about its reply to a flow the peer may open.
            if about_ours
                && (flows.reply(&key, now) || filter.inbound_allows(peer, inner.proto, inner.sport))
            {
                return Decision::Accept(Accept::IcmpError);
            }
            false
        }
        L4::Icmp(_) => filter.inbound_allows(peer, Proto::Icmp, 0),
        L4::Other(p) => {
            if filter.inbound_allows(peer, Proto::Other(p), 0) {
                return Decision::Accept(Accept::Rule);
            }
            reply(Proto::Other(p), 0, 0, flows)
        }
        L4::LaterFragment(_) => return Decision::Accept(Accept::LaterFragment),
    };
    match (ok, pkt.l4) {
        (true, L4::Icmp(Icmp::EchoReply { .. })) => Decision::Accept(Accept::Reply),
        (true, L4::Icmp(_)) => Decision::Accept(Accept::Rule),
        (true, _) => Decision::Accept(Accept::Reply),
        (false, _) => no_rule(pkt),
    }
}

/// [`inbound`] for raw bytes: a packet that does not parse is dropped.
pub fn inbound_bytes(
    filter: &NodeFilter,
    peer: Option<PeerRef>,
    bytes: &[u8],
    flows: &mut FlowTable,
    now: Instant,
) -> Decision {
    match packet::parse_packet(bytes) {
        Ok(p) => inbound(filter, peer, &p, flows, now),
        Err(e) => Decision::Drop(Drop::Malformed(e)),
    }
}

/// The outbound decision for a packet this node sends to `peer`; records new flows.
pub fn outbound(
    filter: &NodeFilter,
    peer: Option<PeerRef>,
    pkt: &Packet,
    flows: &mut FlowTable,
    now: Instant,
) -> Decision {
    let Some(peer) = peer else {
        return Decision::Drop(Drop::UnknownPeer);
    };
    if !filter.is_own(&pkt.src) {
        return routes::reply_out(filter, peer, pkt, flows, now);
    }
    if !filter.peer_has(peer, &pkt.dst) {
        return routes::open_out(filter, peer, pkt, flows, now);
    }
    let open = |proto, local_port, remote_port, flows: &mut FlowTable| {
        let key = FlowKey {
            proto,
            local: pkt.src,
            local_port,
            remote: pkt.dst,
            remote_port,
        };
        flows.opened(key, now);
        Decision::Accept(Accept::Rule)
    };
    match pkt.l4 {
        L4::Tcp { sport, dport } | L4::Udp { sport, dport } => {
            let (proto, _) = pkt.proto_port();
            if filter.inbound_allows(peer, proto, sport) {
                Decision::Accept(Accept::Reply)
            } else if filter.outbound_allows(peer, proto, dport) {
                open(proto, sport, dport, flows)
            } else {
                no_rule(pkt)
            }
        }
        L4::Icmp(Icmp::EchoRequest { id }) if filter.outbound_allows(peer, Proto::Icmp, 0) => {
            open(Proto::Icmp, id, 0, flows)
        }
        L4::Icmp(Icmp::EchoReply { .. }) if filter.inbound_allows(peer, Proto::Icmp, 0) => {
            Decision::Accept(Accept::Reply)
        }
        // An error about the peer's own traffic, which passed this node's inbound check.
        L4::Icmp(Icmp::Error(_)) => Decision::Accept(Accept::IcmpError),
        L4::Icmp(Icmp::Other { .. }) if filter.outbound_allows(peer, Proto::Icmp, 0) => {
            Decision::Accept(Accept::Rule)
        }
        L4::Other(p) if filter.outbound_allows(peer, Proto::Other(p), 0) => {
            open(Proto::Other(p), 0, 0, flows)
        }
        L4::LaterFragment(_) => Decision::Accept(Accept::LaterFragment),
        _ => no_rule(pkt),
    }
}

/// [`outbound`] for raw bytes.
pub fn outbound_bytes(
    filter: &NodeFilter,
    peer: Option<PeerRef>,
    bytes: &[u8],
    flows: &mut FlowTable,
    now: Instant,
) -> Decision {
    match packet::parse_packet(bytes) {
        Ok(p) => outbound(filter, peer, &p, flows, now),
        Err(e) => Decision::Drop(Drop::Malformed(e)),
    }
}

/// After a policy change: forgets the flows the new filter would not let this node open,
/// so a revoked peer's replies stop at once (the peer's own filter already drops this
/// node's packets). O(flows), once per change.
///
/// A table of one peer's flows that may hold route flows (this node a route's client)
/// needs [`prune_peer_flows`]: a route flow's remote address names no peer, so here it is
/// always forgotten. Flows a peer opened through this node (its router) are kept while
/// the peer's grant allows them.
pub fn prune_flows(filter: &NodeFilter, flows: &mut FlowTable) {
    flows.retain(|k| {
        filter
            .peer_by_addr(&k.remote)
            .is_some_and(|p| routes::keeps(filter, p, k))
    });
}

/// [`prune_flows`] for the flow table of one peer (`None`: the peer is not in the new
/// filter, every flow goes): keeps the flows with the peer the new filter still lets be
/// opened: this node's to the peer, this node's through the peer (a route's client), the
/// peer's through this node (its router).
pub fn prune_peer_flows(filter: &NodeFilter, peer: Option<PeerRef>, flows: &mut FlowTable) {
    match peer {
        Some(p) => flows.retain(|k| routes::keeps(filter, p, k)),
        None => flows.retain(|_| false),
    }
}
