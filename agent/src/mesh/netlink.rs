//! Interface setup over rtnetlink: find a link and its kind, set the mesh address, the MTU and
//! the link up, delete it. Netlink rather than `ip` from iproute2: no extra runtime
//! dependency, no process to spawn from a hardened unit, and errors arrive as errnos plexd can
//! name precisely. These calls block briefly; the backends make them off the event loop.

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST};
use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_request::netlink_request_rtnl;

/// ENODEV: no such device.
const ENODEV: i32 = 19;
/// EEXIST: already there.
const EEXIST: i32 = 17;

/// A link as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    /// `wireguard`, `tun`, ... (`None` for a link without a kind, like a physical NIC).
    pub kind: Option<String>,
    pub mtu: Option<u32>,
    pub up: bool,
}

fn kind_name(k: &InfoKind) -> String {
    match k {
        InfoKind::Wireguard => "wireguard".to_owned(),
        InfoKind::Tun => "tun".to_owned(),
        InfoKind::Other(s) => s.clone(),
        other => format!("{other:?}").to_lowercase(),
    }
}

pub(crate) fn request(
    msg: RouteNetlinkMessage,
    flags: u16,
) -> io::Result<Vec<RouteNetlinkMessage>> {
    Ok(netlink_request_rtnl(msg, Some(flags))?
        .into_iter()
        .filter_map(|m: NetlinkMessage<RouteNetlinkMessage>| match m.payload {
            NetlinkPayload::InnerMessage(inner) => Some(inner),
            _ => None,
        })
        .collect())
}

/// The index of the link named `name`, or `None` when there is none. (An ioctl in the calling
/// thread's namespace; unlike [`link`] it parses no link attributes, whose newer kernels' IPv6
/// extensions make netlink-packet-route log warnings.)
pub fn index(name: &str) -> io::Result<Option<u32>> {
    match nix::net::if_::if_nametoindex(name) {
        Ok(i) => Ok(Some(i)),
        Err(nix::Error::ENODEV) => Ok(None),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// The link named `name`, or `None` when there is none.
pub fn link(name: &str) -> io::Result<Option<Link>> {
    if index(name)?.is_none() {
        return Ok(None);
    }
    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::IfName(name.to_owned()));
    let answer = match request(RouteNetlinkMessage::GetLink(msg), NLM_F_REQUEST | NLM_F_ACK) {
        Ok(a) => a,
        Err(e) if e.raw_os_error() == Some(ENODEV) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(answer.into_iter().find_map(|m| match m {
        RouteNetlinkMessage::NewLink(l) => Some(Link {
            index: l.header.index,
            kind: l.attributes.iter().find_map(|a| match a {
                LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|i| match i {
                    LinkInfo::Kind(k) => Some(kind_name(k)),
                    _ => None,
                }),
                _ => None,
            }),
            mtu: l.attributes.iter().find_map(|a| match a {
                LinkAttribute::Mtu(m) => Some(*m),
                _ => None,
            }),
            up: l.header.flags.contains(LinkFlags::Up),
        }),
        _ => None,
    }))
}

/// Sets the MTU and brings the link up.
pub fn set_mtu_up(index: u32, mtu: u32) -> io::Result<()> {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg.header.flags = LinkFlags::Up;
    msg.header.change_mask = LinkFlags::Up;
    msg.attributes.push(LinkAttribute::Mtu(mtu));
    request(RouteNetlinkMessage::SetLink(msg), NLM_F_REQUEST | NLM_F_ACK).map(drop)
}

fn address_message(index: u32, ip: IpAddr, prefix: u8) -> AddressMessage {
    let mut msg = AddressMessage::default();
    msg.header.family = match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    msg.header.prefix_len = prefix;
    msg.header.index = index;
    msg.attributes.push(AddressAttribute::Local(ip));
    msg.attributes.push(AddressAttribute::Address(ip));
    msg
}

/// The addresses on the link, with their prefixes.
pub fn addresses(index: u32) -> io::Result<Vec<(IpAddr, u8)>> {
    let answer = request(
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
        NLM_F_REQUEST | NLM_F_DUMP,
    )?;
    Ok(answer
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewAddress(a) if a.header.index == index => {
                let ip = a.attributes.iter().find_map(|at| match at {
                    AddressAttribute::Local(ip) => Some(*ip),
                    _ => None,
                });
                let ip = ip.or_else(|| {
                    a.attributes.iter().find_map(|at| match at {
                        AddressAttribute::Address(ip) => Some(*ip),
                        _ => None,
                    })
                })?;
                Some((ip, a.header.prefix_len))
            }
            _ => None,
        })
        .collect())
}

/// Makes `ip/prefix` the link's only address of its family (an adopted interface may carry
/// an old mesh IP); the prefix route to the mesh follows from it.
pub fn set_address(index: u32, ip: IpAddr, prefix: u8) -> io::Result<()> {
    for (old, old_prefix) in addresses(index)? {
        let same_family = old.is_ipv4() == ip.is_ipv4();
        let link_local_v6 = matches!(old, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80);
        if same_family && !link_local_v6 && (old, old_prefix) != (ip, prefix) {
            let msg = address_message(index, old, old_prefix);
            request(
                RouteNetlinkMessage::DelAddress(msg),
                NLM_F_REQUEST | NLM_F_ACK,
            )?;
        }
    }
    match request(
        RouteNetlinkMessage::NewAddress(address_message(index, ip, prefix)),
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
    ) {
        Err(e) if e.raw_os_error() == Some(EEXIST) => Ok(()),
        other => other.map(drop),
    }
}

/// Deletes the link named `name`; `Ok(false)` when there was none.
pub fn delete_link(name: &str) -> io::Result<bool> {
    let Some(index) = index(name)? else {
        return Ok(false);
    };
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    match request(RouteNetlinkMessage::DelLink(msg), NLM_F_REQUEST | NLM_F_ACK) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(ENODEV) => Ok(false),
        Err(e) => Err(e),
    }
}
