//! TCP coalescing (GRO) of decrypted packets before they are written to the TUN.
//!
//! Consecutive packets of one TCP flow (same addresses, ports, ACK, window, options; in-order
//! sequence numbers; equal payload sizes except possibly the last; only ACK/PSH flags; valid
//! checksums) become one large segment with a virtio-net GSO header, so the host's TCP stack
//! handles 64 KiB at a time. Everything else is written as it is. Only neighbours in a batch
//! are merged, which is where one flow's packets sit after a burst.

use std::io::IoSlice;

use crate::batch::{MAX_PACKET, PacketBatch};
use crate::offload::{
    F_NEEDS_CSUM, GSO_TCPV4, GSO_TCPV6, TCP, TCP_PSH, VnetHdr, be16, be32, checksum_add, fold,
    ipv4_header_checksum, pseudo_sum,
};

const TCP_ACK: u8 = 0x10;

/// The parts of a TCP packet coalescing looks at.
#[derive(Debug, Clone, Copy)]
struct Segment {
    v6: bool,
    ip_len: usize,
    hdr_len: usize,
    payload: usize,
    seq: u32,
    flags: u8,
}

/// A TCP packet that may be coalesced: plain IPv4 (no options, not a fragment) or IPv6 with
/// TCP as the next header, ACK with at most PSH besides, some payload, checksums valid.
fn segment(p: &[u8]) -> Option<Segment> {
    let (v6, ip_len) = match p.first()? >> 4 {
        4 if p.len() >= 40
            && p[0] == 0x45
            && p[9] == TCP
            && be16(p, 6) & 0x3fff == 0
            && usize::from(be16(p, 2)) == p.len() =>
        {
            (false, 20)
        }
        6 if p.len() >= 60 && p[6] == TCP && usize::from(be16(p, 4)) + 40 == p.len() => (true, 40),
        _ => return None,
    };
    let tcp_hdr = usize::from(p[ip_len + 12] >> 4) * 4;
    let hdr_len = ip_len + tcp_hdr;
    let flags = p[ip_len + 13];
    if tcp_hdr < 20 || hdr_len >= p.len() || flags & !TCP_PSH != TCP_ACK {
        return None;
    }
    if !v6 && fold(checksum_add(0, &p[..20])) != 0xffff {
        return None;
    }
    let tcp_sum = checksum_add(pseudo_sum(p, v6, p.len() - ip_len), &p[ip_len..]);
    if fold(tcp_sum) != 0xffff {
        return None;
    }
    Some(Segment {
        v6,
        ip_len,
        hdr_len,
        payload: p.len() - hdr_len,
        seq: be32(p, ip_len + 4),
        flags,
    })
}

/// True when `q` (described by `qs`) continues the flow whose first packet is `first`.
fn same_flow(first: &[u8], f: &Segment, q: &[u8], qs: &Segment) -> bool {
    if qs.v6 != f.v6 || qs.hdr_len != f.hdr_len {
        return false;
    }
    let ip_same = if f.v6 {
        // Version, traffic class, flow label, next header, hop limit, addresses.
        first[..4] == q[..4] && first[6..40] == q[6..40]
    } else {
        // TOS, DF, TTL, protocol, addresses (the ID and lengths differ).
        first[1] == q[1]
            && first[6] == q[6]
            && first[8..10] == q[8..10]
            && first[12..20] == q[12..20]
    };
    let t = f.ip_len;
    // Ports, ACK number, data offset, window and options; not the sequence or checksum.
    ip_same
        && first[t..t + 4] == q[t..t + 4]
        && first[t + 8..t + 13] == q[t + 8..t + 13]
        && first[t + 14..t + 16] == q[t + 14..t + 16]
        && first[t + 20..f.hdr_len] == q[t + 20..qs.hdr_len]
}

/// Merges TUN-bound packets. A merged segment is handed out as parts, never copied together:
/// its patched headers (kept here between batches) and each packet's payload where it lies in
/// the batch, for one vectored write.
pub struct Coalescer {
    head: Vec<u8>,
}

impl Default for Coalescer {
    fn default() -> Self {
        Self::new()
    }
}

impl Coalescer {
    pub fn new() -> Self {
        Self {
            head: Vec::with_capacity(128),
        }
    }

    /// Calls `write(parts)` once per write the TUN must do for `batch`: `parts[0]` is the
    /// virtio-net header, the rest is the packet, in order.
    pub fn writes<E>(
        &mut self,
        batch: &PacketBatch,
        mut write: impl FnMut(&[IoSlice<'_>]) -> Result<(), E>,
    ) -> Result<(), E> {
        let plain = VnetHdr::default().encode();
        let mut i = 0;
        while i < batch.len() {
            let first = batch.get(i);
            let Some(f) = segment(first) else {
                write(&[IoSlice::new(&plain), IoSlice::new(first)])?;
                i += 1;
                continue;
            };
            let mut next = i + 1;
            let mut total = first.len();
            let mut last = f;
            let mut expected = f.seq.wrapping_add(f.payload as u32);
            while next < batch.len() && last.payload == f.payload && last.flags & TCP_PSH == 0 {
                let q = batch.get(next);
                let Some(qs) = segment(q) else { break };
                if qs.seq != expected
                    || qs.payload > f.payload
                    || total + qs.payload > MAX_PACKET
                    || !same_flow(first, &f, q, &qs)
                {
                    break;
                }
                total += qs.payload;
                expected = expected.wrapping_add(qs.payload as u32);
                last = qs;
                next += 1;
            }
            if next == i + 1 {
                write(&[IoSlice::new(&plain), IoSlice::new(first)])?;
            } else {
                let vnet = self.merge_head(first, total, &f, last.flags).encode();
                let mut parts = Vec::with_capacity(next - i + 2);
                parts.push(IoSlice::new(&vnet));
                parts.push(IoSlice::new(&self.head));
                parts.extend((i..next).map(|k| IoSlice::new(&batch.get(k)[f.hdr_len..])));
                write(&parts)?;
            }
            i = next;
        }
        Ok(())
    }

    /// The headers of the merged segment (`total` bytes, starting with `first`) in `head`.
    fn merge_head(&mut self, first: &[u8], total: usize, f: &Segment, last_flags: u8) -> VnetHdr {
        self.head.clear();
        self.head.extend_from_slice(&first[..f.hdr_len]);
        let b = &mut self.head[..];
        if f.v6 {
            // total <= MAX_PACKET was checked, so the payload length fits.
            b[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes());
        } else {
            b[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            ipv4_header_checksum(b, 20);
        }
        let t = f.ip_len;
        b[t + 13] = last_flags;
        // A partial checksum: the pseudo-header sum, which the host completes or trusts.
        let partial = fold(pseudo_sum(b, f.v6, total - t));
        b[t + 16..t + 18].copy_from_slice(&partial.to_be_bytes());
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: if f.v6 { GSO_TCPV6 } else { GSO_TCPV4 },
            hdr_len: f.hdr_len as u16,
            gso_size: f.payload as u16,
            csum_start: t as u16,
            csum_offset: 16,
        }
    }
}
