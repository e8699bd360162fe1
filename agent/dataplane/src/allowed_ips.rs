//! Allowed-IPs routing: longest-prefix match over IPv4 and IPv6 prefixes.
//!
//! One hash map per prefix length, and a short list of the lengths that hold anything, longest
//! first. A lookup masks the address once per present length and stops at the first hit, so its
//! cost depends on how many distinct prefix lengths are configured (one or two in a mesh of /32s),
//! not on how many prefixes there are. Keys are configured by the operator, never by the network,
//! so a fast non-keyed hash is safe here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// A longest-prefix-match table from IP prefixes to values (a peer, in the data plane).
#[derive(Debug, Clone)]
pub struct AllowedIps<T> {
    v4: Table<u32, T>,
    v6: Table<u128, T>,
}

impl<T> Default for AllowedIps<T> {
    fn default() -> Self {
        Self {
            v4: Table::new(32),
            v6: Table::new(128),
        }
    }
}

impl<T> AllowedIps<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `net` (host bits cleared, as WireGuard does) to `value`; answers the value it replaced.
    pub fn insert(&mut self, net: IpNet, value: T) -> Option<T> {
        match net.trunc() {
            IpNet::V4(n) => self.v4.insert(u32::from(n.addr()), n.prefix_len(), value),
            IpNet::V6(n) => self.v6.insert(u128::from(n.addr()), n.prefix_len(), value),
        }
    }

    /// Removes exactly `net` (not the prefixes inside it); answers its value.
    pub fn remove(&mut self, net: &IpNet) -> Option<T> {
        match net.trunc() {
            IpNet::V4(n) => self.v4.remove(u32::from(n.addr()), n.prefix_len()),
            IpNet::V6(n) => self.v6.remove(u128::from(n.addr()), n.prefix_len()),
        }
    }

    /// Keeps only the entries for which `keep` answers true.
    pub fn retain(&mut self, mut keep: impl FnMut(&IpNet, &T) -> bool) {
        self.v4.retain(|k, len, v| keep(&v4_net(k, len), v));
        self.v6.retain(|k, len, v| keep(&v6_net(k, len), v));
    }

    /// The value of the longest prefix that contains `addr`.
    #[inline]
    pub fn get(&self, addr: IpAddr) -> Option<&T> {
        match addr {
            IpAddr::V4(a) => self.get_v4(a),
            IpAddr::V6(a) => self.get_v6(a),
        }
    }

    #[inline]
    pub(crate) fn get_v4(&self, addr: Ipv4Addr) -> Option<&T> {
        self.v4.get(u32::from(addr))
    }

    #[inline]
    pub(crate) fn get_v6(&self, addr: Ipv6Addr) -> Option<&T> {
        self.v6.get(u128::from(addr))
    }

    /// Every entry, IPv4 first, in no particular order within a family.
    pub fn iter(&self) -> impl Iterator<Item = (IpNet, &T)> + '_ {
        let v4 = self.v4.iter().map(|(k, len, v)| (v4_net(k, len), v));
        let v6 = self.v6.iter().map(|(k, len, v)| (v6_net(k, len), v));
        v4.chain(v6)
    }

    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

fn v4_net(key: u32, len: u8) -> IpNet {
    // A stored length is always <= 32, so this never falls back.
    Ipv4Net::new(Ipv4Addr::from(key), len)
        .map(IpNet::V4)
        .unwrap_or_default()
}

fn v6_net(key: u128, len: u8) -> IpNet {
    Ipv6Net::new(Ipv6Addr::from(key), len)
        .map(IpNet::V6)
        .unwrap_or_default()
}

/// An address as an integer, maskable to a prefix length.
trait PublicKey: Copy + Eq + std::hash::Hash {
    fn mask(self, len: u8) -> Self;
}

impl PublicKey for u32 {
    #[inline]
    fn mask(self, len: u8) -> Self {
        self & u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
    }
}

impl PublicKey for u128 {
    #[inline]
    fn mask(self, len: u8) -> Self {
        self & u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
    }
}

type FastMap<K, T> = HashMap<K, T, BuildHasherDefault<IntHasher>>;

#[derive(Debug, Clone)]
struct Table<K, T> {
    /// Indexed by prefix length.
    by_len: Vec<FastMap<K, T>>,
    /// The lengths whose map is not empty, longest first.
    present: Vec<u8>,
}

impl<K: PublicKey, T> Table<K, T> {
    fn new(bits: u8) -> Self {
        Self {
            by_len: (0..=bits).map(|_| FastMap::default()).collect(),
            present: Vec::new(),
        }
    }

    fn insert(&mut self, key: K, len: u8, value: T) -> Option<T> {
        let map = self.by_len.get_mut(usize::from(len))?;
        let old = map.insert(key.mask(len), value);
        if !self.present.contains(&len) {
            self.present.push(len);
            self.present.sort_unstable_by(|a, b| b.cmp(a));
        }
        old
    }

    fn remove(&mut self, key: K, len: u8) -> Option<T> {
        let map = self.by_len.get_mut(usize::from(len))?;
        let old = map.remove(&key.mask(len));
        if map.is_empty() {
            self.present.retain(|l| *l != len);
        }
        old
    }

    fn retain(&mut self, mut keep: impl FnMut(K, u8, &T) -> bool) {
        for (len, map) in self.by_len.iter_mut().enumerate() {
            // by_len has at most 129 entries, so the length fits in a u8.
            let len = u8::try_from(len).unwrap_or(u8::MAX);
            map.retain(|k, v| keep(*k, len, v));
        }
        let by_len = &self.by_len;
        self.present
            .retain(|l| by_len.get(usize::from(*l)).is_some_and(|m| !m.is_empty()));
    }

    #[inline]
    fn get(&self, addr: K) -> Option<&T> {
        self.present.iter().find_map(|&len| {
            self.by_len
                .get(usize::from(len))
                .and_then(|m| m.get(&addr.mask(len)))
        })
    }

    fn iter(&self) -> impl Iterator<Item = (K, u8, &T)> + '_ {
        self.present.iter().flat_map(move |&len| {
            self.by_len
                .get(usize::from(len))
                .into_iter()
                .flat_map(move |m| m.iter().map(move |(k, v)| (*k, len, v)))
        })
    }

    fn len(&self) -> usize {
        self.by_len.iter().map(HashMap::len).sum()
    }
}

/// A multiply-rotate hasher for integer keys (FxHash's idea).
#[derive(Default, Clone, Copy)]
struct IntHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Hasher for IntHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(SEED);
    }

    #[inline]
    fn write_u128(&mut self, n: u128) {
        // Truncations on purpose: the two halves of the address.
        self.write_u64(n as u64);
        self.write_u64((n >> 64) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("test prefix")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn longest_prefix_wins_over_overlapping_ones() {
        let mut t = AllowedIps::new();
        t.insert(net("0.0.0.0/0"), "default");
        t.insert(net("10.0.0.0/8"), "ten");
        t.insert(net("10.64.0.0/16"), "mesh");
        t.insert(net("10.64.1.7/32"), "host");
        assert_eq!(t.get(ip("10.64.1.7")), Some(&"host"));
        assert_eq!(t.get(ip("10.64.1.8")), Some(&"mesh"));
        assert_eq!(t.get(ip("10.1.2.3")), Some(&"ten"));
        assert_eq!(t.get(ip("192.0.2.1")), Some(&"default"));
        assert_eq!(t.get(ip("2001:db8::1")), None, "v4 routes never match v6");
    }

    #[test]
    fn ipv6_prefixes_and_host_bits_are_cleared() {
        let mut t = AllowedIps::new();
        t.insert(net("fd00::1/64"), 1);
        t.insert(net("fd00::/16"), 2);
        t.insert(net("::/0"), 3);
        assert_eq!(t.get(ip("fd00::ffff")), Some(&1));
        assert_eq!(t.get(ip("fd00:1::1")), Some(&2));
        assert_eq!(t.get(ip("2001:db8::1")), Some(&3));
        assert_eq!(t.get(ip("10.0.0.1")), None);
        let nets: Vec<IpNet> = t.iter().map(|(n, _)| n).collect();
        assert!(
            nets.contains(&net("fd00::/64")),
            "stored truncated: {nets:?}"
        );
    }

    #[test]
    fn removal_falls_back_to_the_next_prefix() {
        let mut t = AllowedIps::new();
        t.insert(net("10.0.0.0/8"), 'a');
        t.insert(net("10.1.0.0/16"), 'b');
        assert_eq!(t.remove(&net("10.1.0.0/16")), Some('b'));
        assert_eq!(t.get(ip("10.1.2.3")), Some(&'a'));
        assert_eq!(t.remove(&net("10.1.0.0/16")), None);
        assert_eq!(t.len(), 1);
        t.retain(|_, v| *v != 'a');
        assert!(t.is_empty());
        assert_eq!(t.get(ip("10.1.2.3")), None);
    }

    #[test]
    fn inserting_an_existing_prefix_moves_it() {
        let mut t = AllowedIps::new();
        assert_eq!(t.insert(net("10.0.0.1/32"), 1), None);
        assert_eq!(t.insert(net("10.0.0.1/32"), 2), Some(1));
        assert_eq!(t.get(ip("10.0.0.1")), Some(&2));
        assert_eq!(t.len(), 1);
    }

    fn naive(entries: &[(IpNet, u32)], addr: IpAddr) -> Option<u32> {
        // Later inserts of the same prefix replace earlier ones, as in the table.
        let mut best: Option<(u8, u32)> = None;
        for (n, v) in entries {
            if n.contains(&addr) && best.is_none_or(|(len, _)| n.prefix_len() >= len) {
                best = Some((n.prefix_len(), *v));
            }
        }
        best.map(|(_, v)| v)
    }

    fn arb_net() -> impl Strategy<Value = IpNet> {
        prop_oneof![
            (any::<u32>(), 0u8..=32).prop_map(|(a, l)| IpNet::V4(
                Ipv4Net::new(Ipv4Addr::from(a & 0xff0f_00ff), l)
                    .expect("len <= 32")
                    .trunc()
            )),
            (any::<u128>(), 0u8..=128).prop_map(|(a, l)| IpNet::V6(
                Ipv6Net::new(Ipv6Addr::from(a & (0xffff_u128 << 112 | 0xff)), l)
                    .expect("len <= 128")
                    .trunc()
            )),
        ]
    }

    proptest! {
        #[test]
        fn matches_a_linear_scan(
            entries in proptest::collection::vec((arb_net(), any::<u32>()), 0..60),
            removals in proptest::collection::vec(any::<prop::sample::Index>(), 0..10),
            probes in proptest::collection::vec(
                prop_oneof![
                    any::<u32>().prop_map(|a| IpAddr::V4(Ipv4Addr::from(a & 0xff0f_00ff))),
                    any::<u128>().prop_map(|a| IpAddr::V6(Ipv6Addr::from(a & (0xffff_u128 << 112 | 0xff)))),
                ],
                1..40),
        ) {
            let mut table = AllowedIps::new();
            let mut list: Vec<(IpNet, u32)> = Vec::new();
            for (n, v) in &entries {
                table.insert(*n, *v);
                list.retain(|(m, _)| m != n);
                list.push((*n, *v));
            }
            for r in &removals {
                if list.is_empty() { break; }
                let (n, _) = list.remove(r.index(list.len()));
                prop_assert!(table.remove(&n).is_some());
            }
            prop_assert_eq!(table.len(), list.len());
            for p in probes {
                prop_assert_eq!(table.get(p).copied(), naive(&list, p), "probe {}", p);
            }
            for (n, _) in &list {
                let a = n.network();
                prop_assert_eq!(table.get(a).copied(), naive(&list, a), "network of {}", n);
            }
        }
    }
}
