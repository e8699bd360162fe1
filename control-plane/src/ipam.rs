//! Mesh IP allocation: pure, no I/O. The caller supplies the range, the addresses live nodes
//! hold and the sub-ranges reserved by other Projects; the answer is the lowest free host.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    #[error("no free address is left in {0}")]
    Exhausted(IpNet),
}

/// The lowest host address of `range` that no live node holds and that lies in none of the
/// `reserved` sub-ranges. The network and broadcast (last) addresses are never handed out, so
/// a /31, /32 (or IPv6 /127, /128) range has no usable host.
pub fn allocate(
    range: IpNet,
    taken: &HashSet<IpAddr>,
    reserved: &[IpNet],
) -> Result<IpAddr, IpamError> {
    let range = range.trunc();
    let (first, last) = (to_u128(range.network()), to_u128(range.broadcast()));
    if last - first < 2 {
        return Err(IpamError::Exhausted(range));
    }
    let is_v4 = matches!(range, IpNet::V4(_));
    // Reserved ranges of the same family, as [start, end] integers, sorted.
    let mut holes: Vec<(u128, u128)> = reserved
        .iter()
        .filter(|r| matches!(r, IpNet::V4(_)) == is_v4)
        .map(|r| (to_u128(r.network()), to_u128(r.broadcast())))
        .collect();
    holes.sort_unstable();

    let mut candidate = first + 1;
    let last_host = last - 1;
    'search: while candidate <= last_host {
        for &(start, end) in &holes {
            if (start..=end).contains(&candidate) {
                match end.checked_add(1) {
                    Some(next) => candidate = next,
                    None => break 'search,
                }
                continue 'search;
            }
        }
        let ip = from_u128(candidate, is_v4);
        if !taken.contains(&ip) {
            return Ok(ip);
        }
        candidate += 1;
    }
    Err(IpamError::Exhausted(range))
}

/// How many addresses `allocate` could ever hand out in `range` (ignoring reservations).
pub fn usable_hosts(range: IpNet) -> u128 {
    let (first, last) = (to_u128(range.network()), to_u128(range.broadcast()));
    (last - first).saturating_sub(1)
}

/// Whether `inner` lies entirely inside `outer`.
pub fn contains_net(outer: &IpNet, inner: &IpNet) -> bool {
    outer.contains(&inner.network()) && outer.contains(&inner.broadcast())
}

/// Whether two ranges share at least one address.
pub fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_u128(n: u128, v4: bool) -> IpAddr {
    if v4 {
        // Candidates of a v4 range never exceed u32::MAX.
        IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX)))
    } else {
        IpAddr::V6(Ipv6Addr::from(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn lowest_free_host_skips_network_and_taken() {
        let none = HashSet::new();
        assert_eq!(
            allocate(net("10.64.0.0/16"), &none, &[]),
            Ok(ip("10.64.0.1"))
        );
        let taken: HashSet<_> = [ip("10.64.0.1"), ip("10.64.0.3")].into();
        assert_eq!(
            allocate(net("10.64.0.0/16"), &taken, &[]),
            Ok(ip("10.64.0.2"))
        );
        // A range written with host bits set is treated as its network.
        assert_eq!(
            allocate(net("10.64.0.9/30"), &none, &[]),
            Ok(ip("10.64.0.9"))
        );
    }

    #[test]
    fn small_ranges() {
        let none = HashSet::new();
        // /30: .1 and .2 are hosts; .0 network, .3 broadcast.
        let r = net("192.168.7.0/30");
        assert_eq!(allocate(r, &none, &[]), Ok(ip("192.168.7.1")));
        let one: HashSet<_> = [ip("192.168.7.1")].into();
        assert_eq!(allocate(r, &one, &[]), Ok(ip("192.168.7.2")));
        let both: HashSet<_> = [ip("192.168.7.1"), ip("192.168.7.2")].into();
        assert_eq!(allocate(r, &both, &[]), Err(IpamError::Exhausted(r)));
        assert_eq!(usable_hosts(r), 2);
        // /31 and /32 have nothing but network and broadcast.
        assert!(allocate(net("192.168.7.0/31"), &none, &[]).is_err());
        assert!(allocate(net("192.168.7.5/32"), &none, &[]).is_err());
        assert!(allocate(net("fd00::/127"), &none, &[]).is_err());
        assert!(allocate(net("fd00::1/128"), &none, &[]).is_err());
    }

    #[test]
    fn full_24_is_exhausted_after_254() {
        let r = net("10.64.1.0/24");
        let mut taken = HashSet::new();
        for _ in 0..254 {
            let got = allocate(r, &taken, &[]).unwrap();
            assert!(r.contains(&got) && got != ip("10.64.1.0") && got != ip("10.64.1.255"));
            assert!(taken.insert(got));
        }
        assert_eq!(allocate(r, &taken, &[]), Err(IpamError::Exhausted(r)));
        // Freeing one address (a revoked node) makes exactly that one available again.
        taken.remove(&ip("10.64.1.77"));
        assert_eq!(allocate(r, &taken, &[]), Ok(ip("10.64.1.77")));
    }

    #[test]
    fn reserved_sub_ranges_are_skipped() {
        let none = HashSet::new();
        let domain = net("10.64.0.0/16");
        let reserved = [net("10.64.0.0/24"), net("10.64.1.0/24")];
        assert_eq!(allocate(domain, &none, &reserved), Ok(ip("10.64.2.0")));
        // A reservation in the middle is jumped over.
        let taken: HashSet<_> = [ip("10.64.0.1")].into();
        let mid = [net("10.64.0.2/31"), net("10.64.0.4/30")];
        assert_eq!(allocate(domain, &taken, &mid), Ok(ip("10.64.0.8")));
        // A reservation covering the whole range exhausts it.
        let small = net("10.9.0.0/29");
        assert!(allocate(small, &none, &[net("10.9.0.0/28")]).is_err());
        // Reservations of the other family do not matter.
        assert_eq!(
            allocate(small, &none, &[net("fd00::/8")]),
            Ok(ip("10.9.0.1"))
        );
    }

    #[test]
    fn ipv6_ranges() {
        let r = net("fd7a:115c:a1e0::/64");
        let taken: HashSet<_> = [ip("fd7a:115c:a1e0::1")].into();
        assert_eq!(allocate(r, &taken, &[]), Ok(ip("fd7a:115c:a1e0::2")));
        let r = net("fd00::/126");
        let taken: HashSet<_> = [ip("fd00::1"), ip("fd00::2")].into();
        assert!(allocate(r, &taken, &[]).is_err());
    }

    #[test]
    fn containment_and_overlap() {
        assert!(contains_net(&net("10.64.0.0/16"), &net("10.64.1.0/24")));
        assert!(!contains_net(&net("10.64.0.0/16"), &net("10.65.1.0/24")));
        assert!(!contains_net(&net("10.64.0.0/16"), &net("10.0.0.0/8")));
        assert!(overlaps(&net("10.64.1.0/24"), &net("10.64.1.128/25")));
        assert!(!overlaps(&net("10.64.1.0/24"), &net("10.64.2.0/24")));
    }
}
