//! The event bus: wakes the event streams when a Domain's log grows.
//!
//! The source of truth is the `events` table; the bus only carries "Domain D has events up to
//! seq N". A stream that wakes reads the rows it has not sent yet from the store, at its own
//! pace, so a notification can be coalesced, repeated or arrive late without losing an event.
//! Nothing assumes that one process owns all streams: another replica's writes reach this
//! process's streams as soon as a bus carries its notices. [`InProcessBus`] serves one
//! replica (and holds every replica's local watch channels); [`nats`] carries the notices
//! between replicas over NATS JetStream, and [`poll`] reads each Domain's head from the
//! database so that a bus outage (or no bus at all, on a shared Postgres) means later
//! wake-ups, never lost events.
//!
//! This folder owns the notices and nothing else: it may import the store (the poller reads
//! the events table); everything that appends events imports it, it imports none of them.

mod jetstream;
pub mod nats;
pub mod poll;

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;
use uuid::Uuid;

/// Publish "new events up to `seq`" notices and subscribe to a Domain's.
pub trait EventBus: Send + Sync + 'static {
    /// Announces that the Domain's log now reaches `seq`. Never blocks.
    fn notify(&self, domain_id: Uuid, seq: u64);
    /// A receiver of the Domain's newest announced seq. The receiver's `changed()` resolves
    /// after any announcement made since its last `borrow_and_update()`.
    fn subscribe(&self, domain_id: Uuid) -> watch::Receiver<u64>;
    /// Whether the bus carries notices between replicas now, or why not, in one line
    /// (`/readyz`). A bus of one process is always ready.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// One process's bus: a `watch` channel per Domain (the latest value is all a stream needs, so
/// a slow subscriber never makes a publisher wait and never lags).
#[derive(Default)]
pub struct InProcessBus {
    domains: Mutex<HashMap<Uuid, watch::Sender<u64>>>,
}

impl InProcessBus {
    pub fn new() -> Self {
        Self::default()
    }

    fn sender(&self, domain_id: Uuid) -> watch::Sender<u64> {
        let mut map = self
            .domains
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        map.entry(domain_id)
            .or_insert_with(|| watch::channel(0).0)
            .clone()
    }

    /// Moves the Domain's watch to `seq` when that is newer; answers whether it moved (false:
    /// it already stood there or further, so no stream had anything to wake for).
    pub(crate) fn advance(&self, domain_id: Uuid, seq: u64) -> bool {
        self.sender(domain_id).send_if_modified(|current| {
            if seq > *current {
                *current = seq;
                true
            } else {
                false
            }
        })
    }
}

impl EventBus for InProcessBus {
    fn notify(&self, domain_id: Uuid, seq: u64) {
        self.advance(domain_id, seq);
    }

    fn subscribe(&self, domain_id: Uuid) -> watch::Receiver<u64> {
        self.sender(domain_id).subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_subscriber_sees_the_newest_seq_and_other_domains_stay_quiet() {
        let bus = InProcessBus::new();
        let d1 = Uuid::from_u128(1);
        let d2 = Uuid::from_u128(2);
        let mut rx = bus.subscribe(d1);
        let mut other = bus.subscribe(d2);
        assert_eq!(*rx.borrow_and_update(), 0);
        bus.notify(d1, 3);
        bus.notify(d1, 5);
        bus.notify(d1, 4); // late and older: ignored
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), 5);
        assert!(!rx.has_changed().unwrap());
        assert!(!other.has_changed().unwrap());
        bus.notify(d2, 1);
        other.changed().await.unwrap();
        assert_eq!(*other.borrow_and_update(), 1);
    }
}
