//! Relayed peers over a relay's TCP/TLS link, inside the data plane: the same relay endpoints
//! as over UDP (`crate::relay`), whose slot holds a [`LinkQueue`] instead of a UDP address.
//!
//! - **Out**: a datagram for such an endpoint is appended to the link's queue as a stream
//!   `send` (length, type, key prefix, datagram: one copy, no allocation) where the batch is
//!   framed, and leaves the batch. The link's writer (plexd's reach runtime owns the TLS
//!   connection) takes everything queued in one swap and seals it in full TLS records. The
//!   queue is bounded ([`LINK_QUEUE_BYTES`]); a frame that does not fit is dropped and counted,
//!   like a datagram the network drops, so a slow link never holds the packet thread.
//! - **In**: the link's reader hands the `recv`s that carry WireGuard to the data plane through
//!   its [`LinkDoor`], a batch per read ([`LinkInbox`]): the reader's thread opens them inline
//!   (the device takes each peer's lock, as the packet loops do), writes the plaintext to the
//!   TUN and sends the answers, so a relayed packet crosses no other thread and no loopback
//!   socket. Everything else the link reads (control frames, disco) stays with the runtime.
//! - **Trust**: only a link the runtime registered ([`crate::RelayTable::link_endpoint`]) has
//!   a slot, and a `recv`'s source prefix names the endpoint; as over UDP, WireGuard
//!   authenticates the datagram and the device refuses one whose peer is not the one the
//!   `recv` names (`Counters::relay_misnamed`).
//!
//! The queue also carries the runtime's own frames for the link (registration, keepalives,
//! disco, and a loopback forwarder's `send`s when a peer cannot be carried here), so the writer
//! waits on one queue.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use plexsphere_wire::reach::relay::{KeyPrefix, parse_stream_recv, write_stream_send};

use crate::batch::PacketBatch;
use crate::side::is_wireguard;

/// The most stream bytes one link's queue holds before it drops frames: about 700 full-size
/// datagrams, some 8 ms of a 1 Gbit/s link.
pub const LINK_QUEUE_BYTES: usize = 1 << 20;

/// The datagrams one read of a link hands the data plane at most (the rest wait for the next
/// hand-over of the same read).
pub const LINK_INBOX: usize = 64;

/// What a link's queue counted.
#[derive(Debug, Default)]
pub struct LinkCounters {
    /// Frames appended to the queue.
    pub queued: AtomicU64,
    /// Frames dropped because the queue held [`LINK_QUEUE_BYTES`] (or the link had closed).
    pub dropped: AtomicU64,
}

#[derive(Debug, Default)]
struct Pending {
    bytes: Vec<u8>,
    closed: bool,
}

/// The stream frames waiting for one relay link's writer; see the module docs.
#[derive(Debug, Default)]
pub struct LinkQueue {
    pending: Mutex<Pending>,
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
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
        let fits = !p.closed && p.bytes.len() + len <= LINK_QUEUE_BYTES;
        if !(fits && write(&mut p.bytes)) {
            drop(p);
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let was_empty = p.bytes.len() == len;
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
        if p.bytes.is_empty() && !p.closed {
            p = self
                .ready
                .wait_timeout_while(p, wait, |p| p.bytes.is_empty() && !p.closed)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        if !p.bytes.is_empty() {
            std::mem::swap(&mut p.bytes, out);
            return Taken::Bytes;
        }
        if p.closed { Taken::Closed } else { Taken::Idle }
    }

    /// The link ended: frames queued from now on are dropped, and its relay endpoints are gone
    /// (the data plane reuses the slot).
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

/// The data plane's side of a door: where a link's reader hands its WireGuard datagrams.
pub(crate) trait LinkDeliver: Send + Sync {
    /// The relay endpoint of `link`'s slot for source `src`; None when the link has none.
    fn source(&self, link: &LinkQueue, src: &KeyPrefix) -> Option<SocketAddr>;
    /// Opens `inbox`'s datagrams inline, writes the plaintext to the TUN, sends the answers.
    fn deliver(&self, inbox: &mut LinkInbox);
}

/// How a relay link's reader reaches the running data plane (see the module docs); cloned
/// into `RunConfig::links`, set when the runner starts. Without a running data plane every
/// frame stays with the link's owner.
#[derive(Clone, Default)]
pub struct LinkDoor {
    plane: Arc<RwLock<Option<Weak<dyn LinkDeliver>>>>,
}

impl std::fmt::Debug for LinkDoor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkDoor")
    }
}

impl LinkDoor {
    pub fn new() -> Self {
        Self::default()
    }

    /// The runner's side, from now on (weak: the door does not keep a stopped runner alive).
    pub(crate) fn set(&self, plane: Weak<dyn LinkDeliver>) {
        *self.plane.write().unwrap_or_else(PoisonError::into_inner) = Some(plane);
    }

    fn plane(&self) -> Option<Arc<dyn LinkDeliver>> {
        self.plane
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(Weak::upgrade)
    }

    /// Takes the stream frame `body` (after its length prefix) into `inbox` when it is a
    /// `recv` carrying WireGuard on a link the data plane carries peers on; false: the frame
    /// is the caller's. A full inbox is handed over first.
    pub fn offer(&self, link: &LinkQueue, inbox: &mut LinkInbox, body: &[u8]) -> bool {
        let Some((src, datagram)) = parse_stream_recv(body) else {
            return false;
        };
        if !is_wireguard(datagram) {
            return false;
        }
        let Some(plane) = self.plane() else {
            return false;
        };
        let Some(from) = plane.source(link, &src) else {
            return false;
        };
        if inbox.datagrams.len() >= inbox.datagrams.max() {
            plane.deliver(inbox);
            inbox.datagrams.clear();
        }
        inbox.datagrams.push(datagram, from);
        true
    }

    /// Hands what `inbox` holds to the data plane (nothing when it is empty).
    pub fn flush(&self, inbox: &mut LinkInbox) {
        if inbox.datagrams.is_empty() {
            return;
        }
        if let Some(plane) = self.plane() {
            plane.deliver(inbox);
        }
        inbox.datagrams.clear();
    }
}

/// A link reader's buffers for the hand-over: the datagrams it read, and the data plane's
/// output of opening them (kept across reads, so the hand-over allocates nothing).
pub struct LinkInbox {
    pub(crate) datagrams: PacketBatch,
    pub(crate) to_network: PacketBatch,
    pub(crate) to_tun: PacketBatch,
}

impl Default for LinkInbox {
    fn default() -> Self {
        Self {
            datagrams: PacketBatch::for_datagrams(LINK_INBOX),
            to_network: PacketBatch::for_datagrams(8),
            to_tun: PacketBatch::for_packets(LINK_INBOX),
        }
    }
}

impl LinkInbox {
    pub fn new() -> Self {
        Self::default()
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

    #[test]
    fn a_door_without_a_running_data_plane_takes_nothing() {
        let door = LinkDoor::new();
        let q = LinkQueue::new();
        let mut inbox = LinkInbox::new();
        let recv = Frame::Recv {
            src: [5; 8],
            payload: vec![4, 0, 0, 0, 1, 2, 3],
        }
        .to_stream();
        assert!(!door.offer(&q, &mut inbox, &recv[2..]));
        assert!(inbox.datagrams.is_empty());
    }
}
