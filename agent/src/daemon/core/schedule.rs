//! When each periodic task is due: the server's intervals (registration, then each
//! `HeartbeatAck`), a local floor, and ±10% jitter so a fleet does not call in lockstep.
//! Pure: `now` and the jitter samples are parameters.

use std::time::{Duration, Instant};

use plexsphere_wire::Intervals;

/// The periodic tasks of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Task {
    Heartbeat,
    EndpointReport,
    StatePoll,
    IngestFlush,
}

impl Task {
    pub const ALL: [Task; 4] = [
        Task::Heartbeat,
        Task::EndpointReport,
        Task::StatePoll,
        Task::IngestFlush,
    ];

    fn index(self) -> usize {
        match self {
            Task::Heartbeat => 0,
            Task::EndpointReport => 1,
            Task::StatePoll => 2,
            Task::IngestFlush => 3,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Task::Heartbeat => "heartbeat",
            Task::EndpointReport => "endpoint report",
            Task::StatePoll => "state pull",
            Task::IngestFlush => "ingest",
        }
    }
}

/// `interval` scaled by a factor in `[0.9, 1.1)` from a uniform sample in `[0, 1)`.
pub fn jittered(interval: Duration, unit: f64) -> Duration {
    interval.mul_f64(0.9 + 0.2 * unit.clamp(0.0, 1.0))
}

#[derive(Debug, Clone)]
pub struct Schedule {
    intervals: Intervals,
    floor: Duration,
    /// When each task is next due; `None` while it is running (not due again until done).
    due: [Option<Instant>; 4],
}

impl Schedule {
    /// Heartbeat, endpoint report and state pull are due at once; the ingest flush after one
    /// interval.
    pub fn new(intervals: Intervals, floor: Duration, now: Instant) -> Self {
        let mut s = Self {
            intervals,
            floor,
            due: [Some(now); 4],
        };
        s.due[Task::IngestFlush.index()] = Some(now + s.interval(Task::IngestFlush));
        s
    }

    /// The task's interval: the server's value, at least the floor.
    pub fn interval(&self, task: Task) -> Duration {
        let secs = match task {
            Task::Heartbeat => self.intervals.heartbeat_secs,
            Task::EndpointReport => self.intervals.endpoint_report_secs,
            Task::StatePoll => self.intervals.state_poll_secs,
            Task::IngestFlush => self.intervals.ingest_secs,
        };
        Duration::from_secs(u64::from(secs)).max(self.floor)
    }

    /// The shortest interval of any task (`daemon.min_interval_secs`).
    pub fn floor(&self) -> Duration {
        self.floor
    }

    pub fn intervals(&self) -> Intervals {
        self.intervals
    }

    /// The earliest instant any idle task is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.iter().flatten().min().copied()
    }

    /// Tasks due at `now`, marked as running (not due again until `done`/`failed`).
    pub fn take_due(&mut self, now: Instant) -> Vec<Task> {
        let mut out = vec![];
        for task in Task::ALL {
            let slot = &mut self.due[task.index()];
            if slot.is_some_and(|at| at <= now) {
                *slot = None;
                out.push(task);
            }
        }
        out
    }

    /// The task finished well: due again after its jittered interval.
    pub fn done(&mut self, task: Task, now: Instant, unit: f64) {
        self.due[task.index()] = Some(now + jittered(self.interval(task), unit));
    }

    /// The task failed: due again after `retry` (from the backoff), but never later than
    /// its normal interval.
    pub fn failed(&mut self, task: Task, now: Instant, retry: Duration, unit: f64) {
        let normal = jittered(self.interval(task), unit);
        self.due[task.index()] = Some(now + retry.min(normal));
    }

    /// Asks for a task as soon as possible (a state pull after a resync); a running task is
    /// left alone and runs again at its next turn.
    pub fn run_soon(&mut self, task: Task, now: Instant) {
        if let Some(at) = &mut self.due[task.index()] {
            *at = (*at).min(now);
        }
    }

    /// New intervals from the server: a task due later than its new interval allows is
    /// brought forward.
    pub fn set_intervals(&mut self, intervals: Intervals, now: Instant, unit: f64) {
        if intervals == self.intervals {
            return;
        }
        self.intervals = intervals;
        for task in Task::ALL {
            let bound = now + jittered(self.interval(task), unit);
            if let Some(at) = &mut self.due[task.index()] {
                *at = (*at).min(bound);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(hb: u32, ep: u32, st: u32, ing: u32) -> Intervals {
        Intervals {
            heartbeat_secs: hb,
            endpoint_report_secs: ep,
            state_poll_secs: st,
            ingest_secs: ing,
        }
    }

    #[test]
    fn jitter_is_plus_minus_ten_percent() {
        let i = Duration::from_secs(100);
        assert_eq!(jittered(i, 0.0), Duration::from_secs(90));
        assert_eq!(jittered(i, 0.5), Duration::from_secs(100));
        assert!(jittered(i, 0.999_999) < Duration::from_secs(110));
        assert!(jittered(i, 0.999_999) > Duration::from_secs(109));
        assert_eq!(jittered(i, 5.0), Duration::from_secs(110));
    }

    #[test]
    fn first_round_is_due_at_once_except_ingest() {
        let t0 = Instant::now();
        let mut s = Schedule::new(iv(30, 60, 300, 60), Duration::from_secs(1), t0);
        assert_eq!(s.next_due(), Some(t0));
        assert_eq!(
            s.take_due(t0),
            vec![Task::Heartbeat, Task::EndpointReport, Task::StatePoll]
        );
        // running tasks are not due again
        assert!(s.take_due(t0 + Duration::from_secs(59)).is_empty());
        assert_eq!(s.next_due(), Some(t0 + Duration::from_secs(60)));
        assert_eq!(
            s.take_due(t0 + Duration::from_secs(60)),
            vec![Task::IngestFlush]
        );
    }

    #[test]
    fn done_reschedules_with_jitter_and_failed_retries_sooner() {
        let t0 = Instant::now();
        let mut s = Schedule::new(iv(30, 60, 300, 60), Duration::from_secs(1), t0);
        s.take_due(t0);
        s.done(Task::Heartbeat, t0, 0.0);
        s.failed(Task::StatePoll, t0, Duration::from_secs(2), 0.5);
        s.failed(Task::EndpointReport, t0, Duration::from_secs(600), 0.5);
        assert_eq!(s.next_due(), Some(t0 + Duration::from_secs(2)));
        assert_eq!(
            s.take_due(t0 + Duration::from_secs(2)),
            vec![Task::StatePoll]
        );
        assert_eq!(
            s.take_due(t0 + Duration::from_secs(27)),
            vec![Task::Heartbeat],
            "30 s - 10%"
        );
        // a retry never waits longer than the normal interval (60 s)
        assert_eq!(
            s.take_due(t0 + Duration::from_secs(60)),
            vec![Task::EndpointReport, Task::IngestFlush]
        );
    }

    #[test]
    fn floor_guards_against_zero_intervals() {
        let t0 = Instant::now();
        let s = Schedule::new(iv(0, 0, 0, 0), Duration::from_secs(1), t0);
        assert_eq!(s.interval(Task::Heartbeat), Duration::from_secs(1));
    }

    #[test]
    fn shorter_server_intervals_bring_tasks_forward() {
        let t0 = Instant::now();
        let mut s = Schedule::new(iv(30, 60, 300, 60), Duration::from_secs(1), t0);
        s.take_due(t0);
        s.done(Task::StatePoll, t0, 0.5);
        s.done(Task::Heartbeat, t0, 0.5);
        s.set_intervals(iv(30, 60, 10, 60), t0, 0.5);
        assert_eq!(s.interval(Task::StatePoll), Duration::from_secs(10));
        assert_eq!(
            s.take_due(t0 + Duration::from_secs(10)),
            vec![Task::StatePoll]
        );
    }

    #[test]
    fn run_soon_only_moves_idle_tasks() {
        let t0 = Instant::now();
        let mut s = Schedule::new(iv(30, 60, 300, 60), Duration::from_secs(1), t0);
        s.take_due(t0);
        s.run_soon(Task::StatePoll, t0);
        assert!(!s.take_due(t0).contains(&Task::StatePoll), "still running");
        s.done(Task::StatePoll, t0, 0.5);
        let t1 = t0 + Duration::from_secs(5);
        s.run_soon(Task::StatePoll, t1);
        assert_eq!(s.take_due(t1), vec![Task::StatePoll]);
    }
}
