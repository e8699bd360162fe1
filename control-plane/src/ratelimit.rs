//! Per-client token buckets for the auth surface, and the rule that names the client.
//!
//! Pure logic: time comes in as `now: Instant`, nothing here sleeps or reads a clock, so the
//! tests step time by hand. The HTTP layer owns one [`RateLimiter`] behind a mutex.

use std::collections::HashMap;
use std::net::IpAddr;
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

/// Token buckets keyed by client address.
#[derive(Debug)]
pub struct RateLimiter {
    limit: RateLimit,
    buckets: HashMap<IpAddr, Bucket>,
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
    pub fn retry_after_secs(retry_after: Duration) -> u64 {
        let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        secs.max(1)
    }
}

impl RateLimiter {
    pub fn new(limit: RateLimit) -> Self {
        Self {
            limit,
            buckets: HashMap::new(),
            last_prune: None,
        }
    }

    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    /// Takes one token from `client`'s bucket, if it has one.
    pub fn check(&mut self, client: IpAddr, now: Instant) -> Decision {
        self.prune(now);
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

    /// How many clients have a bucket (for tests and metrics).
    pub fn tracked_clients(&self) -> usize {
        self.buckets.len()
    }
}

/// The client a request comes from: the socket peer, unless the peer is a trusted proxy;
/// then the rightmost `X-Forwarded-For` hop that is not itself a trusted proxy. A malformed
/// header, or one made only of trusted proxies, falls back to the peer.
pub fn client_addr(peer: IpAddr, forwarded_for: Option<&str>, trusted_proxies: &[IpNet]) -> IpAddr {
    let peer = canonical(peer);
    let trusted = |ip: &IpAddr| trusted_proxies.iter().any(|net| net.contains(ip));
    if !trusted(&peer) {
        return peer;
    }
    let Some(header) = forwarded_for else {
        return peer;
    };
    let mut hops = Vec::new();
    for part in header.split(',') {
        match part.trim().parse::<IpAddr>() {
            Ok(ip) => hops.push(canonical(ip)),
            Err(_) => return peer,
        }
    }
    hops.into_iter()
        .rev()
        .find(|ip| !trusted(ip))
        .unwrap_or(peer)
}

/// `::ffff:a.b.c.d` is the IPv4 client it carries.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
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
            client_addr(ip("203.0.113.9"), Some("198.51.100.1"), &proxies),
            ip("203.0.113.9")
        );
        // A trusted peer: the rightmost hop that is not a proxy.
        assert_eq!(
            client_addr(
                ip("10.1.1.1"),
                Some("198.51.100.7, 203.0.113.5, 10.2.2.2"),
                &proxies
            ),
            ip("203.0.113.5")
        );
        // Malformed header or no header: the peer.
        assert_eq!(
            client_addr(ip("10.1.1.1"), Some("nonsense, 1.2.3.4"), &proxies),
            ip("10.1.1.1")
        );
        assert_eq!(client_addr(ip("10.1.1.1"), None, &proxies), ip("10.1.1.1"));
        // Only proxies in the header: the peer.
        assert_eq!(
            client_addr(ip("10.1.1.1"), Some("10.3.3.3"), &proxies),
            ip("10.1.1.1")
        );
        // IPv4-mapped IPv6 peers are their IPv4 address.
        assert_eq!(
            client_addr(ip("::ffff:10.1.1.1"), Some("192.0.2.4"), &proxies),
            ip("192.0.2.4")
        );
        // No proxies configured: always the peer.
        assert_eq!(
            client_addr(ip("10.1.1.1"), Some("192.0.2.4"), &[]),
            ip("10.1.1.1")
        );
    }
}
