//! The queue of one relay link (TCP/TLS): the stream frames waiting for its writer, bounded,
//! taken in one swap; see `crate::relay_link` for who fills and who drains it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use plexsphere_wire::reach::relay::{KeyPrefix, write_stream_send};

/// The most stream bytes one link's queue holds before it drops frames: about 700 full-size
/// datagrams, some 8 ms of a 1 Gbit/s link.
pub const LINK_QUEUE_BYTES: usize = 1 << 20;

/// What a link's queue counted.
#[derive(Debug, Default)]
pub struct LinkCounters {
    /// Frames appended to the queue.
    pub queued: AtomicU64,
    /// Frames dropped because the queue held [`LINK_QUEUE_BYTES`] (or the link had closed).
    pub dropped: AtomicU64,
}

/// The stream frames waiting for one relay link's writer; see the module docs.
#[derive(Debug, Default)]
pub struct LinkQueue {
    pending: Mutex<Vec<u8>>,
    /// Set under `pending`'s lock (so a waiting writer cannot miss it), read without it: the
    /// packet thread asks for every datagram it frames.
    closed: AtomicBool,
    ready: Condvar,
    pub counters: LinkCounters,
}

/// What [`LinkQueue::take`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// Frames, now in the caller's buffer.
    Bytes,
    /// Nothing within the wait.
    Idle,
    /// The link closed: nothing more will queue.
    Closed,
}

impl LinkQueue {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends one whole stream frame (length prefix included); false when it does not fit
    /// or the link closed (dropped, counted).
    pub fn push(&self, frame: &[u8]) -> bool {
        self.append(frame.len(), |out| {
            out.extend_from_slice(frame);
            true
        })
    }

    /// Appends a stream `send` of `datagram` to the node whose key starts with `dst`; false
    /// when it does not fit, the datagram is longer than a relay takes, or the link closed.
    pub fn push_send(&self, dst: &KeyPrefix, datagram: &[u8]) -> bool {
        let len = plexsphere_wire::reach::relay::STREAM_DATA_HEAD + datagram.len();
        self.append(len, |out| write_stream_send(out, dst, datagram))
    }

    fn append(&self, len: usize, write: impl FnOnce(&mut Vec<u8>) -> bool) -> bool {
        let mut p = self.lock();
        let fits = !self.is_closed() && p.len() + len <= LINK_QUEUE_BYTES;
        if !(fits && write(&mut p)) {
            drop(p);
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let was_empty = p.len() == len;
        drop(p);
        self.counters.queued.fetch_add(1, Ordering::Relaxed);
        if was_empty {
            self.ready.notify_one();
        }
        true
    }

    /// Everything queued, swapped into `out` (cleared first; its capacity becomes the queue's
    /// next buffer); waits at most `wait` for the first frame.
    pub fn take(&self, out: &mut Vec<u8>, wait: Duration) -> Taken {
        out.clear();
        let mut p = self.lock();
        if p.is_empty() && !self.is_closed() {
            p = self
                .ready
                .wait_timeout_while(p, wait, |p| p.is_empty() && !self.is_closed())
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        if !p.is_empty() {
            std::mem::swap(&mut *p, out);
            return Taken::Bytes;
        }
        if self.is_closed() {
            Taken::Closed
        } else {
            Taken::Idle
        }
    }

    /// The link ended: frames queued from now on are dropped, and its relay endpoints are gone
    /// (the data plane reuses the slot).
    pub fn close(&self) {
        let pending = self.lock();
        self.closed.store(true, Ordering::Release);
        drop(pending);
        self.ready.notify_all();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexsphere_wire::reach::relay::Frame;

    #[test]
    fn frames_queue_whole_until_the_bound_and_are_taken_in_one_swap() {
        let q = LinkQueue::new();
        let frame = Frame::Ping { nonce: [1; 8] }.to_stream();
        assert!(q.push(&frame));
        assert!(q.push_send(&[7; 8], &[4, 0, 0, 0, 1]));
        let mut out = vec![9; 3];
        assert_eq!(q.take(&mut out, Duration::ZERO), Taken::Bytes);
        let mut want = frame.clone();
        want.extend_from_slice(
            &Frame::Send {
                dst: [7; 8],
                payload: vec![4, 0, 0, 0, 1],
            }
            .to_stream(),
        );
        assert_eq!(out, want);
        assert_eq!(q.take(&mut out, Duration::from_millis(1)), Taken::Idle);
        assert!(out.is_empty());

        // Up to the bound, then whole frames are dropped and counted.
        let big = vec![4u8; 8_000];
        let mut n = 0;
        while q.push_send(&[1; 8], &big) {
            n += 1;
        }
        assert_eq!(n, LINK_QUEUE_BYTES / (big.len() + 11));
        assert_eq!(q.counters.dropped.load(Ordering::Relaxed), 1);
        assert_eq!(q.take(&mut out, Duration::ZERO), Taken::Bytes);
        assert_eq!(out.len(), n * (big.len() + 11), "only whole frames");
        assert!(
            !q.push_send(&[1; 8], &[0; 8_184]),
            "longer than a relay takes on a stream"
        );
        assert_eq!(q.take(&mut out, Duration::ZERO), Taken::Idle);
    }

    #[test]
    fn a_closed_queue_drops_what_comes_and_wakes_its_writer() {
        let q = LinkQueue::new();
        let waiter = {
            let q = q.clone();
            std::thread::spawn(move || q.take(&mut Vec::new(), Duration::from_secs(30)))
        };
        q.close();
        assert_eq!(waiter.join().expect("the writer"), Taken::Closed);
        assert!(!q.push(&[0, 1, 9]));
        assert!(q.is_closed());
    }
}
