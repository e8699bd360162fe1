//! Reverse names: `d.c.b.a.in-addr.arpa` and the nibbles of `ip6.arpa` to the address or prefix
//! they name, and the reverse zone that holds the mesh range.
//!
//! A reverse name with fewer labels than a whole address names a prefix (`64.10.in-addr.arpa`
//! is `10.64.0.0/16`). Labels must be canonical: decimal octets without leading zeros, single
//! hex nibbles; anything else is no reverse name at all (and answered REFUSED).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hickory_proto::rr::Name;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

const V4_SUFFIX: [&[u8]; 2] = [b"in-addr", b"arpa"];
const V6_SUFFIX: [&[u8]; 2] = [b"ip6", b"arpa"];

/// What lowercase `labels` (leftmost first, without the root) name under `in-addr.arpa` or
/// `ip6.arpa`: a prefix (a whole address is a /32 or /128), or `None` for any other name.
pub fn parse(labels: &[Vec<u8>]) -> Option<IpNet> {
    if let Some(head) = strip(labels, &V4_SUFFIX) {
        if head.len() > 4 {
            return None;
        }
        let mut octets = [0u8; 4];
        for (i, label) in head.iter().rev().enumerate() {
            octets[i] = octet(label)?;
        }
        let len = u8::try_from(head.len() * 8).ok()?;
        return Ipv4Net::new(Ipv4Addr::from(octets), len)
            .ok()
            .map(IpNet::V4);
    }
    if let Some(head) = strip(labels, &V6_SUFFIX) {
        if head.len() > 32 {
            return None;
        }
        let mut bits: u128 = 0;
        for (i, label) in head.iter().rev().enumerate() {
            let nibble = nibble(label)?;
            bits |= u128::from(nibble) << (124 - 4 * i);
        }
        let len = u8::try_from(head.len() * 4).ok()?;
        return Ipv6Net::new(Ipv6Addr::from(bits), len).ok().map(IpNet::V6);
    }
    None
}

fn strip<'a>(labels: &'a [Vec<u8>], suffix: &[&[u8]; 2]) -> Option<&'a [Vec<u8>]> {
    let n = labels.len().checked_sub(2)?;
    let tail_ok = labels[n..]
        .iter()
        .zip(suffix.iter())
        .all(|(l, s)| l.as_slice() == *s);
    tail_ok.then(|| &labels[..n])
}

fn octet(label: &[u8]) -> Option<u8> {
    let ok = !label.is_empty()
        && label.len() <= 3
        && label.iter().all(u8::is_ascii_digit)
        && (label.len() == 1 || label[0] != b'0');
    if !ok {
        return None;
    }
    std::str::from_utf8(label).ok()?.parse().ok()
}

fn nibble(label: &[u8]) -> Option<u8> {
    match label {
        [c] => (*c as char).to_digit(16).and_then(|d| u8::try_from(d).ok()),
        _ => None,
    }
}

/// The reverse zone that holds `mesh`: its prefix cut down to a whole octet (IPv4) or nibble
/// (IPv6), the only prefixes a reverse name can name.
pub(crate) fn zone_of(mesh: IpNet) -> IpNet {
    match mesh {
        IpNet::V4(n) => {
            let len = n.prefix_len() / 8 * 8;
            Ipv4Net::new(n.network(), len)
                .map(|n| IpNet::V4(n.trunc()))
                .unwrap_or(mesh)
        }
        IpNet::V6(n) => {
            let len = n.prefix_len() / 4 * 4;
            Ipv6Net::new(n.network(), len)
                .map(|n| IpNet::V6(n.trunc()))
                .unwrap_or(mesh)
        }
    }
}

/// Whether the reverse zone of `mesh` is exactly the mesh range (its prefix is a whole octet
/// or nibble): only then may systemd-resolved send that whole zone to plexd.
pub(crate) fn zone_is_exact(mesh: IpNet) -> bool {
    zone_of(mesh) == mesh.trunc()
}

/// The reverse name of a prefix at an octet (IPv4) or nibble (IPv6) boundary, as a string
/// without the trailing dot (`64.10.in-addr.arpa`); a prefix between boundaries is named by
/// the boundary above it.
pub fn name_of(net: IpNet) -> String {
    let net = zone_of(net);
    let mut labels: Vec<String> = match net {
        IpNet::V4(n) => {
            let octets = n.network().octets();
            let count = usize::from(n.prefix_len() / 8);
            octets[..count].iter().rev().map(u8::to_string).collect()
        }
        IpNet::V6(n) => {
            let bits = u128::from(n.network());
            let count = usize::from(n.prefix_len() / 4);
            (0..count)
                .rev()
                .map(|i| format!("{:x}", (bits >> (124 - 4 * i)) & 0xf))
                .collect()
        }
    };
    let suffix = if net.addr().is_ipv4() {
        "in-addr.arpa"
    } else {
        "ip6.arpa"
    };
    labels.push(suffix.to_owned());
    labels.join(".")
}

/// [`name_of`] as a DNS name (the owner of the reverse zone's SOA).
pub(crate) fn zone_name(mesh: IpNet) -> Name {
    let mut name = Name::from_ascii(name_of(mesh)).unwrap_or_else(|_| Name::root());
    name.set_fqdn(true);
    name
}

/// The address a whole reverse name names.
pub fn address(net: IpNet) -> Option<IpAddr> {
    (net.prefix_len() == net.max_prefix_len()).then(|| net.addr())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(s: &str) -> Vec<Vec<u8>> {
        s.split('.').map(|l| l.as_bytes().to_vec()).collect()
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("net")
    }

    #[test]
    fn names_to_prefixes() {
        assert_eq!(
            parse(&labels("1.0.64.10.in-addr.arpa")),
            Some(net("10.64.0.1/32"))
        );
        assert_eq!(
            parse(&labels("64.10.in-addr.arpa")),
            Some(net("10.64.0.0/16"))
        );
        assert_eq!(parse(&labels("in-addr.arpa")), Some(net("0.0.0.0/0")));
        for bad in [
            "01.0.64.10.in-addr.arpa",
            "256.0.64.10.in-addr.arpa",
            "1.1.0.64.10.in-addr.arpa",
            "x.10.in-addr.arpa",
            "10.in-addr.arpa.example",
            "mesh.internal",
        ] {
            assert_eq!(parse(&labels(bad)), None, "{bad}");
        }
        let v6 = "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.2.1.d.f.ip6.arpa";
        assert_eq!(parse(&labels(v6)), Some(net("fd12::1/128")));
        assert_eq!(parse(&labels("2.1.d.f.ip6.arpa")), Some(net("fd12::/16")));
        assert_eq!(parse(&labels("12.d.f.ip6.arpa")), None);
    }

    #[test]
    fn zones_of_mesh_ranges() {
        assert_eq!(name_of(net("10.64.0.0/16")), "64.10.in-addr.arpa");
        assert!(zone_is_exact(net("10.64.0.0/16")));
        assert_eq!(zone_of(net("100.64.0.0/10")), net("100.0.0.0/8"));
        assert!(!zone_is_exact(net("100.64.0.0/10")));
        assert_eq!(name_of(net("fd12:3400::/24")), "4.3.2.1.d.f.ip6.arpa");
        assert_eq!(
            zone_name(net("10.64.0.0/16")).to_ascii(),
            "64.10.in-addr.arpa."
        );
    }
}
