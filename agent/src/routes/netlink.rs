//! Kernel routes and policy rules over rtnetlink (the same requests `ip route` and `ip rule`
//! make). plexd's routes carry its own protocol number [`RTPROT_PLEXD`] (`ip route show proto
//! 112`), so a starting plexd finds and removes the ones a crashed run left; its rules have
//! its own priorities (`super::exit`).

use std::io;
use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleFlags, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::mesh::netlink::request;

/// The routing protocol number of plexd's routes (`/etc/iproute2/rt_protos` does not name it).
pub(crate) const RTPROT_PLEXD: u8 = 112;
/// The main routing table.
pub(crate) const TABLE_MAIN: u32 = 254;
/// EEXIST: already there.
const EEXIST: i32 = 17;
/// ESRCH/ENOENT: not there (a route or rule already gone).
const ESRCH: i32 = 3;
const ENOENT: i32 = 2;

/// One route of plexd's: a prefix on the mesh interface in a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KernelRoute {
    pub table: u32,
    pub prefix: IpNet,
}

fn family(v4: bool) -> AddressFamily {
    if v4 {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

fn route_message(r: KernelRoute, oif: u32) -> RouteMessage {
    let mut msg = RouteMessage::default();
    let v4 = matches!(r.prefix, IpNet::V4(_));
    msg.header.address_family = family(v4);
    msg.header.destination_prefix_length = r.prefix.prefix_len();
    msg.header.table = u8::try_from(r.table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
    msg.header.protocol = RouteProtocol::Other(RTPROT_PLEXD);
    msg.header.scope = RouteScope::Link;
    msg.header.kind = RouteType::Unicast;
    if r.prefix.prefix_len() > 0 {
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(
                r.prefix.network(),
            )));
    }
    msg.attributes.push(RouteAttribute::Table(r.table));
    msg.attributes.push(RouteAttribute::Oif(oif));
    msg
}

/// plexd's routes (its protocol number) on the link `oif`, in every table.
pub(crate) fn list_routes(oif: u32) -> io::Result<Vec<KernelRoute>> {
    let mut out = Vec::new();
    for v4 in [true, false] {
        let mut q = RouteMessage::default();
        q.header.address_family = family(v4);
        for m in request(RouteNetlinkMessage::GetRoute(q), NLM_F_REQUEST | NLM_F_DUMP)? {
            let RouteNetlinkMessage::NewRoute(r) = m else {
                continue;
            };
            if r.header.protocol != RouteProtocol::Other(RTPROT_PLEXD) {
                continue;
            }
            let mut table = u32::from(r.header.table);
            let (mut dst, mut on) = (None, false);
            for a in &r.attributes {
                match a {
                    RouteAttribute::Table(t) => table = *t,
                    RouteAttribute::Oif(i) => on = *i == oif,
                    RouteAttribute::Destination(RouteAddress::Inet(ip)) => {
                        dst = Some(IpAddr::V4(*ip));
                    }
                    RouteAttribute::Destination(RouteAddress::Inet6(ip)) => {
                        dst = Some(IpAddr::V6(*ip));
                    }
                    _ => {}
                }
            }
            let dst = dst.unwrap_or(if v4 {
                IpAddr::from([0u8; 4])
            } else {
                IpAddr::from([0u16; 8])
            });
            if on && let Ok(prefix) = IpNet::new(dst, r.header.destination_prefix_length) {
                out.push(KernelRoute { table, prefix });
            }
        }
    }
    Ok(out)
}

/// Adds `r` via the link `oif`; `Ok(false)` when a route to that prefix is already there
/// (another owner's: plexd leaves it alone).
pub(crate) fn add_route(r: KernelRoute, oif: u32) -> io::Result<bool> {
    match request(
        RouteNetlinkMessage::NewRoute(route_message(r, oif)),
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
    ) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(EEXIST) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletes plexd's route `r` (gone already counts as done).
pub(crate) fn del_route(r: KernelRoute, oif: u32) -> io::Result<()> {
    match request(
        RouteNetlinkMessage::DelRoute(route_message(r, oif)),
        NLM_F_REQUEST | NLM_F_ACK,
    ) {
        Err(e) if matches!(e.raw_os_error(), Some(ESRCH | ENOENT)) => Ok(()),
        other => other.map(drop),
    }
}

/// One policy rule of plexd's (the subset of `ip rule` it uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub v4: bool,
    pub priority: u32,
    pub table: u32,
    /// `to <prefix>`.
    pub to: Option<IpNet>,
    /// `not fwmark <mark>`.
    pub not_fwmark: Option<u32>,
    /// `suppress_prefixlength <n>`.
    pub suppress_prefixlength: Option<u32>,
}

fn rule_message(r: &Rule) -> RuleMessage {
    let mut msg = RuleMessage::default();
    msg.header.family = family(r.v4);
    msg.header.action = RuleAction::ToTable;
    msg.header.table = u8::try_from(r.table).unwrap_or(0);
    msg.attributes.push(RuleAttribute::Priority(r.priority));
    msg.attributes.push(RuleAttribute::Table(r.table));
    if let Some(to) = r.to {
        msg.header.dst_len = to.prefix_len();
        msg.attributes
            .push(RuleAttribute::Destination(to.network()));
    }
    if let Some(mark) = r.not_fwmark {
        msg.header.flags = RuleFlags::Invert;
        msg.attributes.push(RuleAttribute::FwMark(mark));
        msg.attributes.push(RuleAttribute::FwMask(u32::MAX));
    }
    if let Some(n) = r.suppress_prefixlength {
        msg.attributes.push(RuleAttribute::SuppressPrefixLen(n));
    }
    msg
}

/// Adds a rule (one already there counts as added).
pub(crate) fn add_rule(r: &Rule) -> io::Result<()> {
    match request(
        RouteNetlinkMessage::NewRule(rule_message(r)),
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
    ) {
        Err(e) if e.raw_os_error() == Some(EEXIST) => Ok(()),
        other => other.map(drop),
    }
}

/// The rules of both families whose priority `keep` accepts and whose table is `tables`'s,
/// as `(family is v4, priority, the kernel's message)` for [`del_rule_message`].
pub(crate) fn list_rules(
    keep: impl Fn(u32) -> bool,
    tables: &[u32],
) -> io::Result<Vec<(bool, u32, RuleMessage)>> {
    let mut out = Vec::new();
    for v4 in [true, false] {
        let mut q = RuleMessage::default();
        q.header.family = family(v4);
        for m in request(RouteNetlinkMessage::GetRule(q), NLM_F_REQUEST | NLM_F_DUMP)? {
            let RouteNetlinkMessage::NewRule(r) = m else {
                continue;
            };
            let mut prio = 0;
            let mut table = u32::from(r.header.table);
            for a in &r.attributes {
                match a {
                    RuleAttribute::Priority(p) => prio = *p,
                    RuleAttribute::Table(t) => table = *t,
                    _ => {}
                }
            }
            if keep(prio) && tables.contains(&table) {
                out.push((v4, prio, r));
            }
        }
    }
    Ok(out)
}

/// Deletes a rule as the kernel listed it (gone already counts as done).
pub(crate) fn del_rule_message(msg: RuleMessage) -> io::Result<()> {
    match request(RouteNetlinkMessage::DelRule(msg), NLM_F_REQUEST | NLM_F_ACK) {
        Err(e) if matches!(e.raw_os_error(), Some(ESRCH | ENOENT)) => Ok(()),
        other => other.map(drop),
    }
}
