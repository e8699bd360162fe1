//! The ring of a Domain's recent events that the fan-out ([`super::fanout`]) shares among
//! that Domain's streams: what a stream takes after its cursor (or the gap it reads from the
//! store), and each event's signed copies for the whole Domain. Pure: no store, no clock.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use plexsphere_wire::domain_event::{DomainEnvelope, DomainEvent, EventData};
use plexsphere_wire::signed::{DomainSigner, SignContext};
use uuid::Uuid;

use crate::store::events::DomainEventRow;

/// How many signed copies of one event an [`Entry`] keeps: one per Domain key that signed it
/// (the current key; across the end of a rotation's overlap, the one before as well).
pub(crate) const SHARED_FRAME_KEYS: usize = 2;

/// One event in the ring, with when the reader was woken for it (for the delivery metric).
#[derive(Debug)]
pub(crate) struct Entry {
    pub row: DomainEventRow,
    pub woken: Instant,
    /// The frame `data:` of the event's Domain envelope, per signing public key.
    shared: Mutex<Vec<(Vec<u8>, Arc<str>)>>,
}

impl Entry {
    pub fn new(row: DomainEventRow, woken: Instant) -> Self {
        Self {
            row,
            woken,
            shared: Mutex::new(Vec::new()),
        }
    }

    /// The frame `data:` of this event's Domain envelope signed by `signer`: signed and
    /// encoded by the first stream that needs it, then shared by every stream of the Domain
    /// (the others wait for that one signature instead of making their own).
    pub(crate) fn shared_data(
        &self,
        domain_id: Uuid,
        signer: &DomainSigner,
    ) -> Result<Arc<str>, serde_json::Error> {
        let key = signer.public_key();
        let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, data)) = shared.iter().find(|(k, _)| k == key) {
            return Ok(data.clone());
        }
        let event = DomainEvent {
            seq: self.row.seq,
            domain_id,
            target: self.row.target,
            subject: self.row.subject,
            kind: self.row.kind.clone(),
        };
        let env = signer.sign(SignContext::DomainEvent, &event)?;
        let data: Arc<str> =
            serde_json::to_string(&EventData::Domain(DomainEnvelope { domain_event: env }))?.into();
        if shared.len() >= SHARED_FRAME_KEYS {
            shared.remove(0);
        }
        shared.push((key.to_vec(), data.clone()));
        Ok(data)
    }
}

/// The recent events of one Domain: every event with a seq in `(base, tip]` is in `events`
/// (oldest first), so a stream whose cursor is at least `base` needs nothing from the store.
/// Pure: no store, no clock.
#[derive(Debug, Default)]
pub(crate) struct Ring {
    /// Until the reader's first read the ring covers nothing (`base` is `u64::MAX`).
    base: u64,
    tip: u64,
    events: VecDeque<Arc<Entry>>,
    capacity: usize,
}

/// What a stream gets from the ring for its cursor.
#[derive(Debug)]
pub(crate) enum Take {
    /// The events for the node after the cursor (possibly none) and the new cursor.
    Events(Vec<Arc<Entry>>, u64),
    /// The cursor is older than the ring: read `(cursor, ...]` from the store first.
    Gap,
}

impl Ring {
    pub fn new(capacity: usize) -> Self {
        Self {
            base: u64::MAX,
            tip: 0,
            events: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// The first read: the ring starts empty at the Domain's head.
    pub fn start(&mut self, head: u64) {
        self.base = head;
        self.tip = head;
        self.events.clear();
    }

    /// The newest seq the ring is complete through.
    pub(crate) fn tip(&self) -> u64 {
        self.tip
    }

    /// The oldest seq a stream may stand at and still be served from the ring.
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    /// Events were pruned from the store through `pruned_through`, past the ring's tip (the
    /// reader fell behind the replay window): the ring restarts there, so the streams behind
    /// it read the gap from the store and are resynced.
    pub(crate) fn restart_after_prune(&mut self, pruned_through: u64) {
        if pruned_through > self.tip {
            self.start(pruned_through);
        }
    }

    /// Appends rows read after the tip (oldest first) and moves the tip to `complete_through`
    /// (every seq up to it has been read). Drops the oldest events beyond the capacity.
    pub fn append(&mut self, rows: Vec<DomainEventRow>, complete_through: u64, woken: Instant) {
        for row in rows {
            if row.seq <= self.tip {
                continue;
            }
            self.tip = row.seq;
            self.events.push_back(Arc::new(Entry::new(row, woken)));
        }
        self.tip = self.tip.max(complete_through);
        while self.events.len() > self.capacity {
            if let Some(old) = self.events.pop_front() {
                self.base = old.row.seq;
            }
        }
    }

    /// The events for `node_id` after `cursor`, or [`Take::Gap`] when the ring does not reach
    /// back to the cursor.
    pub fn take(&self, cursor: u64, node_id: Uuid) -> Take {
        if cursor < self.base {
            return Take::Gap;
        }
        // The events are sorted by seq: skip to the first one after the cursor.
        let start = self.events.partition_point(|e| e.row.seq <= cursor);
        let picked = self
            .events
            .range(start..)
            .filter(|e| e.row.is_for(node_id))
            .cloned()
            .collect();
        Take::Events(picked, cursor.max(self.tip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexsphere_wire::node::EventKind;

    fn row(seq: u64, target: Option<u128>, subject: u128) -> DomainEventRow {
        DomainEventRow {
            seq,
            target: target.map(Uuid::from_u128),
            subject: Uuid::from_u128(subject),
            kind: EventKind::NodeRevoked,
        }
    }

    fn seqs(take: Take) -> (Vec<u64>, u64) {
        match take {
            Take::Events(es, cursor) => (es.iter().map(|e| e.row.seq).collect(), cursor),
            Take::Gap => panic!("a gap"),
        }
    }

    #[test]
    fn a_stream_takes_its_own_events_after_its_cursor() {
        let now = Instant::now();
        let mut ring = Ring::new(8);
        assert!(matches!(ring.take(0, Uuid::from_u128(1)), Take::Gap));
        ring.start(10);
        ring.append(
            vec![
                row(11, None, 2),
                row(12, Some(1), 3),
                row(13, None, 1),
                row(14, Some(3), 2),
            ],
            14,
            now,
        );
        let me = Uuid::from_u128(1);
        // 13 is about node 1 itself, 14 is for node 3.
        assert_eq!(seqs(ring.take(10, me)), (vec![11, 12], 14));
        assert_eq!(seqs(ring.take(11, me)), (vec![12], 14));
        assert_eq!(seqs(ring.take(14, me)), (vec![], 14));
        // A cursor ahead of the ring (the stream read a newer head) stays where it is.
        assert_eq!(seqs(ring.take(20, me)), (vec![], 20));
        assert!(matches!(ring.take(9, me), Take::Gap));
        // Rows already held are not appended twice; the tip moves to what was complete.
        ring.append(vec![row(14, None, 2), row(15, None, 2)], 17, now);
        assert_eq!(seqs(ring.take(10, me)), (vec![11, 12, 15], 17));
    }

    #[test]
    fn an_event_is_signed_once_per_key_for_every_stream() {
        use plexsphere_wire::signed::DomainVerifier;
        let (one, two, three) = (
            DomainSigner::from_seed(&[1; 32]).unwrap(),
            DomainSigner::from_seed(&[2; 32]).unwrap(),
            DomainSigner::from_seed(&[3; 32]).unwrap(),
        );
        let domain = Uuid::from_u128(77);
        let entry = Entry::new(row(5, None, 9), Instant::now());
        let a = entry.shared_data(domain, &one).unwrap();
        let b = entry.shared_data(domain, &one).unwrap();
        assert!(
            Arc::ptr_eq(&a, &b),
            "the second stream reuses the first copy"
        );
        let c = entry.shared_data(domain, &two).unwrap();
        assert_ne!(a, c, "another key signs its own copy");
        // Each copy opens with its own key only, as the event of the Domain.
        let open = |data: &str, by: &DomainSigner| -> Option<DomainEvent> {
            let EventData::Domain(d) = serde_json::from_str(data).unwrap() else {
                panic!("not a Domain envelope: {data}");
            };
            DomainVerifier::from_b64(&by.public_key_b64())
                .unwrap()
                .open(SignContext::DomainEvent, &d.domain_event)
                .ok()
        };
        let ev = open(&a, &one).unwrap();
        assert_eq!(
            (ev.seq, ev.domain_id, ev.target, ev.subject),
            (5, domain, None, Uuid::from_u128(9))
        );
        assert!(open(&a, &two).is_none() && open(&c, &two).is_some());
        // At most SHARED_FRAME_KEYS copies: a third key pushes out the oldest.
        entry.shared_data(domain, &three).unwrap();
        let again = entry.shared_data(domain, &one).unwrap();
        assert!(!Arc::ptr_eq(&a, &again), "the first copy was dropped");
        assert_eq!(entry.shared.lock().unwrap().len(), SHARED_FRAME_KEYS);
    }

    #[test]
    fn the_ring_keeps_its_capacity_and_the_older_cursors_get_a_gap() {
        let now = Instant::now();
        let mut ring = Ring::new(3);
        ring.start(0);
        ring.append((1..=5).map(|s| row(s, None, 9)).collect(), 5, now);
        assert_eq!(ring.base(), 2);
        assert!(matches!(ring.take(1, Uuid::from_u128(1)), Take::Gap));
        assert_eq!(seqs(ring.take(2, Uuid::from_u128(1))), (vec![3, 4, 5], 5));
        // A prune past the tip restarts the ring there.
        ring.restart_after_prune(4);
        assert_eq!(ring.base(), 2, "a prune below the tip changes nothing");
        ring.restart_after_prune(9);
        assert_eq!((ring.base(), ring.tip()), (9, 9));
        assert!(matches!(ring.take(5, Uuid::from_u128(1)), Take::Gap));
    }
}
