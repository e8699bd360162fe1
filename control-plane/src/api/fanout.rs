//! Event fan-out: one reader per Domain per process reads each new event from the store once
//! and every open stream of that Domain takes it from a shared ring of recent events.
//!
//! Store reads per event therefore do not grow with the number of streams. The reader wakes
//! on the bus (`EventBus::subscribe`), reads the rows after its tip with
//! [`events::for_domain`] between two reads of the head (to see a prune in between), appends
//! them to the [`Ring`] and announces the new tip on a `watch` channel. A stream keeps its own
//! cursor and picks the events addressed to its node ([`DomainEventRow::is_for`]). A node that
//! understands Domain envelopes gets the event's one signed copy for the whole Domain
//! ([`Entry::shared_data`]: signed and encoded once per event and key, whatever the number of
//! streams); an older node gets its own copy, signed for it. A stream whose cursor is older than the ring (a resume from Last-Event-ID,
//! or a stream that fell [`RING_EVENTS`] events behind) reads that gap from the store itself,
//! in bounded batches, as before.
//!
//! The reader lives as long as some stream of its Domain does: it ends when the last stream's
//! receiver is gone, and the next stream of that Domain starts a new one.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use plexsphere_wire::domain_event::{DomainEnvelope, DomainEvent, EventData};
use plexsphere_wire::signed::{DomainSigner, SignContext};
use tokio::sync::watch;
use uuid::Uuid;

use crate::store::events::{self, DomainEventRow, Head};
use crate::store::{Store, StoreError};

/// How many recent events of a Domain the ring keeps for its streams (a documented limit,
/// docs/api.md "Event streams"). A stream further behind reads the gap from the store.
pub const RING_EVENTS: usize = 4096;
/// Events the reader reads from the store per query.
pub(crate) const READ_BATCH: u32 = 512;
/// How long the reader waits before it tries the store again after a failed read (the
/// streams stay open meanwhile; the events are still in the table).
pub(crate) const READ_RETRY: Duration = Duration::from_millis(500);

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

/// One Domain's ring and the channel that announces its tip to the Domain's streams.
pub(crate) struct Hub {
    ring: RwLock<Ring>,
    tip: watch::Sender<u64>,
    /// The reader stopped for good (the bus closed): the streams end and their clients resume.
    ended: AtomicBool,
}

impl Hub {
    fn new(capacity: usize) -> Self {
        Self {
            ring: RwLock::new(Ring::new(capacity)),
            tip: watch::channel(0).0,
            ended: AtomicBool::new(false),
        }
    }

    /// Whether the Domain's reader stopped for good; a stream that sees it ends.
    pub(crate) fn ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }

    /// What the ring holds for this stream's cursor.
    pub fn take(&self, cursor: u64, node_id: Uuid) -> Take {
        self.read().take(cursor, node_id)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Ring> {
        self.ring.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Ring> {
        self.ring.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// A stream's membership of its Domain's hub: the hub and the receiver of its tip.
pub(crate) struct Member {
    pub hub: Arc<Hub>,
    pub tip: watch::Receiver<u64>,
}

/// The hubs of this process, one per Domain with an open stream, and how many store queries
/// their readers made (observable by tests: they must not grow with the number of streams).
#[derive(Default)]
pub(crate) struct Fanout {
    hubs: Mutex<HashMap<Uuid, Arc<Hub>>>,
    queries: AtomicU64,
}

impl Fanout {
    /// Joins the Domain's hub, starting its reader when the Domain has none. `notices` is a
    /// fresh subscription to the Domain on the bus (the reader keeps it when it starts).
    pub fn join(
        self: &Arc<Self>,
        domain_id: Uuid,
        store: &Store,
        notices: watch::Receiver<u64>,
    ) -> Member {
        let mut hubs = self.lock();
        if let Some(hub) = hubs.get(&domain_id) {
            let tip = hub.tip.subscribe();
            return Member {
                hub: hub.clone(),
                tip,
            };
        }
        let hub = Arc::new(Hub::new(RING_EVENTS));
        let tip = hub.tip.subscribe();
        hubs.insert(domain_id, hub.clone());
        drop(hubs);
        let reader = Reader {
            fanout: self.clone(),
            domain_id,
            store: store.clone(),
            hub: hub.clone(),
        };
        tokio::spawn(reader.run(notices));
        Member { hub, tip }
    }

    /// The store queries every reader of this process made so far.
    pub(crate) fn store_queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }

    /// How many Domains have a reader in this process.
    pub(crate) fn readers(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Arc<Hub>>> {
        self.hubs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The one task per Domain that reads its new events.
struct Reader {
    fanout: Arc<Fanout>,
    domain_id: Uuid,
    store: Store,
    hub: Arc<Hub>,
}

impl Reader {
    async fn run(self, mut notices: watch::Receiver<u64>) {
        tracing::debug!(domain_id = %self.domain_id, "fanout: reader started");
        notices.borrow_and_update();
        let mut woken = Instant::now();
        loop {
            while let Err(e) = self.catch_up(woken).await {
                tracing::warn!(domain_id = %self.domain_id, error = %e, retry_ms = READ_RETRY.as_millis() as u64, "fanout: cannot read the event log; the streams wait");
                tokio::select! {
                    () = tokio::time::sleep(READ_RETRY) => {}
                    () = self.hub.tip.closed() => {}
                }
                if self.leave_if_unused() {
                    return;
                }
            }
            tokio::select! {
                changed = notices.changed() => {
                    if changed.is_err() {
                        tracing::warn!(domain_id = %self.domain_id, "fanout: the bus closed");
                        self.leave();
                        return;
                    }
                    notices.borrow_and_update();
                    woken = Instant::now();
                }
                () = self.hub.tip.closed() => {
                    if self.leave_if_unused() {
                        return;
                    }
                }
            }
        }
    }

    /// Reads everything after the ring's tip into the ring and announces the new tip.
    async fn catch_up(&self, woken: Instant) -> Result<(), StoreError> {
        loop {
            let (tip, started) = {
                let ring = self.hub.read();
                (ring.tip(), ring.base() != u64::MAX)
            };
            let mut conn = self.store.acquire().await?;
            let before = self.head(&mut conn).await?;
            if !started {
                self.hub.write().start(before.seq);
                self.hub.tip.send_replace(before.seq);
                return Ok(());
            }
            self.fanout.queries.fetch_add(1, Ordering::Relaxed);
            let rows = events::for_domain(&mut conn, self.domain_id, tip, READ_BATCH).await?;
            let after = self.head(&mut conn).await?;
            drop(conn);
            let full = rows.len() >= READ_BATCH as usize;
            let last = rows.last().map_or(tip, |r| r.seq);
            let complete = if full { last } else { last.max(before.seq) };
            let new_tip = {
                let mut ring = self.hub.write();
                ring.append(rows, complete, woken);
                // A prune past what was read: the events in between are gone for good.
                ring.restart_after_prune(after.pruned_through);
                ring.tip()
            };
            self.hub.tip.send_replace(new_tip);
            if !full {
                return Ok(());
            }
        }
    }

    async fn head(&self, conn: &mut crate::store::Conn) -> Result<Head, StoreError> {
        self.fanout.queries.fetch_add(1, Ordering::Relaxed);
        events::head(conn, self.domain_id).await
    }

    /// Ends the reader when no stream holds its hub any more (checked under the map's lock,
    /// so a stream joining meanwhile either sees the hub gone or keeps the reader).
    fn leave_if_unused(&self) -> bool {
        let mut hubs = self.fanout.lock();
        if self.hub.tip.receiver_count() > 0 {
            return false;
        }
        hubs.remove(&self.domain_id);
        tracing::debug!(domain_id = %self.domain_id, "fanout: reader ended (no stream left)");
        true
    }

    /// Stops for good: the next stream of the Domain starts a new reader, the open ones end.
    fn leave(&self) {
        self.fanout.lock().remove(&self.domain_id);
        self.hub.ended.store(true, Ordering::Relaxed);
        self.hub.tip.send_modify(|_| {});
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
