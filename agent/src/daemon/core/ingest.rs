//! The observations waiting for `POST /v1/nodes/{id}/ingest`: a bounded queue that drops the
//! oldest first while the API is away and counts what it dropped (sent as
//! `IngestBatch.dropped`). One batch is in flight at a time.
//!
//! A batch is cut once and then kept whole until the server accepts or refuses it for good:
//! after a failed call the very same batch (same `batch_id`, same observations) goes out again,
//! so a retry after a lost answer is one the server recognises and does not store twice.

use std::collections::VecDeque;

use plexsphere_wire::node::{IngestBatch, Observation};
use uuid::Uuid;

/// The most observations one batch carries.
pub const MAX_BATCH: usize = 256;

#[derive(Debug)]
pub struct IngestQueue {
    queue: VecDeque<Observation>,
    capacity: usize,
    /// Dropped and not yet reported in an accepted batch.
    dropped: u64,
    /// The batch cut last, kept until it is accepted or refused for good.
    pending: Option<Pending>,
}

#[derive(Debug)]
struct Pending {
    batch: IngestBatch,
    /// A call with it is running.
    sending: bool,
}

impl IngestQueue {
    pub fn new(capacity: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            capacity: capacity.max(1),
            dropped: 0,
            pending: None,
        }
    }

    /// Adds an observation. When full, the oldest queued one is dropped; the pending batch is
    /// kept whole (it may already be stored), so when it alone fills the queue the new one is.
    pub fn push(&mut self, obs: Observation) {
        if self.queue.len() + self.pending_len() >= self.capacity {
            self.dropped += 1;
            if self.queue.pop_front().is_none() {
                return;
            }
        }
        self.queue.push_back(obs);
    }

    fn pending_len(&self) -> usize {
        self.pending
            .as_ref()
            .map_or(0, |p| p.batch.observations.len())
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Queued plus in the pending batch: what the control plane has not acknowledged.
    pub fn waiting(&self) -> usize {
        self.queue.len() + self.pending_len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The batch to send now: the pending one again after a failure, else a new one cut from
    /// the oldest observations; `None` when a call is running or there is nothing to say.
    /// `batch_id` names a new batch (the caller draws it, so the queue holds no randomness).
    pub fn take_batch(&mut self, batch_id: Uuid) -> Option<IngestBatch> {
        if let Some(p) = &mut self.pending {
            if p.sending {
                return None;
            }
            p.sending = true;
            return Some(p.batch.clone());
        }
        if self.queue.is_empty() && self.dropped == 0 {
            return None;
        }
        let n = self.queue.len().min(MAX_BATCH);
        let batch = IngestBatch {
            batch_id,
            observations: self.queue.drain(..n).collect(),
            dropped: self.dropped,
        };
        self.pending = Some(Pending {
            batch: batch.clone(),
            sending: true,
        });
        Some(batch)
    }

    /// The server accepted the pending batch: its `dropped` count was reported.
    pub fn acknowledge(&mut self) {
        if let Some(p) = self.pending.take() {
            self.dropped = self.dropped.saturating_sub(p.batch.dropped);
        }
    }

    /// The call failed in a way another try may mend: the same batch goes out next time.
    pub fn retry_later(&mut self) {
        if let Some(p) = &mut self.pending {
            p.sending = false;
        }
    }

    /// The server refused the pending batch for good: its observations count as dropped (its
    /// `dropped` was not reported either, so that stays owed) and the next batch is a new one.
    /// Answers how many observations were given up.
    pub fn discard(&mut self) -> usize {
        let Some(p) = self.pending.take() else {
            return 0;
        };
        let n = p.batch.observations.len();
        self.dropped += n as u64;
        n
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
        let b = q.take_batch(Uuid::new_v4()).unwrap();
        assert_eq!(ats(&b), vec![3, 4, 5]);
        assert_eq!(b.dropped, 2);
        assert!(
            q.take_batch(Uuid::new_v4()).is_none(),
            "one batch in flight"
        );
        q.acknowledge();
        assert_eq!(q.dropped(), 0);
        assert!(
            q.take_batch(Uuid::new_v4()).is_none(),
            "nothing left to say"
        );
    }

    #[test]
    fn a_failed_batch_is_sent_again_unchanged_and_only_once_at_a_time() {
        let mut q = IngestQueue::new(4);
        for at in 1..=3 {
            q.push(obs(at));
        }
        let first = q.take_batch(Uuid::new_v4()).unwrap();
        assert_eq!(ats(&first), vec![1, 2, 3]);
        q.push(obs(4));
        q.push(obs(5)); // 3 pending + 1 queued = full: the oldest queued, 4, is dropped
        assert_eq!(q.dropped(), 1);
        assert!(
            q.take_batch(Uuid::new_v4()).is_none(),
            "the call is still running"
        );
        assert_eq!(q.waiting(), 4, "3 pending and 1 queued");
        q.retry_later();
        let again = q.take_batch(Uuid::new_v4()).unwrap();
        assert_eq!(again, first, "the retry is the same batch, id and all");
        q.acknowledge();
        let next = q.take_batch(Uuid::new_v4()).unwrap();
        assert_ne!(next.batch_id, first.batch_id);
        assert_eq!(ats(&next), vec![5]);
        assert_eq!(next.dropped, 1);
    }

    #[test]
    fn a_pending_batch_that_fills_the_queue_drops_the_newcomer() {
        let mut q = IngestQueue::new(2);
        q.push(obs(1));
        q.push(obs(2));
        let b = q.take_batch(Uuid::new_v4()).unwrap();
        q.push(obs(3));
        assert_eq!((q.len(), q.dropped()), (0, 1));
        q.retry_later();
        assert_eq!(q.take_batch(Uuid::new_v4()).unwrap(), b);
    }

    #[test]
    fn a_batch_refused_for_good_counts_as_dropped() {
        let mut q = IngestQueue::new(8);
        q.push(obs(1));
        q.push(obs(2));
        q.push(obs(3));
        let mut small = IngestQueue::new(1);
        small.push(obs(9));
        small.push(obs(10)); // one dropped before the batch is cut
        let b = small.take_batch(Uuid::new_v4()).unwrap();
        assert_eq!(b.dropped, 1);
        assert_eq!(small.discard(), 1);
        let next = small.take_batch(Uuid::new_v4()).unwrap();
        assert!(next.observations.is_empty());
        assert_eq!(
            next.dropped, 2,
            "the batch's own drop and its observation are owed"
        );
        assert_ne!(next.batch_id, b.batch_id);

        let b = q.take_batch(Uuid::new_v4()).unwrap();
        assert_eq!(q.discard(), 3);
        assert_eq!(q.dropped(), 3);
        assert_ne!(q.take_batch(Uuid::new_v4()).unwrap().batch_id, b.batch_id);
    }

    #[test]
    fn drops_during_flight_survive_the_acknowledgement() {
        let mut q = IngestQueue::new(2);
        q.push(obs(1));
        q.push(obs(2));
        q.push(obs(3)); // drops 1
        let b = q.take_batch(Uuid::new_v4()).unwrap();
        assert_eq!(b.dropped, 1);
        q.push(obs(4)); // queue full with the in-flight batch: 4 is dropped
        q.acknowledge();
        assert_eq!(
            q.dropped(),
            1,
            "the drop after the batch was cut is still owed"
        );
        let b = q.take_batch(Uuid::new_v4()).unwrap();
        assert!(b.observations.is_empty());
        assert_eq!(b.dropped, 1);
    }

    #[test]
    fn batches_are_bounded() {
        let mut q = IngestQueue::new(1024);
        for at in 0..600 {
            q.push(obs(at));
        }
        assert_eq!(
            q.take_batch(Uuid::new_v4()).unwrap().observations.len(),
            MAX_BATCH
        );
        q.acknowledge();
        assert_eq!(q.len(), 600 - MAX_BATCH);
    }
}
