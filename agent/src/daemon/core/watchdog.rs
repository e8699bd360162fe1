//! The systemd watchdog, fed only while the whole daemon works: the loop runs (it is the one
//! sending `WATCHDOG=1`) and the mesh answers. A mesh job unanswered for longer than
//! [`MESH_ANSWER_BOUND`] (a wedged interface, a stuck worker thread) withholds `WATCHDOG=1`,
//! so systemd restarts plexd after `WatchdogSec` (60 s in the unit). Every watchdog turn asks
//! the mesh a cheap question (a live-peer read) when nothing else is outstanding, so an idle
//! daemon proves its mesh too.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::io::MeshJobId;

/// How long the mesh may take to answer a job before the watchdog is withheld. Longer than
/// the WireGuard worker's own bound on one call (15 s), shorter than `WatchdogSec` (60 s).
pub const MESH_ANSWER_BOUND: Duration = Duration::from_secs(20);

#[derive(Debug, Clone)]
pub struct Watchdog {
    /// Every how long, and when next; `None` when systemd did not ask for a watchdog.
    turn: Option<(Duration, Instant)>,
    asked: BTreeMap<MeshJobId, Instant>,
}

impl Watchdog {
    pub fn new(interval: Option<Duration>, now: Instant) -> Self {
        Self {
            turn: interval.map(|i| (i, now)),
            asked: BTreeMap::new(),
        }
    }

    /// When the next turn is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.turn.map(|(_, at)| at)
    }

    /// Whether a turn is due at `now`; if so, the next one is scheduled.
    pub fn due(&mut self, now: Instant) -> bool {
        match &mut self.turn {
            Some((interval, at)) if *at <= now => {
                *at = now + *interval;
                true
            }
            _ => false,
        }
    }

    pub fn asked(&mut self, id: MeshJobId, now: Instant) {
        self.asked.insert(id, now);
    }

    pub fn answered(&mut self, id: MeshJobId) {
        self.asked.remove(&id);
    }

    /// How long the oldest unanswered mesh job has waited, when that is too long.
    pub fn mesh_stuck(&self, now: Instant) -> Option<Duration> {
        let oldest = self.asked.values().min()?;
        let age = now.saturating_duration_since(*oldest);
        (age > MESH_ANSWER_BOUND).then_some(age)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_is_due_each_interval_and_a_slow_mesh_is_stuck() {
        let t0 = Instant::now();
        let mut w = Watchdog::new(Some(Duration::from_secs(30)), t0);
        assert!(w.due(t0));
        assert!(!w.due(t0 + Duration::from_secs(29)));
        assert_eq!(w.next_due(), Some(t0 + Duration::from_secs(30)));
        assert!(w.due(t0 + Duration::from_secs(30)));
        w.asked(1, t0);
        assert_eq!(w.mesh_stuck(t0 + MESH_ANSWER_BOUND), None);
        assert_eq!(
            w.mesh_stuck(t0 + Duration::from_secs(21)),
            Some(Duration::from_secs(21))
        );
        w.answered(1);
        assert_eq!(w.mesh_stuck(t0 + Duration::from_secs(99)), None);
        let mut off = Watchdog::new(None, t0);
        assert!(!off.due(t0) && off.next_due().is_none());
    }
}
