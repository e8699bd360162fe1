//! CoDel (RFC 8289) on the sojourn time of a queue's head, as a pure state machine: the
//! caller passes `now` and the head's sojourn time at every dequeue and drops what it is told.
//!
//! A queue whose head has waited more than [`CODEL_TARGET`] for a whole [`CODEL_INTERVAL`]
//! enters the dropping state: one packet is dropped, then the next ones at `interval /
//! sqrt(count)` apart, until the head's sojourn falls below the target again. A queue that
//! holds less than `min_bytes` is never dropped from (it cannot be the cause of a standing
//! queue). TCP answers a drop by halving its window, so the standing queue a bulk stream
//! builds in front of the tunnel shrinks to about the target.

use std::time::{Duration, Instant};

/// The sojourn time CoDel lets a standing queue keep. The data plane is one hop whose own
/// queue should add little to any round trip: 1 ms is about 400 KB at 3 Gbit/s, enough to keep
/// the cipher busy across a scheduling hiccup (RFC 8289 suggests 5 ms for a WAN link).
pub(crate) const CODEL_TARGET: Duration = Duration::from_millis(1);
/// How long the sojourn must stay above the target before the first drop, and the base of the
/// drop spacing: about the round trip of the flows the tunnel carries (RFC 8289: 100 ms for
/// the Internet; a mesh inside a site or region sees 1-20 ms).
pub(crate) const CODEL_INTERVAL: Duration = Duration::from_millis(20);

/// CoDel's state for one queue; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct Codel {
    target: Duration,
    interval: Duration,
    min_bytes: usize,
    /// When the sojourn went above the target (plus one interval), if it is above now.
    first_above: Option<Instant>,
    dropping: bool,
    drop_next: Option<Instant>,
    count: u32,
    last_count: u32,
    dropped: u64,
}

impl Codel {
    /// CoDel with this target and interval, never dropping while the queue holds less than
    /// `min_bytes`.
    pub(crate) fn new(target: Duration, interval: Duration, min_bytes: usize) -> Self {
        Self {
            target,
            interval,
            min_bytes,
            first_above: None,
            dropping: false,
            drop_next: None,
            count: 0,
            last_count: 0,
            dropped: 0,
        }
    }

    /// Packets this queue was told to drop so far.
    #[cfg(test)]
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// True while the queue is in the dropping state.
    #[cfg(test)]
    pub(crate) fn is_dropping(&self) -> bool {
        self.dropping
    }

    /// One dequeue: the head waited `sojourn`, the queue holds `queue_bytes` (the head
    /// included). Answers whether to drop the head.
    pub(crate) fn should_drop(
        &mut self,
        now: Instant,
        sojourn: Duration,
        queue_bytes: usize,
    ) -> bool {
        let ok_to_drop = self.above_target(now, sojourn, queue_bytes);
        if self.dropping {
            if !ok_to_drop {
                self.dropping = false;
                return false;
            }
            match self.drop_next {
                Some(next) if now >= next => {
                    self.count = self.count.saturating_add(1);
                    self.drop_next = Some(self.control_law(next));
                    self.dropped += 1;
                    true
                }
                _ => false,
            }
        } else if ok_to_drop {
            self.dropping = true;
            // Re-entering soon after the last dropping state: resume near its drop rate.
            let delta = self.count.saturating_sub(self.last_count);
            let recent = self
                .drop_next
                .is_some_and(|next| now.saturating_duration_since(next) < self.interval * 16);
            self.count = if delta > 1 && recent { delta } else { 1 };
            self.last_count = self.count;
            self.drop_next = Some(self.control_law(now));
            self.dropped += 1;
            true
        } else {
            false
        }
    }

    fn above_target(&mut self, now: Instant, sojourn: Duration, queue_bytes: usize) -> bool {
        if sojourn < self.target || queue_bytes <= self.min_bytes {
            self.first_above = None;
            return false;
        }
        match self.first_above {
            None => {
                self.first_above = Some(now + self.interval);
                false
            }
            Some(at) => now >= at,
        }
    }

    /// The next drop: `interval / sqrt(count)` after `t`.
    fn control_law(&self, t: Instant) -> Instant {
        let sqrt = f64::from(self.count.max(1)).sqrt();
        t + self.interval.div_f64(sqrt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn codel() -> Codel {
        Codel::new(CODEL_TARGET, CODEL_INTERVAL, 1500)
    }

    #[test]
    fn a_short_queue_or_a_brief_burst_is_never_dropped_from() {
        let mut c = codel();
        let t0 = Instant::now();
        // Above the target, but for less than an interval each time.
        for i in 0..100u32 {
            let now = t0 + MS * i;
            let sojourn = if i % 10 < 9 { 5 * MS } else { Duration::ZERO };
            assert!(!c.should_drop(now, sojourn, 1 << 20), "dropped at {i} ms");
        }
        // A long wait, but the queue holds less than one packet's worth.
        for i in 100..200u32 {
            assert!(!c.should_drop(t0 + MS * i, 50 * MS, 1000));
        }
        assert_eq!(c.dropped(), 0);
    }

    #[test]
    fn a_standing_queue_is_dropped_from_at_a_rising_rate_until_it_drains() {
        let mut c = codel();
        let t0 = Instant::now();
        let mut drops = Vec::new();
        // One dequeue every 100 µs with a head that waited 3 ms, for 200 ms.
        for i in 0..2000u32 {
            let now = t0 + Duration::from_micros(100) * i;
            if c.should_drop(now, 3 * MS, 1 << 20) {
                drops.push(now - t0);
            }
        }
        assert!(c.is_dropping());
        // The first drop after one interval above the target, not before.
        assert!(
            drops[0] >= CODEL_INTERVAL && drops[0] < CODEL_INTERVAL + MS,
            "{drops:?}"
        );
        // Then interval/sqrt(n) apart: the gaps shrink.
        let gaps: Vec<Duration> = drops.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.len() > 5, "{drops:?}");
        assert!(gaps[0] > *gaps.last().expect("as built"), "{gaps:?}");
        assert!(gaps[0] <= CODEL_INTERVAL + MS, "{gaps:?}");
        // Drained: the state ends at the first dequeue below the target.
        let later = t0 + Duration::from_millis(300);
        assert!(!c.should_drop(later, Duration::ZERO, 1 << 20));
        assert!(!c.is_dropping());
        assert_eq!(c.dropped(), drops.len() as u64);
    }
}
