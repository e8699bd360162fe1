//! The query rate limit and the rate-limited log lines of the resolver's drops (pure: the
//! time is passed in).

use std::time::{Duration, Instant};

/// A token bucket: `rate` tokens a second, at most `rate` saved up.
#[derive(Debug, Clone)]
pub struct RateLimit {
    rate: u32,
    tokens: f64,
    last: Option<Instant>,
}

impl RateLimit {
    pub fn new(rate: u32) -> Self {
        RateLimit {
            rate,
            tokens: f64::from(rate),
            last: None,
        }
    }

    /// Whether one more query may be answered at `now` (and takes its token).
    pub fn allow(&mut self, now: Instant) -> bool {
        let rate = f64::from(self.rate);
        if let Some(last) = self.last {
            let elapsed = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * rate).min(rate);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Why a query got no answer, each counted and logged on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Discard {
    /// The source is not this host (a peer or anyone else reaching the mesh address).
    Foreign,
    /// Over [`super::MAX_QUERIES_PER_SEC`].
    Rate,
    /// Larger than [`super::MAX_QUERY_BYTES`].
    Size,
    /// Past [`super::MAX_TCP_CONNECTIONS`].
    Connections,
    /// Not a query plexd answers at all (an answer, a runt).
    Unanswerable,
}

impl Discard {
    pub const ALL: [Discard; 5] = [
        Discard::Foreign,
        Discard::Rate,
        Discard::Size,
        Discard::Connections,
        Discard::Unanswerable,
    ];

    fn index(self) -> usize {
        self as usize
    }

    pub fn describe(self) -> &'static str {
        match self {
            Discard::Foreign => {
                "queries from sources other than this host (the resolver answers only this host's own queries)"
            }
            Discard::Rate => "queries over the rate limit",
            Discard::Size => "queries over the size limit",
            Discard::Connections => "TCP connections over the connection limit",
            Discard::Unanswerable => "messages that were no queries (answers or runts)",
        }
    }
}

/// Counts every drop and says when a log line is due (at most one per kind per `every`).
#[derive(Debug, Clone)]
pub(crate) struct Discards {
    every: Duration,
    counts: [u64; 5],
    logged_at: [Option<Instant>; 5],
    since_log: [u64; 5],
}

impl Discards {
    pub fn new(every: Duration) -> Self {
        Discards {
            every,
            counts: [0; 5],
            logged_at: [None; 5],
            since_log: [0; 5],
        }
    }

    /// Counts one drop at `now`; `Some(n)` when a log line is due, naming the `n` drops of
    /// this kind since the last line.
    pub fn count(&mut self, kind: Discard, now: Instant) -> Option<u64> {
        let i = kind.index();
        self.counts[i] += 1;
        self.since_log[i] += 1;
        let due = self.logged_at[i].is_none_or(|t| now.saturating_duration_since(t) >= self.every);
        if !due {
            return None;
        }
        self.logged_at[i] = Some(now);
        Some(std::mem::take(&mut self.since_log[i]))
    }

    /// Every drop of `kind` so far.
    pub fn total(&self, kind: Discard) -> u64 {
        self.counts[kind.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_refills_with_time_and_caps_the_burst() {
        let t0 = Instant::now();
        let mut r = RateLimit::new(3);
        assert!((0..3).all(|_| r.allow(t0)));
        assert!(!r.allow(t0));
        assert!(r.allow(t0 + Duration::from_millis(400)));
        assert!(!r.allow(t0 + Duration::from_millis(400)));
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..10).filter(|_| r.allow(later)).count(), 3);
    }

    #[test]
    fn drops_are_counted_and_logged_once_per_interval() {
        let t0 = Instant::now();
        let mut d = Discards::new(Duration::from_secs(10));
        assert_eq!(d.count(Discard::Foreign, t0), Some(1));
        assert_eq!(d.count(Discard::Foreign, t0 + Duration::from_secs(1)), None);
        assert_eq!(d.count(Discard::Foreign, t0 + Duration::from_secs(2)), None);
        assert_eq!(d.count(Discard::Rate, t0), Some(1));
        assert_eq!(
            d.count(Discard::Foreign, t0 + Duration::from_secs(10)),
            Some(3)
        );
        assert_eq!(d.total(Discard::Foreign), 4);
    }
}
