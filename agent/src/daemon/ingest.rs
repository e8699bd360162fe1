//! The observations waiting for `POST /v1/nodes/{id}/ingest`: a bounded queue that drops the
//! oldest first while the API is away and counts what it dropped (sent as
//! `IngestBatch.dropped`). One batch is in flight at a time.

use std::collections::VecDeque;

use plexsphere_wire::node::{IngestBatch, Observation};

/// The most observations one batch carries.
pub const MAX_BATCH: usize = 256;

#[derive(Debug)]
pub struct IngestQueue {
    queue: VecDeque<Observation>,
    capacity: usize,
    /// Dropped since the last batch that was accepted.
    dropped: u64,
    /// The batch being sent, kept until it is acknowledged or put back.
    in_flight: Option<IngestBatch>,
}

impl IngestQueue {
    pub fn new(capacity: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            capacity: capacity.max(1),
            dropped: 0,
            in_flight: None,
        }
    }

    /// Adds an observation, dropping the oldest when full.
    pub fn push(&mut self, obs: Observation) {
        if self.queue.len() + self.in_flight_len() >= self.capacity {
            if self.queue.pop_front().is_some() {
                self.dropped += 1;
            } else {
                // The in-flight batch fills the queue: the new observation is the one dropped.
                self.dropped += 1;
                return;
            }
        }
        self.queue.push_back(obs);
    }

    fn in_flight_len(&self) -> usize {
        self.in_flight.as_ref().map_or(0, |b| b.observations.len())
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The next batch to send (oldest first), or `None` when there is nothing to say or a
    /// batch is still in flight.
    pub fn take_batch(&mut self) -> Option<IngestBatch> {
        if self.in_flight.is_some() || (self.queue.is_empty() && self.dropped == 0) {
            return None;
        }
        let n = self.queue.len().min(MAX_BATCH);
        let batch = IngestBatch {
            observations: self.queue.drain(..n).collect(),
            dropped: self.dropped,
        };
        self.in_flight = Some(batch.clone());
        Some(batch)
    }

    /// The server accepted the in-flight batch: its `dropped` count was reported.
    pub fn acknowledge(&mut self) {
        if let Some(b) = self.in_flight.take() {
            self.dropped = self.dropped.saturating_sub(b.dropped);
        }
    }

    /// The batch could not be sent: its observations go back to the front (oldest first),
    /// dropping the oldest of them if newer ones filled the queue meanwhile.
    pub fn put_back(&mut self) {
        let Some(b) = self.in_flight.take() else {
            return;
        };
        for obs in b.observations.into_iter().rev() {
            if self.queue.len() >= self.capacity {
                self.dropped += 1;
            } else {
                self.queue.push_front(obs);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use plexsphere_wire::node::ObservationKind;

    use super::*;

    fn obs(at: i64) -> Observation {
        Observation {
            at,
            kind: ObservationKind::Error {
                message: format!("e{at}"),
            },
        }
    }

    fn ats(b: &IngestBatch) -> Vec<i64> {
        b.observations.iter().map(|o| o.at).collect()
    }

    #[test]
    fn drops_oldest_first_and_reports_the_count() {
        let mut q = IngestQueue::new(3);
        for at in 1..=5 {
            q.push(obs(at));
        }
        assert_eq!(q.len(), 3);
        assert_eq!(q.dropped(), 2);
        let b = q.take_batch().unwrap();
        assert_eq!(ats(&b), vec![3, 4, 5]);
        assert_eq!(b.dropped, 2);
        assert!(q.take_batch().is_none(), "one batch in flight");
        q.acknowledge();
        assert_eq!(q.dropped(), 0);
        assert!(q.take_batch().is_none(), "nothing left to say");
    }

    #[test]
    fn a_failed_batch_goes_back_in_order() {
        let mut q = IngestQueue::new(4);
        for at in 1..=3 {
            q.push(obs(at));
        }
        let b = q.take_batch().unwrap();
        assert_eq!(ats(&b), vec![1, 2, 3]);
        q.push(obs(4));
        q.push(obs(5)); // 3 in flight + 1 queued = full: drops 4
        assert_eq!(q.dropped(), 1);
        q.put_back();
        let b = q.take_batch().unwrap();
        assert_eq!(ats(&b), vec![1, 2, 3, 5]);
        assert_eq!(b.dropped, 1);
    }

    #[test]
    fn drops_during_flight_survive_the_acknowledgement() {
        let mut q = IngestQueue::new(2);
        q.push(obs(1));
        q.push(obs(2));
        q.push(obs(3)); // drops 1
        let b = q.take_batch().unwrap();
        assert_eq!(b.dropped, 1);
        q.push(obs(4)); // queue full with the in-flight batch: 4 is dropped
        q.acknowledge();
        assert_eq!(
            q.dropped(),
            1,
            "the drop after the batch was cut is still owed"
        );
        let b = q.take_batch().unwrap();
        assert!(b.observations.is_empty());
        assert_eq!(b.dropped, 1);
    }

    #[test]
    fn batches_are_bounded() {
        let mut q = IngestQueue::new(1024);
        for at in 0..600 {
            q.push(obs(at));
        }
        assert_eq!(q.take_batch().unwrap().observations.len(), MAX_BATCH);
        q.acknowledge();
        assert_eq!(q.len(), 600 - MAX_BATCH);
    }
}
