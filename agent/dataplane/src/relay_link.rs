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
//!   its [`LinkDoor`] (its slot looked up once a read, [`LinkDoor::hand`]), a batch per read
//!   ([`LinkInbox`]): the reader's thread opens them inline
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

use std::sync::{Arc, PoisonError, RwLock, Weak};

use plexsphere_wire::reach::relay::parse_stream_recv;

use crate::batch::PacketBatch;
pub use crate::link_queue::{LINK_QUEUE_BYTES, LinkCounters, LinkQueue, Taken};
use crate::side::is_wireguard;

/// The datagrams one read of a link hands the data plane at most (the rest wait for the next
/// hand-over of the same read).
pub const LINK_INBOX: usize = 64;

/// The data plane's side of a door: where a link's reader hands its WireGuard datagrams.
pub(crate) trait LinkDeliver: Send + Sync {
    /// `link`'s slot in the relay table; None when it has none (or closed).
    fn slot(&self, link: &LinkQueue) -> Option<u16>;
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

    /// The running data plane's hand for what one read of `link` brought, looked up once a
    /// read (not once a frame); None when no data plane runs or it carries no peer on `link`:
    /// every frame is then the caller's.
    pub fn hand(&self, link: &LinkQueue) -> Option<LinkHand> {
        let plane = self.plane()?;
        let slot = plane.slot(link)?;
        Some(LinkHand { plane, slot })
    }
}

/// The data plane's side of one read of a link ([`LinkDoor::hand`]).
pub struct LinkHand {
    plane: Arc<dyn LinkDeliver>,
    slot: u16,
}

impl LinkHand {
    /// Takes the stream frame `body` (after its length prefix) into `inbox` when it is a
    /// `recv` carrying WireGuard; false: the frame is the caller's. A full inbox is handed
    /// over first.
    pub fn offer(&self, inbox: &mut LinkInbox, body: &[u8]) -> bool {
        let Some((src, datagram)) = parse_stream_recv(body) else {
            return false;
        };
        if !is_wireguard(datagram) {
            return false;
        }
        if inbox.datagrams.len() >= inbox.datagrams.max() {
            self.flush(inbox);
        }
        inbox
            .datagrams
            .push(datagram, crate::relay::endpoint(self.slot, &src));
        true
    }

    /// Hands what `inbox` holds to the data plane (nothing when it is empty).
    pub fn flush(&self, inbox: &mut LinkInbox) {
        if inbox.datagrams.is_empty() {
            return;
        }
        self.plane.deliver(inbox);
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

    #[test]
    fn a_door_without_a_running_data_plane_takes_nothing() {
        let door = LinkDoor::new();
        let q = LinkQueue::new();
        assert!(
            door.hand(&q).is_none(),
            "no data plane: every frame stays with the link's reader"
        );
    }
}
