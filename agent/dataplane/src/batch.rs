//! Caller-owned packet buffers, filled and drained a batch at a time.
//!
//! A `PacketBatch` is one contiguous allocation cut into equal slots, plus a length and (for
//! datagrams) a socket address per filled slot. I/O reads into the slots and writes from them;
//! the data plane encrypts and decrypts straight into the next free slot, so a packet is never
//! copied between the socket and the cipher. The allocation is zeroed lazily by the OS, so a
//! 64 KiB slot that only ever carries 1.5 KiB packets costs 1.5 KiB of resident memory.

use std::net::{Ipv4Addr, SocketAddr};

use crate::source::Source;

/// Enough for any IP packet (the IPv4/IPv6 length fields are 16 bits).
pub const MAX_PACKET: usize = 65_535;
/// What WireGuard adds to a packet: type, receiver index, counter, and the AEAD tag.
pub(crate) const WG_OVERHEAD: usize = 32;
/// A slot that holds any packet after encryption, and any handshake message.
pub const MAX_DATAGRAM: usize = MAX_PACKET + WG_OVERHEAD;
/// How many packets one system call moves when batching is on.
pub(crate) const DEFAULT_BATCH: usize = 64;

/// The address of a packet that has none (TUN packets).
pub const NO_ADDR: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);

/// Equal-size packet slots in one buffer; see the module docs.
#[derive(Debug, Clone)]
pub struct PacketBatch {
    buf: Vec<u8>,
    lens: Vec<usize>,
    addrs: Vec<SocketAddr>,
    /// Per slot: the local address it arrived at, or the one to send it from (sticky source).
    srcs: Vec<Option<Source>>,
    /// Per slot: the size of each datagram in it when UDP GRO put several there, else 0.
    segments: Vec<usize>,
    slot_size: usize,
    /// Receive calls fill at most this many slots; outputs may grow past it.
    max: usize,
}

impl PacketBatch {
    /// A batch of `max` slots of `slot_size` bytes each.
    pub fn new(slot_size: usize, max: usize) -> Self {
        let max = max.max(1);
        Self {
            buf: vec![0; slot_size * max],
            lens: Vec::with_capacity(max),
            addrs: Vec::with_capacity(max),
            srcs: Vec::with_capacity(max),
            segments: Vec::with_capacity(max),
            slot_size,
            max,
        }
    }

    /// A batch for TUN packets (reads from the TUN, plaintext written to it).
    pub fn for_packets(max: usize) -> Self {
        Self::new(MAX_PACKET, max)
    }

    /// A batch for UDP datagrams (anything WireGuard sends or receives).
    pub fn for_datagrams(max: usize) -> Self {
        Self::new(MAX_DATAGRAM, max)
    }

    pub fn len(&self) -> usize {
        self.lens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// How many slots a receive call may fill.
    pub fn max(&self) -> usize {
        self.max
    }

    pub(crate) fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Forgets the packets; keeps the memory.
    pub fn clear(&mut self) {
        self.lens.clear();
        self.addrs.clear();
        self.srcs.clear();
        self.segments.clear();
    }

    /// True when a receive call may not add another packet.
    pub fn is_full(&self) -> bool {
        self.lens.len() >= self.max
    }

    /// Packet `i` (empty if `i` is out of range).
    pub fn get(&self, i: usize) -> &[u8] {
        let len = self.lens.get(i).copied().unwrap_or(0);
        let start = i * self.slot_size;
        self.buf.get(start..start + len).unwrap_or(&[])
    }

    /// The address of packet `i`: where it came from or where it goes.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.addrs.get(i).copied().unwrap_or(NO_ADDR)
    }

    /// Every packet with its address.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], SocketAddr)> + '_ {
        (0..self.len()).map(|i| (self.get(i), self.addr(i)))
    }

    /// The next free slot, whole; the batch grows by one slot when it has none left.
    /// Write a packet into it, then `commit` its length.
    pub(crate) fn next_slot(&mut self) -> &mut [u8] {
        let i = self.lens.len();
        let start = i * self.slot_size;
        if self.buf.len() < start + self.slot_size {
            self.grow(i + 1);
        }
        &mut self.buf[start..start + self.slot_size]
    }

    /// Doubles the slots (at least to `slots`) in a fresh zeroed allocation, which the OS
    /// maps lazily, copying only the bytes of filled packets: growing never touches memory
    /// that no packet uses.
    fn grow(&mut self, slots: usize) {
        let have = self.buf.len() / self.slot_size.max(1);
        let mut buf = vec![0u8; slots.max(have * 2) * self.slot_size];
        for (k, &len) in self.lens.iter().enumerate() {
            let at = k * self.slot_size;
            buf[at..at + len].copy_from_slice(&self.buf[at..at + len]);
        }
        self.buf = buf;
    }

    /// Records that the next free slot now holds `len` bytes for or from `addr`.
    pub fn commit(&mut self, len: usize, addr: SocketAddr) {
        // next_slot() grew the buffer; a commit without it is clamped to an empty packet.
        let start = self.lens.len() * self.slot_size;
        let len = if self.buf.len() >= start + self.slot_size {
            len.min(self.slot_size)
        } else {
            0
        };
        self.lens.push(len);
        self.addrs.push(addr);
        self.srcs.push(None);
        self.segments.push(0);
    }

    /// Sets the local address of the packet committed last (see `src`).
    pub(crate) fn set_src(&mut self, src: Option<Source>) {
        if let Some(s) = self.srcs.last_mut() {
            *s = src;
        }
    }

    /// The local address of packet `i`: the one a datagram arrived at, or the one to send it
    /// from (none: the kernel chooses).
    pub fn src(&self, i: usize) -> Option<Source> {
        self.srcs.get(i).copied().flatten()
    }

    /// Like `datagrams`, with each datagram's local address.
    pub fn datagrams_to(&self) -> impl Iterator<Item = (&[u8], SocketAddr, Option<Source>)> + '_ {
        (0..self.len()).flat_map(move |i| {
            let slot = self.get(i);
            let seg = match self.segments.get(i) {
                Some(&s) if s > 0 => s,
                _ => slot.len().max(1),
            };
            let (addr, src) = (self.addr(i), self.src(i));
            slot.chunks(seg).map(move |d| (d, addr, src))
        })
    }

    /// Like `commit`, for a slot that holds back-to-back datagrams of `segment` bytes each
    /// (the last may be shorter), as UDP GRO delivers them.
    pub(crate) fn commit_segmented(&mut self, len: usize, addr: SocketAddr, segment: usize) {
        self.commit(len, addr);
        if let Some(s) = self.segments.last_mut() {
            *s = if segment >= len { 0 } else { segment };
        }
    }

    /// The datagram size of slot `i` when UDP GRO put several there, else 0.
    pub fn segment(&self, i: usize) -> usize {
        self.segments.get(i).copied().unwrap_or(0)
    }

    /// Shortens slot `i` to `len` bytes (a queue took its tail, or dropped it: 0).
    pub fn truncate(&mut self, i: usize, len: usize) {
        if let Some(l) = self.lens.get_mut(i) {
            *l = len.min(*l);
        }
    }

    /// Sets the address of packet `i` (where it goes).
    pub(crate) fn set_addr(&mut self, i: usize, addr: SocketAddr) {
        if let Some(a) = self.addrs.get_mut(i) {
            *a = addr;
        }
    }

    /// Puts `head` in front of packet `i`, in its own slot: the packet moves up by the head's
    /// length. False (and nothing changes) when `i` is not a filled slot or the slot has no
    /// room for both.
    pub fn prepend(&mut self, i: usize, head: &[u8]) -> bool {
        let Some(&len) = self.lens.get(i) else {
            return false;
        };
        if len + head.len() > self.slot_size {
            return false;
        }
        let start = i * self.slot_size;
        let slot = &mut self.buf[start..start + self.slot_size];
        slot.copy_within(..len, head.len());
        slot[..head.len()].copy_from_slice(head);
        self.lens[i] = len + head.len();
        true
    }

    /// The bytes the filled slots hold.
    pub fn bytes(&self) -> usize {
        self.lens.iter().sum()
    }

    /// The datagrams of slot `i` (one, or the GRO segments), with its address.
    pub(crate) fn slot_datagrams(
        &self,
        i: usize,
    ) -> impl Iterator<Item = (&[u8], SocketAddr)> + '_ {
        let slot = self.get(i);
        let seg = match self.segment(i) {
            0 => slot.len().max(1),
            s => s,
        };
        let addr = self.addr(i);
        slot.chunks(seg).map(move |d| (d, addr))
    }

    /// Every datagram with its address, GRO slots cut into their datagrams.
    pub fn datagrams(&self) -> impl Iterator<Item = (&[u8], SocketAddr)> + '_ {
        self.datagrams_to().map(|(d, addr, _)| (d, addr))
    }

    /// The first `n` slots (at most `max`), whole and in order, for a vectored read into an
    /// empty batch; `commit` each filled one afterwards, in order.
    pub(crate) fn free_slots(&mut self, n: usize) -> std::slice::ChunksExactMut<'_, u8> {
        let n = n.min(self.max);
        let need = n * self.slot_size;
        if self.buf.len() < need {
            self.grow(n);
        }
        self.buf[..need].chunks_exact_mut(self.slot_size.max(1))
    }

    /// Slot `i` whole, to work on in place (empty if `i` is not a filled slot).
    pub(crate) fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        if i >= self.lens.len() {
            return &mut [];
        }
        let start = i * self.slot_size;
        self.buf
            .get_mut(start..start + self.slot_size)
            .unwrap_or(&mut [])
    }

    /// Drops the empty slots, moving the later ones down (their addresses with them).
    pub(crate) fn retain_nonempty(&mut self) {
        let mut kept = 0;
        for i in 0..self.lens.len() {
            let len = self.lens[i];
            if len == 0 {
                continue;
            }
            if kept != i {
                let (from, to) = (i * self.slot_size, kept * self.slot_size);
                self.buf.copy_within(from..from + len, to);
                self.lens[kept] = len;
                self.addrs[kept] = self.addrs[i];
                self.srcs[kept] = self.srcs[i];
                self.segments[kept] = self.segments[i];
            }
            kept += 1;
        }
        self.lens.truncate(kept);
        self.addrs.truncate(kept);
        self.srcs.truncate(kept);
        self.segments.truncate(kept);
    }

    /// Copies `packet` into the next slot (for tests, the in-memory devices, and benches).
    pub fn push(&mut self, packet: &[u8], addr: SocketAddr) {
        let slot = self.next_slot();
        let n = packet.len().min(slot.len());
        slot[..n].copy_from_slice(&packet[..n]);
        self.commit(n, addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_hold_packets_and_addresses_and_grow_past_max() {
        let a: SocketAddr = "192.0.2.1:51820".parse().expect("addr");
        let mut b = PacketBatch::new(16, 2);
        b.push(b"one", a);
        b.push(b"two", NO_ADDR);
        assert!(b.is_full());
        b.push(b"a packet longer than sixteen", a);
        assert_eq!(b.len(), 3);
        assert_eq!(b.get(0), b"one");
        assert_eq!(b.addr(0), a);
        assert_eq!(b.get(2), b"a packet longer ", "truncated to the slot");
        assert_eq!(b.get(9), b"", "out of range is empty");
        b.commit_segmented(0, a, 0);
        b.clear();
        let slot = b.next_slot();
        slot[..10].copy_from_slice(b"aaaabbbbcc");
        b.commit_segmented(10, a, 4);
        b.push(b"d", a);
        let all: Vec<&[u8]> = b.datagrams().map(|(d, _)| d).collect();
        assert_eq!(all, vec![&b"aaaa"[..], b"bbbb", b"cc", b"d"]);
        b.clear();
        assert!(b.is_empty());
        assert_eq!(b.get(0), b"");
    }

    #[test]
    fn empty_slots_are_dropped_and_the_rest_keep_their_order_and_addresses() {
        let a: SocketAddr = "192.0.2.1:1".parse().expect("addr");
        let c: SocketAddr = "192.0.2.3:3".parse().expect("addr");
        let mut b = PacketBatch::new(16, 4);
        for (p, addr) in [
            (&b"one"[..], a),
            (b"x", NO_ADDR),
            (b"three", c),
            (b"y", NO_ADDR),
        ] {
            b.push(p, addr);
        }
        b.truncate(1, 0);
        b.truncate(3, 0);
        b.slot_mut(0)[0] = b'O';
        b.retain_nonempty();
        assert_eq!(
            b.iter().collect::<Vec<_>>(),
            vec![(&b"One"[..], a), (&b"three"[..], c)]
        );
        assert!(b.slot_mut(2).is_empty(), "not a filled slot");
    }
}
