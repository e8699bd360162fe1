//! Event fan-out: one reader per Domain per process reads each new event from the store once
//! and every open stream of that Domain takes it from a shared ring of recent events.
//!
//! Store reads per event therefore do not grow with the number of streams. The reader wakes
//! on the bus (`EventBus::subscribe`), reads the rows after its tip with
//! [`events::for_domain`] between two reads of the head (to see a prune in between), appends
//! them to the [`Ring`] (`api::event_ring`) and announces the new tip on a `watch` channel. A
//! stream keeps its own cursor and picks the events addressed to its node
//! ([`events::DomainEventRow::is_for`]). A node that understands Domain envelopes gets the
//! event's one signed copy for the whole Domain (`Entry::shared_data`: signed and encoded once
//! per event and key, whatever the number of streams); an older node gets its own copy, signed
//! for it. A stream whose cursor is older than the ring (a resume from Last-Event-ID, or a
//! stream that fell [`RING_EVENTS`] events behind) reads that gap from the store itself,
//! in bounded batches, as before.
//!
//! The reader lives as long as some stream of its Domain does: it ends when the last stream's
//! receiver is gone, and the next stream of that Domain starts a new one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use uuid::Uuid;

use super::event_ring::{Ring, Take};
use crate::store::events::{self, Head};
use crate::store::{Store, StoreError};

/// How many recent events of a Domain the ring keeps for its streams (a documented limit,
/// docs/api.md "Event streams"). A stream further behind reads the gap from the store.
pub const RING_EVENTS: usize = 4096;
/// Events the reader reads from the store per query.
pub(crate) const READ_BATCH: u32 = 512;
/// How long the reader waits before it tries the store again after a failed read (the
/// streams stay open meanwhile; the events are still in the table).
pub(crate) const READ_RETRY: Duration = Duration::from_millis(500);

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
