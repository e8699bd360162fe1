//! Which addresses a node may send WireGuard and disco datagrams to: one rule, shared by the
//! control plane (the endpoint reports it accepts, `control-plane/src/candidates.rs`) and the
//! agent's reach engine (the candidates a peer names in a call-me-maybe or a ping comes from).
//!
//! | kind | IPv4 | IPv6 | why it is refused |
//! |---|---|---|---|
//! | unspecified | `0.0.0.0` | `::` | not a destination at all |
//! | loopback | `127.0.0.0/8` | `::1` | every peer would send to itself |
//! | link-local | `169.254.0.0/16` | `fe80::/10` | the peer's own link (a cloud metadata service at 169.254.169.254) |
//! | multicast | `224.0.0.0/4` | `ff00::/8` | a group, not a node |
//! | broadcast | `255.255.255.255` | - | every host on the peer's link |
//! | mesh range | the Domain's `mesh_cidr` | the same | the tunnel would carry its own underlay |
//!
//! An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is judged as the IPv4 address it maps to
//! ([`canonical`] turns it into that address, so duplicates are found).

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// Why an address cannot be an endpoint peers send to (one row of the table above).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unusable {
    Unspecified,
    Loopback,
    LinkLocal,
    Multicast,
    Broadcast,
    MeshRange,
}

impl Unusable {
    /// What the address is and what sending there would do, for an error message.
    pub fn describe(self) -> &'static str {
        match self {
            Unusable::Unspecified => "unspecified: not a destination",
            Unusable::Loopback => "a loopback address: every peer would send to itself",
            Unusable::LinkLocal => {
                "link-local: peers would send to their own link (169.254.169.254 is a cloud metadata service)"
            }
            Unusable::Multicast => "multicast: a group, not a node",
            Unusable::Broadcast => "the broadcast address: every host on the peer's link",
            Unusable::MeshRange => {
                "inside the Domain's mesh range: the tunnel cannot carry its own underlay"
            }
        }
    }
}

/// `ip`, with an IPv4-mapped IPv6 address turned into the IPv4 address it reaches.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// `addr` with [`canonical_ip`]: `[::ffff:192.0.2.1]:51820` is `192.0.2.1:51820`.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(canonical_ip(addr.ip()), addr.port())
}

/// Why `ip` cannot be an endpoint, or `None` when peers may send to it. `mesh` is the Domain's
/// mesh range.
pub fn unusable(ip: IpAddr, mesh: IpNet) -> Option<Unusable> {
    let ip = canonical_ip(ip);
    let kind = match ip {
        IpAddr::V4(a) if a.is_unspecified() => Some(Unusable::Unspecified),
        IpAddr::V4(a) if a.is_loopback() => Some(Unusable::Loopback),
        IpAddr::V4(a) if a.is_link_local() => Some(Unusable::LinkLocal),
        IpAddr::V4(a) if a.is_multicast() => Some(Unusable::Multicast),
        IpAddr::V4(a) if a.is_broadcast() => Some(Unusable::Broadcast),
        IpAddr::V6(a) if a.is_unspecified() => Some(Unusable::Unspecified),
        IpAddr::V6(a) if a.is_loopback() => Some(Unusable::Loopback),
        IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80 => Some(Unusable::LinkLocal),
        IpAddr::V6(a) if a.is_multicast() => Some(Unusable::Multicast),
        _ => None,
    };
    kind.or_else(|| mesh.contains(&ip).then_some(Unusable::MeshRange))
}

/// Whether a datagram may be sent to `addr`: a usable address ([`unusable`]) and a port other
/// than 0.
pub fn sendable(addr: SocketAddr, mesh: IpNet) -> bool {
    addr.port() != 0 && unusable(addr.ip(), mesh).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_addresses_are_judged_and_compared_as_ipv4() {
        let mesh: IpNet = "10.64.0.0/16".parse().expect("net");
        let mapped: SocketAddr = "[::ffff:169.254.169.254]:80".parse().expect("addr");
        assert_eq!(unusable(mapped.ip(), mesh), Some(Unusable::LinkLocal));
        let v4: SocketAddr = "192.0.2.1:51820".parse().expect("addr");
        let as_v6: SocketAddr = "[::ffff:192.0.2.1]:51820".parse().expect("addr");
        assert_eq!(canonical(as_v6), v4);
        assert!(sendable(v4, mesh));
        assert!(!sendable(SocketAddr::new(v4.ip(), 0), mesh));
        assert!(!sendable("10.64.3.4:51820".parse().expect("addr"), mesh));
    }
}
