//! Per-client token buckets (registration per client address, the node routes per node id),
//! and the rule that names the client.
//!
//! Pure logic: time comes in as `now: Instant`, nothing here sleeps or reads a clock, so the
//! tests step time by hand. The HTTP layer owns each [`RateLimiter`] behind a mutex.
//!
//! Bounded: a limiter tracks at most its capacity of keys ([`MAX_TRACKED_CLIENTS`] by
//! default). A new key at capacity first drops the buckets that are full again (the same as
//! none), then, when a spray of addresses keeps it full, the least recently used eighth. An
//! evicted client starts again with a full budget, so the cap trades a little precision under
//! attack for a map that never grows without bound. IPv6 clients are bucketed per /64
//! ([`client_key`]): one host owns a whole /64 and would otherwise have 2^64 budgets.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, Instant};

use ipnet::IpNet;

/// The budget of one client: `burst` requests at once, one more every `refill`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub burst: u32,
    pub refill: Duration,
}

impl Default for RateLimit {
    /// A burst of ten, one request back every three seconds.
    fn default() -> Self {
        Self {
            burst: 10,
            refill: Duration::from_secs(3),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Tokens available at `at`, in units of 1/`refill` (fractional tokens as elapsed time).
    tokens: f64,
    at: Instant,
}

/// The most keys one limiter tracks before it evicts (see the module doc).
pub(crate) const MAX_TRACKED_CLIENTS: usize = 100_000;

/// Token buckets keyed by client (an address, see [`client_key`], or a node id).
#[derive(Debug)]
pub struct RateLimiter<K = IpAddr> {
    limit: RateLimit,
    buckets: HashMap<K, Bucket>,
    capacity: usize,
    last_prune: Option<Instant>,
}

/// The verdict on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Refused; a token is back after this long.
    Limited {
        retry_after: Duration,
    },
}

impl Decision {
    /// `Retry-After` in whole seconds, rounded up, at least 1.
    pub(crate) fn retry_after_secs(retry_after: Duration) -> u64 {
        let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        secs.max(1)
    }
}

impl<K: Hash + Eq + Copy> RateLimiter<K> {
    pub fn new(limit: RateLimit) -> Self {
        Self::with_capacity(limit, MAX_TRACKED_CLIENTS)
    }

    /// A limiter that tracks at most `capacity` keys (at least 8).
    pub fn with_capacity(limit: RateLimit, capacity: usize) -> Self {
        Self {
            limit,
            buckets: HashMap::new(),
            capacity: capacity.max(8),
            last_prune: None,
        }
    }

    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    /// Takes one token from `client`'s bucket, if it has one.
    pub fn check(&mut self, client: K, now: Instant) -> Decision {
        self.prune(now);
        if self.buckets.len() >= self.capacity && !self.buckets.contains_key(&client) {
            self.make_room(now);
        }
        let burst = f64::from(self.limit.burst.max(1));
        let refill = self.limit.refill.as_secs_f64().max(f64::MIN_POSITIVE);
        let bucket = self.buckets.entry(client).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed / refill).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Decision::Allow
        } else {
            let missing = 1.0 - bucket.tokens;
            Decision::Limited {
                retry_after: Duration::from_secs_f64(missing * refill),
            }
        }
    }

    /// Drops buckets that have been full for a while (a full bucket is the same as none).
    /// Runs at most once per refill period's worth of full-bucket time.
    fn prune(&mut self, now: Instant) {
        let full_after = self.limit.refill.saturating_mul(self.limit.burst.max(1));
        if let Some(last) = self.last_prune
            && now.saturating_duration_since(last) < full_after
        {
            return;
        }
        self.last_prune = Some(now);
        self.buckets
            .retain(|_, b| now.saturating_duration_since(b.at) < full_after);
    }

    /// At capacity: drops the full buckets, and when that frees less than an eighth, the
    /// least recently used eighth (one O(n) pass per n/8 new keys).
    fn make_room(&mut self, now: Instant) {
        let full_after = self.limit.refill.saturating_mul(self.limit.burst.max(1));
        self.buckets
            .retain(|_, b| now.saturating_duration_since(b.at) < full_after);
        let target = self.capacity - self.capacity / 8;
        if self.buckets.len() <= target {
            return;
        }
        let mut ages: Vec<Instant> = self.buckets.values().map(|b| b.at).collect();
        let cut = self.buckets.len() - target;
        let (_, nth, _) = ages.select_nth_unstable(cut - 1);
        let oldest_kept = *nth;
        let mut to_drop = cut;
        self.buckets.retain(|_, b| {
            if to_drop > 0 && b.at <= oldest_kept {
                to_drop -= 1;
                false
            } else {
                true
            }
        });
        tracing::warn!(
            capacity = self.capacity,
            evicted = cut - to_drop,
            "the rate limiter is tracking as many clients as it may; the least recently seen were forgotten (they start again with a full budget)"
        );
    }

    /// How many clients have a bucket (for tests and metrics).
    pub fn tracked_clients(&self) -> usize {
        self.buckets.len()
    }
}

/// The client a request comes from: the socket peer, unless the peer is a trusted proxy;
/// then the rightmost `X-Forwarded-For` hop that is not itself a trusted proxy.
/// `forwarded_for` is every `X-Forwarded-For` header line in the order received: several
/// lines are one list (RFC 9110 5.3), so a proxy that appends a line of its own is read
/// right. A malformed hop, or a list made only of trusted proxies, falls back to the peer.
pub(crate) fn client_addr<'a>(
    peer: IpAddr,
    forwarded_for: impl IntoIterator<Item = &'a str>,
    trusted_proxies: &[IpNet],
) -> IpAddr {
    let peer = plexsphere_wire::endpoint::canonical_ip(peer);
    let trusted = |ip: &IpAddr| trusted_proxies.iter().any(|net| net.contains(ip));
    if !trusted(&peer) {
        return peer;
    }
    let mut hops = Vec::new();
    for part in forwarded_for.into_iter().flat_map(|line| line.split(',')) {
        match part.trim().parse::<IpAddr>() {
            Ok(ip) => hops.push(plexsphere_wire::endpoint::canonical_ip(ip)),
            Err(_) => return peer,
        }
    }
    hops.into_iter()
        .rev()
        .find(|ip| !trusted(ip))
        .unwrap_or(peer)
}

/// The bucket an address is counted in: an IPv4 address itself, an IPv6 address its /64.
pub(crate) fn client_key(ip: IpAddr) -> IpAddr {
    match plexsphere_wire::endpoint::canonical_ip(ip) {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(prefix))
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn burst_then_one_back_every_refill() {
        let mut rl = RateLimiter::new(RateLimit::default());
        let t0 = Instant::now();
        let a = ip("192.0.2.1");
        for _ in 0..10 {
            assert_eq!(rl.check(a, t0), Decision::Allow);
        }
        let Decision::Limited { retry_after } = rl.check(a, t0) else {
            panic!("11th request allowed")
        };
        assert_eq!(Decision::retry_after_secs(retry_after), 3);
        // 1 s later, 2 s are still missing.
        let Decision::Limited { retry_after } = rl.check(a, t0 + Duration::from_secs(1)) else {
            panic!("allowed too early")
        };
        assert_eq!(Decision::retry_after_secs(retry_after), 2);
        assert_eq!(rl.check(a, t0 + Duration::from_secs(3)), Decision::Allow);
        assert!(matches!(
            rl.check(a, t0 + Duration::from_secs(3)),
            Decision::Limited { .. }
        ));
        // Another client has its own budget.
        assert_eq!(rl.check(ip("192.0.2.2"), t0), Decision::Allow);
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(Decision::retry_after_secs(Duration::from_millis(2001)), 3);
        assert_eq!(Decision::retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(Decision::retry_after_secs(Duration::ZERO), 1);
    }

    #[test]
    fn idle_buckets_are_pruned() {
        let mut rl = RateLimiter::new(RateLimit {
            burst: 2,
            refill: Duration::from_secs(1),
        });
        let t0 = Instant::now();
        for i in 0..50u8 {
            rl.check(IpAddr::from([10, 0, 0, i]), t0);
        }
        assert_eq!(rl.tracked_clients(), 50);
        rl.check(ip("10.1.0.1"), t0 + Duration::from_secs(5));
        assert_eq!(rl.tracked_clients(), 1);
    }

    #[test]
    fn client_is_the_peer_unless_the_peer_is_a_trusted_proxy() {
        let proxies: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        // An untrusted peer's header is ignored.
        assert_eq!(
            client_addr(ip("203.0.113.9"), ["198.51.100.1"], &proxies),
            ip("203.0.113.9")
        );
        // A trusted peer: the rightmost hop that is not a proxy.
        assert_eq!(
            client_addr(
                ip("10.1.1.1"),
                ["198.51.100.7, 203.0.113.5, 10.2.2.2"],
                &proxies
            ),
            ip("203.0.113.5")
        );
        // Malformed header or no header: the peer.
        assert_eq!(
            client_addr(ip("10.1.1.1"), ["nonsense, 1.2.3.4"], &proxies),
            ip("10.1.1.1")
        );
        assert_eq!(client_addr(ip("10.1.1.1"), [], &proxies), ip("10.1.1.1"));
        // Only proxies in the header: the peer.
        assert_eq!(
            client_addr(ip("10.1.1.1"), ["10.3.3.3"], &proxies),
            ip("10.1.1.1")
        );
        // IPv4-mapped IPv6 peers are their IPv4 address.
        assert_eq!(
            client_addr(ip("::ffff:10.1.1.1"), ["192.0.2.4"], &proxies),
            ip("192.0.2.4")
        );
        // No proxies configured: always the peer.
        assert_eq!(
            client_addr(ip("10.1.1.1"), ["192.0.2.4"], &[]),
            ip("10.1.1.1")
        );
    }

    #[test]
    fn every_forwarded_for_line_is_read_as_one_list() {
        let proxies: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        // The proxy appended its own line: the client is the rightmost untrusted hop of all
        // lines, not of the first line only.
        assert_eq!(
            client_addr(
                ip("10.1.1.1"),
                ["192.0.2.99", "198.51.100.3, 10.2.2.2"],
                &proxies
            ),
            ip("198.51.100.3")
        );
        // A forged first line changes nothing when a later line names the real client.
        assert_eq!(
            client_addr(ip("10.1.1.1"), ["203.0.113.1", "198.51.100.3"], &proxies),
            ip("198.51.100.3")
        );
        // A malformed hop in any line: the peer.
        assert_eq!(
            client_addr(ip("10.1.1.1"), ["198.51.100.3", "bogus"], &proxies),
            ip("10.1.1.1")
        );
    }

    #[test]
    fn ipv6_clients_share_a_budget_per_64() {
        assert_eq!(client_key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(client_key(ip("192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(client_key(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
        let mut rl = RateLimiter::new(RateLimit {
            burst: 2,
            refill: Duration::from_secs(60),
        });
        let t0 = Instant::now();
        // Three addresses of one /64 are one client: the third request is refused.
        for (n, a) in ["2001:db8::1", "2001:db8::2:3", "2001:db8::ffff:1"]
            .iter()
            .enumerate()
        {
            let d = rl.check(client_key(ip(a)), t0);
            assert_eq!(d == Decision::Allow, n < 2, "{a}");
        }
        // The next /64 has its own budget.
        assert_eq!(
            rl.check(client_key(ip("2001:db8:0:1::1")), t0),
            Decision::Allow
        );
    }

    #[test]
    fn a_spray_of_addresses_never_grows_the_map_past_its_capacity() {
        let mut rl = RateLimiter::with_capacity(
            RateLimit {
                burst: 1,
                refill: Duration::from_secs(3600),
            },
            1000,
        );
        let t0 = Instant::now();
        let victim = ip("198.51.100.1");
        assert_eq!(rl.check(victim, t0), Decision::Allow);
        for i in 0..50_000u32 {
            let a = IpAddr::from((0x0a00_0000 + i).to_be_bytes());
            // A later instant per address, so "least recently used" is well defined.
            rl.check(a, t0 + Duration::from_millis(u64::from(i) + 1));
            assert!(rl.tracked_clients() <= 1000, "{}", rl.tracked_clients());
        }
        // The victim was the least recently seen: evicted, it starts with a full budget again
        // (the documented price of the cap), and the map is at most the capacity.
        assert!(rl.tracked_clients() > 800);
        // A client seen just now is kept: its budget is still spent.
        let recent = IpAddr::from((0x0a00_0000u32 + 49_999).to_be_bytes());
        assert!(matches!(
            rl.check(recent, t0 + Duration::from_secs(60)),
            Decision::Limited { .. }
        ));
    }

    #[test]
    fn node_ids_are_keys_too() {
        let mut rl: RateLimiter<uuid::Uuid> = RateLimiter::new(RateLimit {
            burst: 1,
            refill: Duration::from_secs(10),
        });
        let t0 = Instant::now();
        let a = uuid::Uuid::from_u128(1);
        assert_eq!(rl.check(a, t0), Decision::Allow);
        assert!(matches!(rl.check(a, t0), Decision::Limited { .. }));
        assert_eq!(rl.check(uuid::Uuid::from_u128(2), t0), Decision::Allow);
    }
}
