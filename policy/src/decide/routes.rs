//! The decisions on routed traffic (the table in the parent module's doc): a client's
//! flows through its router, a router's forwarding of a client's flows. Flows are kept in
//! the same table as the direct ones, keyed from this side's view of them:
//! - client: `local` = this node, `remote` = the host inside the route (replies come from
//!   it, through the router);
//! - router: `local` = the host inside the route, `remote` = the client's mesh address
//!   (replies go from it to the client, out of this node's data plane).
//!
//! The two never meet: a route prefix never holds a mesh address (the control plane's
//! `check_route`), so a key's `local` is this node's address in the first and not in the
//! second.

use std::time::Instant;

use super::{Accept, Decision, Drop, route_denied};
use crate::filter::{NodeFilter, PeerRef};
use crate::flow::{FlowKey, FlowTable};
use crate::packet::{Icmp, Inner, L4, Packet};
use crate::ports::Proto;

/// The port a flow is checked against: the destination port the opener used (0 for
/// protocols without ports; an ICMP echo's id is no port).
fn rule_port(proto: Proto, port: u16) -> u16 {
    if proto.has_ports() { port } else { 0 }
}

/// The key of the flow an ICMP error quotes, as the side that recorded it keyed it: the
/// quoted packet went from `opener` to `target` (ports, or the echo id as `sport`).
fn quoted(inner: &Inner, local_is_opener: bool) -> FlowKey {
    if local_is_opener || inner.proto == Proto::Icmp {
        // An echo flow is keyed by its id on the local side whichever side opened it.
        let (local, remote) = if local_is_opener {
            (inner.src, inner.dst)
        } else {
            (inner.dst, inner.src)
        };
        return FlowKey {
            proto: inner.proto,
            local,
            local_port: inner.sport,
            remote,
            remote_port: if inner.proto == Proto::Icmp {
                0
            } else {
                inner.dport
            },
        };
    }
    FlowKey {
        proto: inner.proto,
        local: inner.dst,
        local_port: inner.dport,
        remote: inner.src,
        remote_port: inner.sport,
    }
}

/// Router: a packet from client `peer` to an address that is not this node's.
pub(super) fn forward_in(
    filter: &NodeFilter,
    peer: PeerRef,
    pkt: &Packet,
    flows: &mut FlowTable,
    now: Instant,
) -> Decision {
    let Some(grant) = filter.route_in(peer, &pkt.dst) else {
        return Decision::Drop(Drop::NotForThisNode);
    };
    if !filter.peer_has(peer, &pkt.src) {
        return Decision::Drop(Drop::SpoofedSource);
    }
    let mut open = |proto, local_port, remote_port| {
        flows.opened(
            FlowKey {
                proto,
                local: pkt.dst,
                local_port,
                remote: pkt.src,
                remote_port,
            },
            now,
        );
        Decision::Accept(Accept::Rule)
    };
    match pkt.l4 {
        L4::Tcp { sport, dport } | L4::Udp { sport, dport } => {
            let (proto, _) = pkt.proto_port();
            if grant.allows(proto, dport) {
                return open(proto, dport, sport);
            }
        }
        L4::Icmp(Icmp::EchoRequest { id }) if grant.allows(Proto::Icmp, 0) => {
            return open(Proto::Icmp, id, 0);
        }
        L4::Icmp(Icmp::Error(Some(inner))) => {
            if grant.allows(Proto::Icmp, 0) {
                return Decision::Accept(Accept::Rule);
            }
            // The client's error about a reply the host sent it in a recorded flow.
            if inner.src == pkt.dst
                && filter.peer_has(peer, &inner.dst)
                && flows.reply(&quoted(&inner, true), now)
            {
                return Decision::Accept(Accept::IcmpError);
            }
        }
        L4::Icmp(_) if grant.allows(Proto::Icmp, 0) => return Decision::Accept(Accept::Rule),
        L4::Other(p) if grant.allows(Proto::Other(p), 0) => return open(Proto::Other(p), 0, 0),
        L4::LaterFragment(_) => return Decision::Accept(Accept::LaterFragment),
        _ => {}
    }
    route_denied(pkt)
}

/// Router: a packet to client `peer` whose source is not this node: only a reply of a flow
/// the client opened through this node (or an ICMP error about one) passes.
pub(super) fn reply_out(
    filter: &NodeFilter,
    peer: PeerRef,
    pkt: &Packet,
    flows: &mut FlowTable,
    now: Instant,
) -> Decision {
    if !filter.peer_has(peer, &pkt.dst) || filter.route_in(peer, &pkt.src).is_none() {
        return Decision::Drop(Drop::NotFromThisNode);
    }
    let key = |proto, local_port, remote_port| FlowKey {
        proto,
        local: pkt.src,
        local_port,
        remote: pkt.dst,
        remote_port,
    };
    let ok = match pkt.l4 {
        L4::Tcp { sport, dport } | L4::Udp { sport, dport } => {
            let (proto, _) = pkt.proto_port();
            flows.reply(&key(proto, sport, dport), now)
        }
        L4::Icmp(Icmp::EchoReply { id }) => flows.reply(&key(Proto::Icmp, id, 0), now),
        L4::Icmp(Icmp::Error(Some(inner))) => {
            if inner.src == pkt.dst
                && filter.route_in(peer, &inner.dst).is_some()
                && flows.reply(&quoted(&inner, false), now)
            {
                return Decision::Accept(Accept::IcmpError);
            }
            false
        }
        L4::Other(p) => flows.reply(&key(Proto::Other(p), 0, 0), now),
        L4::LaterFragment(_) => return Decision::Accept(Accept::LaterFragment),
        L4::Icmp(_) => false,
    };
    if ok {
        Decision::Accept(Accept::Reply)
    } else {
        route_denied(pkt)
    }
}

/// Client: a packet from this node to an address of the router `peer` that is not its
/// mesh address: a new flow passes where the grant of the route's prefix allows it.
pub(super) fn open_out(
    filter: &NodeFilter,
    peer: PeerRef,
    pkt: &Packet,
    flows: &mut FlowTable,
    now: Instant,
) -> Decision {
    let Some(grant) = filter.route_out(peer, &pkt.dst) else {
        return route_denied(pkt);
    };
    let mut open = |proto, local_port, remote_port| {
        flows.opened(
            FlowKey {
                proto,
                local: pkt.src,
                local_port,
                remote: pkt.dst,
                remote_port,
            },
            now,
        );
        Decision::Accept(Accept::Rule)
    };
    match pkt.l4 {
        L4::Tcp { sport, dport } | L4::Udp { sport, dport } => {
            let (proto, _) = pkt.proto_port();
            if grant.allows(proto, dport) {
                return open(proto, sport, dport);
            }
        }
        L4::Icmp(Icmp::EchoRequest { id }) if grant.allows(Proto::Icmp, 0) => {
            return open(Proto::Icmp, id, 0);
        }
        // This node's error about a packet that came in from the route (it passed the
        // inbound check as a reply).
        L4::Icmp(Icmp::Error(_)) => return Decision::Accept(Accept::IcmpError),
        L4::Icmp(_) if grant.allows(Proto::Icmp, 0) => return Decision::Accept(Accept::Rule),
        L4::Other(p) if grant.allows(Proto::Other(p), 0) => return open(Proto::Other(p), 0, 0),
        L4::LaterFragment(_) => return Decision::Accept(Accept::LaterFragment),
        _ => {}
    }
    route_denied(pkt)
}

/// Client: a packet from router `peer` whose source is inside one of its `routes_out`
/// prefixes, to this node: only a reply of a flow this node opened through it.
pub(super) fn reply_in(
    filter: &NodeFilter,
    peer: PeerRef,
    pkt: &Packet,
    flows: &mut FlowTable,
    now: Instant,
) -> Decision {
    let key = |proto, local_port, remote_port| FlowKey {
        proto,
        local: pkt.dst,
        local_port,
        remote: pkt.src,
        remote_port,
    };
    let ok = match pkt.l4 {
        L4::Tcp { sport, dport } | L4::Udp { sport, dport } => {
            let (proto, _) = pkt.proto_port();
            flows.reply(&key(proto, dport, sport), now)
        }
        L4::Icmp(Icmp::EchoReply { id }) => flows.reply(&key(Proto::Icmp, id, 0), now),
        L4::Icmp(Icmp::Error(Some(inner)))
            if filter.is_own(&inner.src) && filter.route_out(peer, &inner.dst).is_some() =>
        {
            return icmp_error_in(pkt, &inner, flows, now);
        }
        L4::Other(p) => flows.reply(&key(Proto::Other(p), 0, 0), now),
        L4::LaterFragment(_) => return Decision::Accept(Accept::LaterFragment),
        L4::Icmp(_) => false,
    };
    if ok {
        Decision::Accept(Accept::Reply)
    } else {
        route_denied(pkt)
    }
}

/// Client: an ICMP error (from the router or from inside the route) quoting a packet this
/// node sent into the route: passes when that flow is recorded.
pub(super) fn icmp_error_in(
    pkt: &Packet,
    inner: &Inner,
    flows: &mut FlowTable,
    now: Instant,
) -> Decision {
    if flows.reply(&quoted(inner, true), now) {
        Decision::Accept(Accept::IcmpError)
    } else {
        route_denied(pkt)
    }
}

/// Whether the new filter keeps flow `k` of peer `p`'s table: this node's flow to the peer,
/// this node's through the peer (client), the peer's through this node (router).
pub(super) fn keeps(filter: &NodeFilter, p: PeerRef, k: &FlowKey) -> bool {
    if filter.is_own(&k.local) {
        if filter.peer_has(p, &k.remote) {
            return filter.outbound_allows(p, k.proto, rule_port(k.proto, k.remote_port));
        }
        return filter
            .route_out_allows(p, &k.remote, k.proto, rule_port(k.proto, k.remote_port))
            .unwrap_or(false);
    }
    filter.peer_has(p, &k.remote)
        && filter
            .route_in_allows(p, &k.local, k.proto, rule_port(k.proto, k.local_port))
            .unwrap_or(false)
}
