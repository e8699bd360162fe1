//! The event streams open in this process: how many per node, how many were dropped for a
//! slow client, the Domains' fan-out, and the switch that ends them all at shutdown. `sse.rs`
//! opens and counts them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use uuid::Uuid;

use super::fanout::Fanout;

/// The event streams open in this process (observable by operators and tests).
pub struct Streams {
    open: Mutex<HashMap<Uuid, usize>>,
    pub(super) slow_dropped: AtomicU64,
    pub(super) closing: watch::Sender<bool>,
    /// The Domains' readers and rings the streams take their events from.
    pub(super) fanout: Arc<Fanout>,
}

impl Default for Streams {
    fn default() -> Self {
        Self {
            open: Mutex::new(HashMap::new()),
            slow_dropped: AtomicU64::new(0),
            closing: watch::channel(false).0,
            fanout: Arc::default(),
        }
    }
}

impl Streams {
    /// Ends every open stream (and refuses to keep new ones open): call it when the server
    /// starts shutting down, so draining connections do not wait for streams that never end.
    /// The nodes resume elsewhere or later with `Last-Event-ID`.
    pub fn close_all(&self) {
        self.closing.send_replace(true);
    }

    /// How many streams of this node are open here.
    pub fn open_for(&self, node_id: Uuid) -> usize {
        self.lock().get(&node_id).copied().unwrap_or(0)
    }

    /// How many streams were dropped because their client did not keep up.
    pub fn slow_dropped(&self) -> u64 {
        self.slow_dropped.load(Ordering::Relaxed)
    }

    /// How many store queries the Domains' fan-out readers made in this process: one read
    /// per wake-up per Domain, however many streams are open.
    pub fn fanout_store_queries(&self) -> u64 {
        self.fanout.store_queries()
    }

    /// How many Domains have a fan-out reader here (one per Domain with an open stream).
    pub fn fanout_readers(&self) -> usize {
        self.fanout.readers()
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, usize>> {
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
