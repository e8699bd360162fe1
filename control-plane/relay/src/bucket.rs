//! A token bucket with time passed in: `rate` tokens a second, at most `burst` saved up.

use std::time::Instant;

#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket. A `rate` of 0 means no limit.
    pub fn new(rate: u64, burst: u64, now: Instant) -> Self {
        Self {
            rate: rate as f64,
            burst: burst.max(1) as f64,
            tokens: burst.max(1) as f64,
            last: now,
        }
    }

    /// Takes `n` tokens if there are that many; never goes below zero.
    pub fn take(&mut self, n: u64, now: Instant) -> bool {
        if self.rate == 0.0 {
            return true;
        }
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        let n = n as f64;
        if self.tokens >= n {
            self.tokens -= n;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, 5, t0);
        assert_eq!((0..8).filter(|_| b.take(1, t0)).count(), 5);
        // 300 ms later: 3 more tokens.
        let t1 = t0 + Duration::from_millis(300);
        assert_eq!((0..8).filter(|_| b.take(1, t1)).count(), 3);
        // Never more than the burst, however long it rested.
        let t2 = t1 + Duration::from_secs(3600);
        assert_eq!((0..100).filter(|_| b.take(1, t2)).count(), 5);
        // A clock that goes back gives nothing.
        assert!(!b.take(1, t0));
    }

    #[test]
    fn bytes_and_unlimited() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000, 1500, t0);
        assert!(b.take(1452, t0));
        assert!(!b.take(1452, t0));
        let mut free = TokenBucket::new(0, 0, t0);
        assert!((0..10_000).all(|_| free.take(65_535, t0)));
    }
}
