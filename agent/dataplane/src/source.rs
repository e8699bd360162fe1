//! Sticky source addresses: the local address a datagram arrived at, remembered with the
//! peer's endpoint so replies leave from the address the peer sent to (as the kernel's
//! WireGuard and wireguard-go do), over IPv4 and IPv6.
//!
//! The socket reports a `Source` for each received datagram (`IP_PKTINFO` /
//! `IPV6_PKTINFO`); the device stores it beside the endpoint when the datagram authenticates,
//! and stamps it on what it sends to that endpoint; the socket sends from it, and falls back
//! to the kernel's own choice when the address is gone (see `crate::linux::udp`).

use std::net::IpAddr;

/// A local address and the interface it was reached on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source {
    pub ip: IpAddr,
    /// The receiving interface's index (0: unknown). Only an IPv6 link-local source needs it
    /// on send; elsewhere routing picks the interface, so a route change is followed.
    pub ifindex: u32,
}

impl Source {
    /// The source for an address as the socket reports it (IPv4-mapped IPv6 becomes IPv4);
    /// none for the unspecified address.
    pub fn new(ip: IpAddr, ifindex: u32) -> Option<Self> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        (!ip.is_unspecified()).then_some(Self { ip, ifindex })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn mapped_addresses_become_ipv4_and_the_unspecified_one_is_no_source() {
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 2).to_ipv6_mapped());
        assert_eq!(
            Source::new(mapped, 3),
            Some(Source {
                ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
                ifindex: 3
            })
        );
        assert_eq!(Source::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 3), None);
        assert_eq!(Source::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0), None);
        let v6: IpAddr = "fd00:aa::2".parse().expect("ip");
        assert_eq!(Source::new(v6, 0).map(|s| s.ip), Some(v6));
    }
}
