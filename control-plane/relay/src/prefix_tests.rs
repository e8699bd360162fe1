use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn limits(per_sec: u64, burst: u64, max_prefixes: usize) -> PrefixLimits {
    PrefixLimits {
        per_sec,
        burst,
        max_prefixes,
    }
}

#[test]
fn answers_are_grouped_by_24_and_48() {
    assert_eq!(
        answer_prefix(ip("198.51.100.7")),
        Prefix::V4([198, 51, 100, 0])
    );
    assert_eq!(
        answer_prefix(ip("198.51.100.7")),
        answer_prefix(ip("198.51.100.250"))
    );
    assert_ne!(
        answer_prefix(ip("198.51.100.7")),
        answer_prefix(ip("198.51.101.7"))
    );
    // A v4-mapped sender counts as its IPv4 /24.
    assert_eq!(
        answer_prefix(ip("::ffff:198.51.100.9")),
        answer_prefix(ip("198.51.100.7"))
    );
    let a = answer_prefix(ip("2001:db8:aaaa:1::1"));
    assert_eq!(a, answer_prefix(ip("2001:db8:aaaa:ffff:1:2:3:4")));
    assert_ne!(a, answer_prefix(ip("2001:db8:aaab::1")));
    assert_eq!(
        a,
        Prefix::V6(Ipv6Addr::new(0x2001, 0xdb8, 0xaaaa, 0, 0, 0, 0, 0).octets())
    );
}

#[test]
fn connections_are_counted_by_address_and_64() {
    assert_eq!(
        conn_source(ip("198.51.100.7")),
        Prefix::V4(Ipv4Addr::new(198, 51, 100, 7).octets())
    );
    assert_ne!(
        conn_source(ip("198.51.100.7")),
        conn_source(ip("198.51.100.8"))
    );
    assert_eq!(
        conn_source(ip("2001:db8:1:2:aaaa::1")),
        conn_source(ip("2001:db8:1:2:bbbb::9"))
    );
    assert_ne!(
        conn_source(ip("2001:db8:1:2::1")),
        conn_source(ip("2001:db8:1:3::1"))
    );
    assert_eq!(
        conn_source(ip("::ffff:10.0.0.1")),
        conn_source(ip("10.0.0.1"))
    );
}

#[test]
fn a_prefix_gets_its_burst_then_its_rate_and_others_their_own() {
    let t0 = Instant::now();
    let mut b = PrefixBuckets::new(limits(10, 20, 100), t0);
    let n =
        |b: &mut PrefixBuckets, s: &str, t: Instant| (0..100).filter(|_| b.take(ip(s), t)).count();
    // The burst is shared by the whole /24.
    assert_eq!(
        n(&mut b, "192.0.2.1", t0) + n(&mut b, "192.0.2.200", t0),
        20
    );
    // Another /24 has its own.
    assert_eq!(n(&mut b, "192.0.3.1", t0), 20);
    // 500 ms later: 5 more for the first.
    let t1 = t0 + Duration::from_millis(500);
    assert_eq!(n(&mut b, "192.0.2.7", t1), 5);
    // IPv6: one /48 shares, the next /48 does not.
    assert_eq!(
        n(&mut b, "2001:db8:1:1::1", t0) + n(&mut b, "2001:db8:1:ffff::1", t0),
        20
    );
    assert_eq!(n(&mut b, "2001:db8:2::1", t0), 20);
    assert_eq!(b.len(), 4);
}

#[test]
fn idle_buckets_are_pruned_and_the_cap_holds() {
    let t0 = Instant::now();
    let mut b = PrefixBuckets::new(limits(10, 10, 3), t0);
    for i in 0..3u8 {
        assert!(b.take(IpAddr::V4(Ipv4Addr::new(10, 0, i, 1)), t0));
    }
    assert_eq!(b.len(), 3);
    // At the cap, new prefixes share one overflow bucket (burst 10), however many they are.
    let past_cap = (0..200u8)
        .filter(|i| b.take(IpAddr::V4(Ipv4Addr::new(10, 1, *i, 1)), t0))
        .count();
    assert_eq!(past_cap, 10);
    assert_eq!(b.len(), 3, "no bucket past the cap");
    // A periodic tick before the refill time prunes nothing (the buckets are not full yet).
    b.tick(t0 + Duration::from_millis(500));
    assert_eq!(b.len(), 3);
    // Once they are full again (burst / rate = 1 s), they are pruned.
    let t1 = t0 + Duration::from_secs(1);
    b.tick(t1);
    assert!(b.is_empty());
    // A busy bucket stays while an idle one goes.
    let t2 = t1 + Duration::from_secs(1);
    assert!(b.take(ip("10.9.0.1"), t2));
    let t3 = t2 + Duration::from_millis(900);
    assert!(b.take(ip("10.8.0.1"), t3));
    b.prune(t2 + Duration::from_millis(1500));
    assert_eq!(b.len(), 1);
    // A new prefix at the cap prunes the idle ones first and gets its own bucket.
    let mut c = PrefixBuckets::new(limits(10, 10, 1), t0);
    assert!(c.take(ip("10.0.0.1"), t0));
    assert_eq!((0..20).filter(|_| c.take(ip("10.5.0.1"), t0)).count(), 10);
    let later = t0 + Duration::from_secs(2);
    assert_eq!(
        (0..20).filter(|_| c.take(ip("10.6.0.1"), later)).count(),
        10
    );
    assert_eq!(c.len(), 1);
    // ... and did not spend the overflow bucket, which a further prefix still finds full.
    assert_eq!(
        (0..20).filter(|_| c.take(ip("10.7.0.1"), later)).count(),
        10
    );
}

#[test]
fn limits_are_checked() {
    let flags = ["--a", "--b", "--c"];
    assert!(limits(1, 1, 1).check(flags).is_ok());
    assert_eq!(
        limits(0, 1, 1).check(flags).unwrap_err(),
        "--a must be at least 1"
    );
    assert_eq!(
        limits(1, 0, 1).check(flags).unwrap_err(),
        "--b must be at least 1"
    );
    assert_eq!(
        limits(1, 1, 0).check(flags).unwrap_err(),
        "--c must be at least 1"
    );
}
