//! How the control plane has answered lately, as `plexd status` shows it and the calls' retry
//! waits on it: whether it is reachable, its last answer and last error, and the backoff of
//! failed calls (the event stream has its own, [`super::stream_state`]).

use std::time::{Duration, Instant};

use crate::backoff::Backoff;

/// The API's health, owned here and changed only through these methods.
#[derive(Debug, Clone)]
pub struct ApiHealth {
    reachable: bool,
    last_ok: Option<Instant>,
    last_error: Option<(Instant, String)>,
    /// The wait before a failed call is tried again.
    backoff: Backoff,
}

impl ApiHealth {
    pub fn new(backoff: Backoff) -> Self {
        Self {
            reachable: false,
            last_ok: None,
            last_error: None,
            backoff,
        }
    }

    /// The control plane answered at `now` (a call, or the event stream connected).
    pub fn answered(&mut self, now: Instant) {
        self.reachable = true;
        self.last_ok = Some(now);
    }

    /// A call succeeded at `now`: the next failure backs off from the start again.
    pub fn call_ok(&mut self, now: Instant) {
        self.answered(now);
        self.backoff.reset();
    }

    /// A call failed (`unreachable`: no answer at all): the wait before it is tried again,
    /// the backoff's next delay (`retry_after` at least; `unit` is the jitter).
    pub fn call_failed(
        &mut self,
        unreachable: bool,
        unit: f64,
        retry_after: Option<Duration>,
    ) -> Duration {
        self.reachable = !unreachable;
        self.backoff.next_delay(unit, retry_after)
    }

    /// What went wrong at `now`, for `plexd status`.
    pub fn error(&mut self, now: Instant, what: String) {
        self.last_error = Some((now, what));
    }

    pub fn reachable(&self) -> bool {
        self.reachable
    }

    pub fn last_ok(&self) -> Option<Instant> {
        self.last_ok
    }

    pub fn last_error(&self) -> Option<&(Instant, String)> {
        self.last_error.as_ref()
    }

    /// Failed calls counted by the backoff since the last success.
    pub fn backoff_attempts(&self) -> u32 {
        self.backoff.attempts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_back_off_and_a_success_starts_over() {
        let t0 = Instant::now();
        let mut h = ApiHealth::new(Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(60),
            Duration::from_secs(30),
        ));
        assert!(!h.reachable() && h.last_ok().is_none() && h.last_error().is_none());
        let first = h.call_failed(true, 1.0, None);
        let second = h.call_failed(false, 1.0, None);
        assert!(second > first, "{first:?} then {second:?}");
        assert!(h.reachable(), "an error answer is an answer");
        assert!(h.call_failed(false, 0.0, Some(Duration::from_secs(9))) >= Duration::from_secs(9));
        h.error(t0, "heartbeat: 503".into());
        assert_eq!(h.last_error(), Some(&(t0, "heartbeat: 503".to_owned())));
        h.call_ok(t0);
        assert_eq!(h.last_ok(), Some(t0));
        assert_eq!(
            h.call_failed(true, 1.0, None),
            first,
            "the backoff started over"
        );
        assert!(!h.reachable());
    }
}
