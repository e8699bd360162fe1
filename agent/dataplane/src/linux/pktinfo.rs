//! `IP_PKTINFO` / `IPV6_PKTINFO` control messages: the local address a datagram arrived at,
//! and the one to send from (sticky source, see `crate::source`).

use std::net::IpAddr;
use std::os::fd::AsFd;

use nix::libc;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, setsockopt, sockopt};

use crate::source::Source;

/// Room for the control messages one received datagram may carry: its UDP GRO segment size
/// and its packet info (IPv6's is the larger; an IPv4 socket gets the IPv4 one).
pub(super) fn recv_space() -> Vec<u8> {
    nix::cmsg_space!(libc::c_int, libc::in6_pktinfo)
}

/// Asks the kernel for each datagram's local address; answers whether it will give it.
pub(super) fn enable(fd: &impl AsFd, ipv6: bool) -> bool {
    if ipv6 {
        // On a dual-stack socket IPv4 datagrams come with IPv4-mapped addresses too.
        setsockopt(fd, sockopt::Ipv6RecvPacketInfo, &true).is_ok()
    } else {
        setsockopt(fd, sockopt::Ipv4PacketInfo, &true).is_ok()
    }
}

/// The local address in a received control message, if it is packet info.
pub(super) fn source(c: &ControlMessageOwned) -> Option<Source> {
    match c {
        ControlMessageOwned::Ipv4PacketInfo(info) => Source::new(
            IpAddr::from(u32::from_be(info.ipi_addr.s_addr).to_be_bytes()),
            u32::try_from(info.ipi_ifindex).unwrap_or(0),
        ),
        ControlMessageOwned::Ipv6PacketInfo(info) => {
            Source::new(IpAddr::from(info.ipi6_addr.s6_addr), info.ipi6_ifindex)
        }
        _ => None,
    }
}

/// Packet info that makes a send leave from a source address; see `cmsg`.
pub(super) enum SendInfo {
    V4(libc::in_pktinfo),
    V6(libc::in6_pktinfo),
}

impl SendInfo {
    /// IPv4: the source address only (`ipi_spec_dst`; routing picks the interface, so a
    /// changed route is followed). IPv6: the address, and the interface for a link-local one,
    /// which is ambiguous without it.
    pub(super) fn new(src: Source) -> Self {
        match src.ip {
            IpAddr::V4(v4) => Self::V4(libc::in_pktinfo {
                ipi_ifindex: 0,
                ipi_spec_dst: libc::in_addr {
                    s_addr: u32::from(v4).to_be(),
                },
                ipi_addr: libc::in_addr { s_addr: 0 },
            }),
            IpAddr::V6(v6) => Self::V6(libc::in6_pktinfo {
                ipi6_addr: libc::in6_addr {
                    s6_addr: v6.octets(),
                },
                ipi6_ifindex: if v6.is_unicast_link_local() {
                    src.ifindex
                } else {
                    0
                },
            }),
        }
    }

    /// Exactly the room `cmsg` takes in a message (sendmmsg sends the whole buffer).
    pub(super) fn space(&self) -> Vec<u8> {
        match self {
            Self::V4(_) => nix::cmsg_space!(libc::in_pktinfo),
            Self::V6(_) => nix::cmsg_space!(libc::in6_pktinfo),
        }
    }

    pub(super) fn cmsg(&self) -> ControlMessage<'_> {
        match self {
            Self::V4(info) => ControlMessage::Ipv4PacketInfo(info),
            Self::V6(info) => ControlMessage::Ipv6PacketInfo(info),
        }
    }
}

/// True when a send with a source address may have failed because of that address: IPv4
/// answers ENETUNREACH for a source that is no longer local, IPv6 EINVAL; EADDRNOTAVAIL,
/// ENODEV and ENXIO when its interface went away. The kernel's WireGuard then sends without
/// it (and a send that fails for another reason fails again without it, at one call's cost).
pub(super) fn source_refused(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENETUNREACH | libc::EINVAL | libc::EADDRNOTAVAIL | libc::ENODEV | libc::ENXIO)
    )
}
