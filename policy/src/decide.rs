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

use std::fmt;
use std::time::Instant;

use crate::filter::{NodeFilter, PeerRef};
use crate::flow::{FlowKey, FlowTable};
use crate::packet::{self, Icmp, L4, Packet, PacketError};
use crate::ports::Proto;

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
        }
    }
}

fn no_rule(pkt: &Packet) -> Decision {
    let (proto, port) = pkt.proto_port();
    Decision::Drop(Drop::NoRule { proto, port })
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
        return Decision::Drop(Drop::NotForThisNode);
    }
    if !filter.peer_has(peer, &pkt.src) {
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
        return Decision::Drop(Drop::NotFromThisNode);
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
pub fn prune_flows(filter: &NodeFilter, flows: &mut FlowTable) {
    flows.retain(|k| {
        filter.is_own(&k.local)
            && filter.peer_by_addr(&k.remote).is_some_and(|p| {
                let port = if k.proto.has_ports() {
                    k.remote_port
                } else {
                    0
                };
                filter.outbound_allows(p, k.proto, port)
            })
    });
}
