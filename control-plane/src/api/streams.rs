//! The event streams open in this process: how many per node, how many were dropped for a
//! slow client, and the switch that ends them all at shutdown. `sse.rs` opens and counts them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;
use uuid::Uuid;

/// The event streams open in this process (observable by operators and tests).
pub struct Streams {
    open: Mutex<HashMap<Uuid, usize>>,
    pub(super) slow_dropped: AtomicU64,
    pub(super) closing: watch::Sender<bool>,
}

impl Default for Streams {
    fn default() -> Self {
        Self {
            open: Mutex::new(HashMap::new()),
            slow_dropped: AtomicU64::new(0),
            closing: watch::channel(false).0,
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

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, usize>> {
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
