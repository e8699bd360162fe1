//! What two or more test crates of the workspace wrote each, written once (issue 30). A
//! dev-dependency only: nothing here ships.
//!
//! - [`metrics`]: one gauge as a replica's `GET /metrics` reports it (the HA and lease tests).
//! - [`machines`]: the machine tests' guards (a bridge removed on drop, a booted machine
//!   destroyed on drop, the machines and bridge a test or a control plane left behind) and
//!   their root preflight.
//! - [`seeded`]: a random source from a seed, and one that always fails (plexd's reach tests and
//!   the data plane's protocol tests).
//! - [`eventually`]: poll a condition within a bound; [`is_root`]: whether the tests run as root.

pub mod machines;
pub mod metrics;
pub mod seeded;

use std::time::{Duration, Instant};

/// Whether this process runs as root: its effective uid (the third field of `Uid:` in
/// `/proc/self/status`) is 0. False when the file cannot be read.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// How often [`eventually`] asks again.
pub const POLL: Duration = Duration::from_millis(100);

/// Polls `check` every [`POLL`] until it holds or `timeout` passes; answers whether it held.
/// `check` runs at least once, and once more at or after the deadline.
pub fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventually_answers_true_once_the_check_holds() {
        let mut calls = 0;
        assert!(eventually(Duration::from_secs(30), || {
            calls += 1;
            calls == 3
        }));
        assert_eq!(calls, 3, "it stops asking once the check holds");
    }

    #[test]
    fn is_root_agrees_with_the_kernel() {
        // /proc/self/status says what geteuid says; the tests here run as root in CI.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert_eq!(
            is_root(),
            uid.split_whitespace().nth(2) == Some("0"),
            "{uid}"
        );
        assert!(
            is_root(),
            "the test-support tests run as root (the bridge guards need it)"
        );
    }

    #[test]
    fn eventually_answers_false_when_the_check_never_holds() {
        let mut calls = 0;
        assert!(!eventually(Duration::ZERO, || {
            calls += 1;
            false
        }));
        assert_eq!(calls, 1, "a zero timeout still asks once");
    }
}
