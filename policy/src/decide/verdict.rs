//! What a decision is: accepted (and why) or dropped (and why), as people read it.

use std::fmt;

use crate::packet::{Packet, PacketError};
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

pub(super) fn no_rule(pkt: &Packet) -> Decision {
    let (proto, port) = pkt.proto_port();
    Decision::Drop(Drop::NoRule { proto, port })
}

pub(super) fn route_denied(pkt: &Packet) -> Decision {
    let (proto, port) = pkt.proto_port();
    Decision::Drop(Drop::RouteDenied { proto, port })
}
