//! The queue between a device's reads and the cipher, one per direction, so interactive packets
//! do not wait behind bulk ones (issue 14).
//!
//! The runner drains the kernel's queue (the TUN ring, the UDP socket's receive buffer) into a
//! `Lane` as fast as it can read, which is much faster than it can encrypt, and works the lane
//! off a quantum of bytes at a time, looking at the device again between quanta. So:
//! - **small packets go first**: on the way in, [`take_urgent`] hands the handshakes,
//!   keepalives, pings, pure ACKs and other small packets of every freshly read batch straight
//!   to the cipher, before any bulk packet queued earlier; they wait for at most one quantum;
//! - **the work in flight is bounded by bytes** as well as by packets: a quantum is at most
//!   [`QUANTUM_BYTES`], a lane at most `max_bytes` and `max_items` (then the kernel queues the
//!   rest, and drops at its own bound);
//! - **a standing queue is dropped from** ([`Codel`] on the head's sojourn time), so a bulk TCP
//!   stream keeps its window at what the tunnel carries instead of filling every buffer.
//!
//! The lane is plain data: no sockets, time is a parameter.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::{Duration, Instant};

use crate::batch::{PacketBatch, WG_OVERHEAD};
use crate::codel::Codel;
use crate::offload::TCP;
use crate::source::Source;

/// A plaintext packet at most this long (a ping, a pure ACK with SACK blocks, a DNS query) may
/// skip the queue, unless it is TCP data, which keeps its place in its flow.
pub(crate) const SMALL_PACKET: usize = 256;
/// A WireGuard datagram at most this long skips the receive queue: handshake messages (148,
/// 92, 64 B), keepalives (32 B) and data datagrams of a small packet.
pub(crate) const SMALL_DATAGRAM: usize = SMALL_PACKET + WG_OVERHEAD;
/// Bytes encrypted or decrypted between two looks at the devices: about 50 µs of ChaCha20 on
/// this machine kind, the most a small packet waits for the cipher.
pub(crate) const QUANTUM_BYTES: usize = 64 << 10;
/// The byte bound of the TUN-to-network lane: 4 MiB, about 10 ms at 3 Gbit/s; CoDel keeps the
/// lane far below it, the bound only matters with the AQM off.
pub(crate) const TX_LANE_BYTES: usize = 4 << 20;
/// The bounds of the network-to-TUN lane. A small datagram decrypted ahead of the bulk ones
/// queued before it is ahead of them in the peer's counter too, and boringtun's replay window
/// takes 1024 counters back: the lane holds at most half of that.
pub(crate) const RX_LANE_BYTES: usize = 1 << 20;
pub(crate) const RX_LANE_DATAGRAMS: usize = 512;
/// Spare batches a lane keeps for the next reads (more are freed): enough for a full lane of
/// MTU-sized packets, so a loaded lane never maps fresh memory.
const SPARE_BATCHES: usize = 64;

/// Whether a plaintext packet from the host skips the queue: small, and not TCP with payload.
pub(crate) fn is_urgent_packet(p: &[u8]) -> bool {
    if p.len() > SMALL_PACKET || p.is_empty() {
        return false;
    }
    let (proto, ip_len) = match p[0] >> 4 {
        4 if p.len() >= 20 => (p[9], usize::from(p[0] & 0x0f) * 4),
        6 if p.len() >= 40 => (p[6], 40),
        _ => return true,
    };
    if proto != TCP {
        return true;
    }
    // TCP: urgent only without payload (ACK, SYN, FIN, RST), so a flow is never reordered.
    match p.get(ip_len + 12) {
        Some(off) => ip_len + usize::from(off >> 4) * 4 >= p.len(),
        None => true,
    }
}

/// Whether a datagram from the network skips the queue (see [`SMALL_DATAGRAM`]).
pub(crate) fn is_urgent_datagram(d: &[u8]) -> bool {
    !d.is_empty() && d.len() <= SMALL_DATAGRAM
}

/// Hands every urgent packet or datagram of a freshly read `batch` to `each` and takes it out
/// of the batch (a slot shrinks to what is left); answers how many it handed over. Of a UDP
/// GRO slot (datagrams of one size, the last possibly shorter) either all are urgent, or only
/// the short last one may be.
pub(crate) fn take_urgent(
    batch: &mut PacketBatch,
    urgent: fn(&[u8]) -> bool,
    mut each: impl FnMut(&[u8], SocketAddr, Option<Source>),
) -> usize {
    let mut taken = 0;
    for i in 0..batch.len() {
        let slot = batch.get(i);
        let len = slot.len();
        if len == 0 {
            continue;
        }
        let keep = match batch.segment(i) {
            0 => {
                if !urgent(slot) {
                    continue;
                }
                each(slot, batch.addr(i), batch.src(i));
                taken += 1;
                0
            }
            seg if urgent(&slot[..seg.min(len)]) => {
                let src = batch.src(i);
                for (d, from) in batch.slot_datagrams(i) {
                    each(d, from, src);
                    taken += 1;
                }
                0
            }
            seg => {
                let tail = len % seg;
                if tail == 0 || !urgent(&slot[len - tail..]) {
                    continue;
                }
                each(&slot[len - tail..], batch.addr(i), batch.src(i));
                taken += 1;
                len - tail
            }
        };
        batch.truncate(i, keep);
    }
    taken
}

struct Entry {
    batch: PacketBatch,
    at: Instant,
    /// The first slot not handed out yet.
    next: usize,
}

/// A queue of read batches, worked off a quantum at a time; see the module docs.
pub(crate) struct Lane {
    entries: VecDeque<Entry>,
    spare: Vec<PacketBatch>,
    bytes: usize,
    items: usize,
    max_bytes: usize,
    max_items: usize,
    codel: Option<Codel>,
}

/// The slots of one batch to process now.
pub(crate) struct Chunk<'a> {
    pub batch: &'a PacketBatch,
    pub slots: Range<usize>,
    /// Packets (or datagrams) CoDel dropped from the lane to make this chunk.
    pub dropped: usize,
}

impl Chunk<'_> {
    /// The chunk's packets (datagrams, GRO slots cut) with their addresses and the local
    /// address each arrived at, empty ones skipped.
    pub(crate) fn datagrams(
        &self,
    ) -> impl Iterator<Item = (&[u8], SocketAddr, Option<Source>)> + '_ {
        self.slots
            .clone()
            .flat_map(|i| {
                let src = self.batch.src(i);
                self.batch
                    .slot_datagrams(i)
                    .map(move |(d, from)| (d, from, src))
            })
            .filter(|(d, _, _)| !d.is_empty())
    }
}

fn items(batch: &PacketBatch, i: usize) -> usize {
    let len = batch.get(i).len();
    match batch.segment(i) {
        0 => usize::from(len > 0),
        seg => len.div_ceil(seg),
    }
}

impl Lane {
    /// An empty lane holding at most `max_bytes` and `max_items` packets, with CoDel or not.
    pub(crate) fn new(max_bytes: usize, max_items: usize, codel: Option<Codel>) -> Self {
        Self {
            entries: VecDeque::new(),
            spare: Vec::new(),
            bytes: 0,
            items: 0,
            max_bytes,
            max_items,
            codel,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.items == 0
    }

    /// True when the lane takes no more reads.
    pub(crate) fn is_full(&self) -> bool {
        self.bytes >= self.max_bytes || self.items >= self.max_items
    }

    /// How long the next read into the lane may wait: up to `poll` when the lane is empty
    /// (nothing to work meanwhile), not at all when it holds work.
    pub(crate) fn read_timeout(&self, poll: Duration) -> Duration {
        if self.is_empty() {
            poll
        } else {
            Duration::ZERO
        }
    }

    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Packets CoDel dropped from this lane so far.
    #[cfg(test)]
    pub(crate) fn dropped(&self) -> u64 {
        self.codel.as_ref().map_or(0, Codel::dropped)
    }

    /// A batch to read into: a spare one, or `make()`.
    pub(crate) fn spare(&mut self, make: impl FnOnce() -> PacketBatch) -> PacketBatch {
        self.spare.pop().unwrap_or_else(make)
    }

    /// Takes back a batch that is not queued (nothing read into it).
    pub(crate) fn give_back(&mut self, mut batch: PacketBatch) {
        if self.spare.len() < SPARE_BATCHES {
            batch.clear();
            self.spare.push(batch);
        }
    }

    /// Queues what is left in a batch read at `now`.
    pub(crate) fn push(&mut self, batch: PacketBatch, now: Instant) {
        let items: usize = (0..batch.len()).map(|i| items(&batch, i)).sum();
        if items == 0 {
            self.give_back(batch);
            return;
        }
        self.items += items;
        self.bytes += batch.bytes();
        self.entries.push_back(Entry {
            batch,
            at: now,
            next: 0,
        });
    }

    /// The next slots to process, about `quantum` bytes (at least one slot) of the oldest
    /// batch; CoDel decides for each slot first, and a drop takes the slot's last packet.
    pub(crate) fn next_chunk(&mut self, now: Instant, quantum: usize) -> Option<Chunk<'_>> {
        while self
            .entries
            .front()
            .is_some_and(|e| e.next >= e.batch.len())
        {
            if let Some(e) = self.entries.pop_front() {
                self.give_back(e.batch);
            }
        }
        let e = self.entries.front_mut()?;
        let start = e.next;
        let mut taken = 0;
        let mut dropped = 0;
        let sojourn = now.saturating_duration_since(e.at);
        while e.next < e.batch.len() && (taken == 0 || taken < quantum) {
            let i = e.next;
            let len = e.batch.get(i).len();
            if let Some(codel) = self.codel.as_mut()
                && len > 0
                && codel.should_drop(now, sojourn, self.bytes)
            {
                let keep = match e.batch.segment(i) {
                    0 => 0,
                    seg => (len - 1) / seg * seg,
                };
                e.batch.truncate(i, keep);
                self.bytes -= len - keep;
                self.items -= 1;
                dropped += 1;
            }
            let left = e.batch.get(i).len();
            self.bytes -= left;
            self.items -= items(&e.batch, i);
            taken += left;
            e.next += 1;
        }
        let e = self.entries.front()?;
        Some(Chunk {
            batch: &e.batch,
            slots: start..e.next,
            dropped,
        })
    }
}

#[cfg(test)]
#[path = "lane_tests.rs"]
mod tests;
