//! Bounded waits on observable conditions. Nothing in this crate sleeps for a fixed time in
//! place of a condition: it polls the condition at an interval until it holds or a deadline
//! passes.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// For conditions that change within milliseconds (a process exiting).
pub(crate) const POLL_FAST: Duration = Duration::from_millis(20);
/// For conditions that cost a process to check (a command inside a machine).
pub(crate) const POLL_SLOW: Duration = Duration::from_millis(500);

/// Calls `check` until it answers `Some`, an error, or `timeout` has passed.
pub(crate) fn poll_until<T>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    hint: &'static str,
    mut check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check()? {
            return Ok(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout {
                what: what.to_string(),
                after: timeout,
                hint,
            });
        }
        std::thread::sleep(interval.min(deadline - now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_when_the_condition_holds() {
        let mut calls = 0;
        let v = poll_until(
            "counting",
            Duration::from_secs(5),
            Duration::from_millis(1),
            "",
            || {
                calls += 1;
                Ok((calls == 3).then_some(calls))
            },
        )
        .unwrap();
        assert_eq!(v, 3);
    }

    #[test]
    fn times_out_with_the_hint() {
        let err = poll_until::<()>(
            "waiting for Godot",
            Duration::from_millis(30),
            Duration::from_millis(5),
            "stop waiting",
            || Ok(None),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "waiting for Godot did not finish within 30ms; stop waiting"
        );
    }

    #[test]
    fn passes_errors_through() {
        let err = poll_until::<()>(
            "x",
            Duration::from_secs(5),
            Duration::from_millis(1),
            "",
            || Err(Error::NotRoot),
        )
        .unwrap_err();
        assert!(matches!(err, Error::NotRoot));
    }
}
