//! The time a sans-IO machine is handed with each input: one type for every machine of the
//! project (the agent's daemon core and reach engine, the relay's core), so tests step time the
//! same way everywhere and no machine reads a clock itself.
//!
//! `at` is the monotonic clock, for deadlines, ages, leases and budgets; `wall` is the wall
//! clock, for what is reported or signed (handshake times, token expiries, cookies, counters
//! that grow across restarts). Only the shells that feed a machine call [`Now::system`].

use std::time::{Duration, Instant, SystemTime};

/// The two clocks an input arrives with. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// The monotonic clock: deadlines, ages, leases, budgets.
    pub at: Instant,
    /// The wall clock: what is reported, signed or compared with another host's time.
    pub wall: SystemTime,
}

impl Now {
    pub fn new(at: Instant, wall: SystemTime) -> Self {
        Self { at, wall }
    }

    /// Both clocks read now: for the shells that feed a machine, never inside one.
    pub fn system() -> Self {
        Self::new(Instant::now(), SystemTime::now())
    }

    /// `d` later on both clocks (tests step time with it).
    pub fn plus(self, d: Duration) -> Self {
        Self {
            at: self.at + d,
            wall: self.wall + d,
        }
    }

    /// The wall time at `at` as this reading projects it: `wall` plus the monotonic time since
    /// `at` (an `at` before this reading counts as the reading itself). `None` past the end of
    /// `SystemTime`.
    pub fn wall_at(self, at: Instant) -> Option<SystemTime> {
        self.wall.checked_add(at.saturating_duration_since(self.at))
    }

    /// Unix seconds of the wall clock, signed as tokens carry them; 0 before 1970.
    pub fn unix(self) -> i64 {
        i64::try_from(self.unix_secs()).unwrap_or(i64::MAX)
    }

    /// Unix seconds of the wall clock, unsigned; 0 before 1970.
    pub fn unix_secs(self) -> u64 {
        self.wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plus_steps_both_clocks_and_unix_reads_the_wall_clock() {
        let t0 = Now::new(
            Instant::now(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        );
        let t1 = t0.plus(Duration::from_secs(5));
        assert_eq!(t1.at - t0.at, Duration::from_secs(5));
        assert_eq!(t1.unix(), 1_800_000_005);
        assert_eq!(t1.unix_secs(), 1_800_000_005);
    }

    #[test]
    fn wall_at_projects_the_reading_forward_and_never_back() {
        let t0 = Now::new(
            Instant::now(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        );
        let later = t0.at + Duration::from_secs(3);
        assert_eq!(t0.wall_at(later), Some(t0.wall + Duration::from_secs(3)));
        assert_eq!(
            t0.plus(Duration::from_secs(5)).wall_at(later),
            Some(t0.wall + Duration::from_secs(5))
        );
    }

    #[test]
    fn a_wall_clock_before_1970_reads_as_zero() {
        let before = Now::new(
            Instant::now(),
            SystemTime::UNIX_EPOCH - Duration::from_secs(1),
        );
        assert_eq!(before.unix(), 0);
        assert_eq!(before.unix_secs(), 0);
    }
}
