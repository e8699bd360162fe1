//! Reconnect and retry delays: exponential backoff with full jitter and a cap, reset after a
//! healthy connection, honouring the server's `Retry-After`. Pure: jitter and durations are
//! parameters, so tests step through it without sleeping.

use std::time::Duration;

/// The longest `Retry-After` plexd honours; a larger value is treated as this.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The ceiling of the delay after `attempt` earlier failures: `initial * 2^attempt`, at most
/// `cap`. Full jitter picks anywhere below it.
pub(crate) fn ceiling(initial: Duration, cap: Duration, attempt: u32) -> Duration {
    let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
    initial.saturating_mul(factor).min(cap)
}

#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    initial: Duration,
    cap: Duration,
    /// A connection that stayed up this long resets the backoff.
    healthy_after: Duration,
    /// Failures since the last reset.
    attempt: u32,
}

impl Backoff {
    pub fn new(initial: Duration, cap: Duration, healthy_after: Duration) -> Self {
        Self {
            initial,
            cap: cap.max(initial),
            healthy_after,
            attempt: 0,
        }
    }

    /// The ceiling of the next delay: `initial * 2^attempt`, at most `cap`.
    pub(crate) fn ceiling(&self) -> Duration {
        ceiling(self.initial, self.cap, self.attempt)
    }

    /// The delay before the next attempt after a failure, and counts the failure.
    /// `unit` is a uniform sample in `[0, 1)` (full jitter: anywhere from 0 to the ceiling);
    /// a `Retry-After` from the server is a floor.
    pub(crate) fn next_delay(&mut self, unit: f64, retry_after: Option<Duration>) -> Duration {
        let jittered = self.ceiling().mul_f64(unit.clamp(0.0, 1.0));
        self.attempt = self.attempt.saturating_add(1);
        match retry_after {
            Some(ra) => jittered.max(ra.min(MAX_RETRY_AFTER)),
            None => jittered,
        }
    }

    /// A connection ended after being up for `up`: a healthy one resets the backoff.
    pub(crate) fn connection_lasted(&mut self, up: Duration) {
        if up >= self.healthy_after {
            self.reset();
        }
    }

    /// A call succeeded: start from the initial delay again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// The failures since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }
}

/// A delay as the log shows it: `0.4`, `12.0`.
pub(crate) fn secs_text(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b() -> Backoff {
        Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(60),
            Duration::from_secs(30),
        )
    }

    #[test]
    fn ceiling_doubles_up_to_the_cap() {
        let mut b = b();
        let mut ceilings = vec![];
        for _ in 0..9 {
            ceilings.push(b.ceiling().as_secs());
            b.next_delay(0.5, None);
        }
        assert_eq!(ceilings, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
        for _ in 0..100 {
            b.next_delay(0.5, None);
        }
        assert_eq!(b.ceiling(), Duration::from_secs(60), "no overflow");
    }

    #[test]
    fn full_jitter_spans_zero_to_the_ceiling() {
        let mut lo = b();
        assert_eq!(lo.next_delay(0.0, None), Duration::ZERO);
        let mut hi = b();
        hi.next_delay(0.0, None);
        hi.next_delay(0.0, None);
        // third attempt: ceiling 4 s
        assert_eq!(hi.next_delay(0.999, None).as_millis(), 3996);
        let mut clamp = b();
        assert_eq!(clamp.next_delay(7.0, None), Duration::from_secs(1));
    }

    #[test]
    fn retry_after_is_a_floor_and_bounded() {
        let mut b = b();
        assert_eq!(
            b.next_delay(0.1, Some(Duration::from_secs(5))),
            Duration::from_secs(5)
        );
        assert_eq!(
            b.next_delay(0.1, Some(Duration::from_secs(86_400))),
            MAX_RETRY_AFTER
        );
        let mut big = Backoff::new(
            Duration::from_secs(10),
            Duration::from_secs(60),
            Duration::from_secs(30),
        );
        // the jittered delay wins over a smaller Retry-After
        assert_eq!(
            big.next_delay(0.9, Some(Duration::from_secs(1))),
            Duration::from_secs(9)
        );
    }

    #[test]
    fn healthy_connection_resets_short_one_does_not() {
        let mut b = b();
        for _ in 0..4 {
            b.next_delay(0.5, None);
        }
        b.connection_lasted(Duration::from_secs(29));
        assert_eq!(b.ceiling(), Duration::from_secs(16));
        b.connection_lasted(Duration::from_secs(30));
        assert_eq!(b.ceiling(), Duration::from_secs(1));
        assert_eq!(b.attempts(), 0);
    }

    #[test]
    fn delay_text() {
        assert_eq!(secs_text(Duration::from_millis(400)), "0.4");
        assert_eq!(secs_text(Duration::from_secs(12)), "12.0");
    }
}
