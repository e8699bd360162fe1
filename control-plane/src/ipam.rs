//! Mesh IP allocation: pure, no I/O. A range hands its host addresses out next-fit: after the
//! address it gave last, on to the end of the range, then round from the start again, so an
//! address a revoked node gave back is reused only once the rest of the range has been handed
//! out. The caller (`register`) keeps "the address given last" per range in the store and asks
//! the store which of the next few [`candidates`] live nodes hold: the cost of one allocation
//! does not grow with the number of nodes while the range has room.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// The host addresses of `range` in the order the allocator tries them: from the one after
/// `last` (the address handed out last; `None`: from the first host) to the end of the range,
/// then from the first host up to `last` itself. The network and broadcast (last) addresses
/// and every `reserved` sub-range of the same family are skipped, so a /31, /32 (or IPv6
/// /127, /128) range yields nothing. Every host address comes at most once; when the iterator
/// ends without a free one, the range is exhausted.
pub(crate) fn candidates(range: IpNet, reserved: &[IpNet], last: Option<IpAddr>) -> Candidates {
    let range = range.trunc();
    let (net, bcast) = (to_u128(range.network()), to_u128(range.broadcast()));
    let is_v4 = matches!(range, IpNet::V4(_));
    let mut holes: Vec<(u128, u128)> = reserved
        .iter()
        .filter(|r| matches!(r, IpNet::V4(_)) == is_v4)
        .map(|r| (to_u128(r.network()), to_u128(r.broadcast())))
        .collect();
    holes.sort_unstable();
    if bcast - net < 2 {
        return Candidates {
            is_v4,
            holes,
            segments: Vec::new(),
        };
    }
    let (first, last_host) = (net + 1, bcast - 1);
    let start = match last.map(to_u128) {
        Some(l) if (first..last_host).contains(&l) => l + 1,
        _ => first,
    };
    // Popped from the back: the tail of the range first, then the wrap-around.
    let mut segments = vec![(start, last_host)];
    if start > first {
        segments.insert(0, (first, start - 1));
    }
    Candidates {
        is_v4,
        holes,
        segments,
    }
}

/// See [`candidates`].
#[derive(Debug, Clone)]
pub struct Candidates {
    is_v4: bool,
    /// Reserved sub-ranges as `[start, end]` integers, sorted.
    holes: Vec<(u128, u128)>,
    /// What is left to walk, as `[next, end]`, the current one last.
    segments: Vec<(u128, u128)>,
}

impl Iterator for Candidates {
    type Item = IpAddr;

    fn next(&mut self) -> Option<IpAddr> {
        'walk: loop {
            let (next, end) = self.segments.last_mut()?;
            if *next > *end {
                self.segments.pop();
                continue;
            }
            for &(start, stop) in &self.holes {
                if (start..=stop).contains(next) {
                    match stop.checked_add(1) {
                        Some(after) => *next = after,
                        None => {
                            self.segments.pop();
                        }
                    }
                    continue 'walk;
                }
            }
            let ip = from_u128(*next, self.is_v4);
            *next += 1;
            return Some(ip);
        }
    }
}

/// How many addresses [`candidates`] could ever hand out in `range` (ignoring reservations).
pub fn usable_hosts(range: IpNet) -> u128 {
    let (first, last) = (to_u128(range.network()), to_u128(range.broadcast()));
    (last - first).saturating_sub(1)
}

/// Whether `inner` lies entirely inside `outer`.
pub(crate) fn contains_net(outer: &IpNet, inner: &IpNet) -> bool {
    outer.contains(&inner.network()) && outer.contains(&inner.broadcast())
}

/// Whether two ranges share at least one address.
pub(crate) fn overlaps(a: &IpNet, b: &IpNet) -> bool {
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
    use std::collections::HashSet;

    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[derive(Debug, PartialEq, Eq)]
    enum IpamError {
        Exhausted(IpNet),
    }

    /// The first free candidate from the start of the range: what a fresh range hands out.
    fn allocate(
        range: IpNet,
        taken: &HashSet<IpAddr>,
        reserved: &[IpNet],
    ) -> Result<IpAddr, IpamError> {
        candidates(range, reserved, None)
            .find(|c| !taken.contains(c))
            .ok_or(IpamError::Exhausted(range.trunc()))
    }

    #[test]
    fn next_fit_goes_on_after_the_last_address_then_wraps_around() {
        let r = net("10.9.0.0/29"); // hosts .1 to .6
        let after = |last: &str| -> Vec<IpAddr> { candidates(r, &[], Some(ip(last))).collect() };
        let order: Vec<IpAddr> = [
            "10.9.0.4", "10.9.0.5", "10.9.0.6", "10.9.0.1", "10.9.0.2", "10.9.0.3",
        ]
        .iter()
        .map(|s| ip(s))
        .collect();
        assert_eq!(after("10.9.0.3"), order);
        // After the last host, or from an address outside the range: from the first host.
        assert_eq!(
            after("10.9.0.6"),
            candidates(r, &[], None).collect::<Vec<_>>()
        );
        assert_eq!(
            after("10.1.2.3"),
            candidates(r, &[], None).collect::<Vec<_>>()
        );
        // Every host exactly once, wherever the walk starts; holes skipped on both laps.
        for last in 1..=6u8 {
            let got: Vec<IpAddr> = candidates(
                r,
                &[net("10.9.0.2/31")],
                Some(ip(&format!("10.9.0.{last}"))),
            )
            .collect();
            let set: HashSet<IpAddr> = got.iter().copied().collect();
            assert_eq!(got.len(), 4, "{got:?}");
            assert_eq!(set.len(), 4);
            assert!(!set.contains(&ip("10.9.0.2")) && !set.contains(&ip("10.9.0.3")));
        }
    }

    #[test]
    fn the_candidates_cost_nothing_until_asked_for() {
        // A /8 does not materialise 16 million addresses to hand out one.
        let mut c = candidates(net("10.0.0.0/8"), &[], Some(ip("10.200.0.7")));
        assert_eq!(c.next(), Some(ip("10.200.0.8")));
        assert_eq!(usable_hosts(net("10.0.0.0/8")), 16_777_214);
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
