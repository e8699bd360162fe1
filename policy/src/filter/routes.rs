//! A peer's route prefixes (subnet routes, exit prefixes) as the packet path looks them up:
//! the prefixes of one family flattened into disjoint address ranges, each with the grant of
//! the longest prefix that holds it, so a lookup is one binary search (at most 9 steps for
//! [`super::MAX_ROUTE_PREFIXES_PER_PEER`] prefixes: 2 x 256 + 1 ranges), whatever the
//! prefixes' lengths or nesting. Built once per view, never per packet.
//!
//! [`disjoint`] is the same flattening for whoever needs ranges instead of prefixes (the
//! kernel backend's nftables interval maps refuse overlapping elements).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// One family's prefixes as sorted, disjoint ranges.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ranges {
    starts: Vec<u128>,
    ends: Vec<u128>,
    grants: Vec<u32>,
}

impl Ranges {
    fn lookup(&self, a: u128) -> Option<u32> {
        let i = self.starts.partition_point(|&s| s <= a).checked_sub(1)?;
        (a <= self.ends[i]).then(|| self.grants[i])
    }
}

/// Both families of one peer's prefixes in one direction.
#[derive(Debug, Clone, Default)]
pub(crate) struct RouteTable {
    v4: Ranges,
    v6: Ranges,
}

impl RouteTable {
    /// The table of `prefixes` (prefix, grant index); the longest prefix holding an address
    /// decides its grant; of two equal prefixes the first counts.
    pub(crate) fn new(prefixes: &[(IpNet, u32)]) -> RouteTable {
        let mut t = RouteTable::default();
        for (v6, ranges) in [(false, &mut t.v4), (true, &mut t.v6)] {
            let fam: Vec<(IpNet, u32)> = prefixes
                .iter()
                .filter(|(p, _)| matches!(p, IpNet::V6(_)) == v6)
                .copied()
                .collect();
            for (start, end, grant) in flatten(&fam) {
                ranges.starts.push(start);
                ranges.ends.push(end);
                ranges.grants.push(grant);
            }
        }
        t
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.v4.starts.is_empty() && self.v6.starts.is_empty()
    }

    /// The grant of the longest prefix holding `addr`.
    #[inline]
    pub(crate) fn get(&self, addr: &IpAddr) -> Option<u32> {
        match addr {
            IpAddr::V4(a) => self.v4.lookup(u128::from(u32::from(*a))),
            IpAddr::V6(a) => self.v6.lookup(u128::from(*a)),
        }
    }
}

/// A prefix as its first and last address (IPv4 as `u32` values).
fn bounds(p: &IpNet) -> (u128, u128) {
    match p {
        IpNet::V4(n) => (
            u128::from(u32::from(n.network())),
            u128::from(u32::from(n.broadcast())),
        ),
        IpNet::V6(n) => (u128::from(n.network()), u128::from(n.broadcast())),
    }
}

/// The disjoint ranges of one family's prefixes: `(first, last, value)`, sorted, adjacent
/// ranges with equal values merged. Prefixes either nest or are disjoint, so a sweep in
/// order of (start, widest first) with a stack of the open prefixes does it in
/// O(n log n).
fn flatten<T: Copy + Eq>(prefixes: &[(IpNet, T)]) -> Vec<(u128, u128, T)> {
    let mut items: Vec<(u128, u128, T)> = prefixes
        .iter()
        .map(|(p, t)| {
            let (s, e) = bounds(p);
            (s, e, *t)
        })
        .collect();
    // Start ascending, then the widest (largest end) first; stable: of equal prefixes the
    // first comes first.
    items.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut out: Vec<(u128, u128, T)> = Vec::new();
    let mut emit = |from: u128, to: u128, t: T| {
        if from > to {
            return;
        }
        if let Some(last) = out.last_mut()
            && last.2 == t
            && last.1.checked_add(1) == Some(from)
        {
            last.1 = to;
            return;
        }
        out.push((from, to, t));
    };
    // The next address not yet emitted (None: past the family's last address).
    let mut cursor: Option<u128> = Some(0);
    let mut stack: Vec<(u128, u128, T)> = Vec::new();
    for (s, e, t) in items {
        // Close the open prefixes that end before this one starts.
        while let Some(&(_, te, tt)) = stack.last() {
            if te >= s {
                break;
            }
            if let Some(c) = cursor {
                emit(c, te, tt);
            }
            cursor = te.checked_add(1);
            stack.pop();
        }
        if stack.last().is_some_and(|&(ts, te, _)| ts == s && te == e) {
            continue; // an equal prefix: the first one counts
        }
        if let (Some(&(_, _, tt)), Some(c)) = (stack.last(), cursor)
            && s > 0
        {
            emit(c, s - 1, tt);
        }
        cursor = Some(s);
        stack.push((s, e, t));
    }
    while let Some((_, te, tt)) = stack.pop() {
        if let Some(c) = cursor
            && c <= te
        {
            emit(c, te, tt);
            cursor = te.checked_add(1);
        }
    }
    out
}

/// `prefixes` as disjoint address ranges `(first, last, value)`, IPv4 then IPv6, each
/// sorted; an address's value is that of the longest prefix holding it (of equal prefixes,
/// the first's). Adjacent ranges with equal values are merged.
pub fn disjoint<T: Copy + Eq>(prefixes: &[(IpNet, T)]) -> Vec<(IpAddr, IpAddr, T)> {
    let mut out = Vec::new();
    for v6 in [false, true] {
        let fam: Vec<(IpNet, T)> = prefixes
            .iter()
            .filter(|(p, _)| matches!(p, IpNet::V6(_)) == v6)
            .copied()
            .collect();
        for (s, e, t) in flatten(&fam) {
            let addr = |x: u128| -> IpAddr {
                if v6 {
                    IpAddr::V6(Ipv6Addr::from(x))
                } else {
                    IpAddr::V4(Ipv4Addr::from(u32::try_from(x).unwrap_or(u32::MAX)))
                }
            };
            out.push((addr(s), addr(e), t));
        }
    }
    out
}
