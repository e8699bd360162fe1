//! Limits per source network, with time passed in.
//!
//! - [`answer_prefix`]: the network a datagram's answer is charged to, /24 for IPv4 and /48 for
//!   IPv6. A spoofed source can name any address, so what the relay (or the control plane's
//!   STUN responder) sends to strangers is budgeted per victim network, not per address.
//! - [`conn_source`]: the source a TCP connection is counted against, the address for IPv4 and
//!   its /64 for IPv6 (one host usually holds a whole /64).
//! - [`PrefixBuckets`]: one [`TokenBucket`] per prefix, at most `max_prefixes` of them. A
//!   bucket that has refilled completely is the same as a new one, so it is pruned; when the
//!   map is full of busy buckets, every further prefix shares one overflow bucket of the same
//!   rate, so memory stays bounded and answers to sources past the cap stay bounded too.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::bucket::TokenBucket;

/// A network: the family and the first bytes of the address, the rest zeroed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prefix {
    V4([u8; 4]),
    V6([u8; 16]),
}

fn masked(ip: IpAddr, v4_bits: usize, v6_bits: usize) -> Prefix {
    fn keep<const N: usize>(mut b: [u8; N], bits: usize) -> [u8; N] {
        for (i, byte) in b.iter_mut().enumerate() {
            let from = i * 8;
            if from >= bits {
                *byte = 0;
            } else if bits - from < 8 {
                *byte &= 0xFFu8 << (8 - (bits - from));
            }
        }
        b
    }
    match plexsphere_wire::endpoint::canonical_ip(ip) {
        IpAddr::V4(v4) => Prefix::V4(keep(v4.octets(), v4_bits)),
        IpAddr::V6(v6) => Prefix::V6(keep(v6.octets(), v6_bits)),
    }
}

/// The /24 (IPv4) or /48 (IPv6) that answers to `ip` are charged to.
pub fn answer_prefix(ip: IpAddr) -> Prefix {
    masked(ip, 24, 48)
}

/// The address (IPv4) or /64 (IPv6) a TCP connection from `ip` is counted against.
pub fn conn_source(ip: IpAddr) -> Prefix {
    masked(ip, 32, 64)
}

/// How many answers one source prefix gets: `per_sec` a second, `burst` at once, and at most
/// `max_prefixes` buckets kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixLimits {
    pub per_sec: u64,
    pub burst: u64,
    pub max_prefixes: usize,
}

impl PrefixLimits {
    /// Says which knob is out of range, by its flag (`flags`: rate, burst, max prefixes).
    pub fn check(&self, flags: [&str; 3]) -> Result<(), String> {
        let values = [self.per_sec, self.burst, self.max_prefixes as u64];
        match values.iter().zip(flags).find(|(v, _)| **v == 0) {
            Some((_, flag)) => Err(format!("{flag} must be at least 1")),
            None => Ok(()),
        }
    }

    /// How long an untouched bucket takes to be full again (then it is pruned).
    fn idle_after(&self) -> Duration {
        Duration::from_secs_f64(self.burst as f64 / self.per_sec.max(1) as f64)
    }
}

struct Entry {
    bucket: TokenBucket,
    last: Instant,
}

/// One token bucket per source prefix; see the module docs.
pub struct PrefixBuckets {
    limits: PrefixLimits,
    buckets: HashMap<Prefix, Entry>,
    overflow: TokenBucket,
    last_prune: Instant,
}

impl PrefixBuckets {
    pub fn new(limits: PrefixLimits, now: Instant) -> Self {
        Self {
            limits,
            buckets: HashMap::new(),
            overflow: TokenBucket::new(limits.per_sec, limits.burst, now),
            last_prune: now,
        }
    }

    pub fn limits(&self) -> PrefixLimits {
        self.limits
    }

    /// Buckets held now.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Takes one answer from `ip`'s prefix; `false` when it has none left.
    pub fn take(&mut self, ip: IpAddr, now: Instant) -> bool {
        let key = answer_prefix(ip);
        if let Some(e) = self.buckets.get_mut(&key) {
            e.last = e.last.max(now);
            return e.bucket.take(1, now);
        }
        if self.buckets.len() >= self.limits.max_prefixes
            && now.saturating_duration_since(self.last_prune) >= self.limits.idle_after()
        {
            self.prune(now);
        }
        if self.buckets.len() >= self.limits.max_prefixes {
            return self.overflow.take(1, now);
        }
        let mut bucket = TokenBucket::new(self.limits.per_sec, self.limits.burst, now);
        let ok = bucket.take(1, now);
        self.buckets.insert(key, Entry { bucket, last: now });
        ok
    }

    /// Prunes (see [`PrefixBuckets::prune`]) when the last pruning is that long ago: what a
    /// periodic sweep calls, so a full scan runs at most once per refill time.
    pub fn tick(&mut self, now: Instant) {
        if now.saturating_duration_since(self.last_prune) >= self.limits.idle_after() {
            self.prune(now);
        }
    }

    /// Forgets every bucket untouched for long enough to be full again.
    pub fn prune(&mut self, now: Instant) {
        self.last_prune = now;
        let idle = self.limits.idle_after();
        self.buckets
            .retain(|_, e| now.saturating_duration_since(e.last) < idle);
    }
}

#[cfg(test)]
#[path = "prefix_tests.rs"]
mod tests;
