//! TUN offloads in userspace: the virtio-net header, TCP segmentation (TSO) and UDP
//! segmentation (USO) of what the host hands us, and TCP coalescing (GRO) of what we hand the
//! host.
//!
//! With `IFF_VNET_HDR` and `TUNSETOFFLOAD(TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)` the kernel's
//! TCP sends us segments of up to 64 KiB with a virtio-net header, and takes such segments
//! from us: one read or write and one pass through the host's TCP stack per 64 KiB instead of
//! per 1.4 KiB. Peers only ever see ordinary MTU-sized packets with complete checksums: `split`
//! cuts a large segment (or completes a partial checksum) before encryption, `coalesce::Coalescer`
//! merges consecutive segments of one TCP flow after decryption, checksums verified first.
//! With `TUN_F_USO4 | TUN_F_USO6` too (Linux 6.2 and later), a sender using `UDP_SEGMENT`
//! (QUIC) hands the TUN one super-datagram, which `split` cuts into its datagrams, each with
//! its own UDP length and complete checksum, the last one shorter. Received UDP is never
//! coalesced toward the host: UDP has no sequence numbers to check a merge against, and a
//! receiver without `UDP_GRO` would get one large datagram where the sender sent many.
//! Pure functions over byte slices; the Linux TUN calls them.

use crate::batch::{NO_ADDR, PacketBatch};

/// The most segments one read may split into (a 64 KiB segment needs an MSS of 512 or more);
/// wireguard-go has the same bound.
pub const MAX_SEGMENTS: usize = 128;

/// `sizeof(struct virtio_net_hdr)`, the TUN default (`TUNSETVNETHDRSZ`).
pub const VNET_HDR_LEN: usize = 10;

pub(crate) const F_NEEDS_CSUM: u8 = 1;
const GSO_NONE: u8 = 0;
pub(crate) const GSO_TCPV4: u8 = 1;
pub(crate) const GSO_TCPV6: u8 = 4;
/// `VIRTIO_NET_HDR_GSO_UDP_L4`: UDP segmentation, IPv4 or IPv6 (the IP header says which).
pub(crate) const GSO_UDP_L4: u8 = 5;
pub(crate) const UDP: u8 = 17;
const UDP_HDR_LEN: usize = 8;
const GSO_ECN: u8 = 0x80;
pub(crate) const TCP: u8 = 6;
const TCP_FIN: u8 = 0x01;
pub(crate) const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// A packet the kernel handed us that cannot be what its header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    #[error("a virtio-net header or packet is truncated or inconsistent")]
    Malformed,
    #[error("unsupported GSO type {0}")]
    GsoType(u8),
}

/// The virtio-net header in front of every packet on an `IFF_VNET_HDR` TUN (native endian).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    pub fn parse(b: &[u8]) -> Result<Self, OffloadError> {
        let b: &[u8; VNET_HDR_LEN] = b
            .get(..VNET_HDR_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(OffloadError::Malformed)?;
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Ok(Self {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        })
    }

    pub fn encode(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        b
    }
}

/// Adds `data` to a one's-complement sum (big-endian 16-bit words; an odd tail is padded).
///
/// The bulk is summed in the machine's byte order, four 32-bit words a step into 64-bit lanes
/// (no carry is lost before 16 GiB, and the compiler turns the lanes into vector adds), then
/// folded and put in network order: a one's-complement sum taken in the other byte order is
/// the byte swap of the right one (RFC 1071, 2(B)). The tail, under 16 bytes, is summed word by
/// word. About 3x faster than a word at a time (docs/benchmarks.md). `sum` is a running sum
/// (a pseudo-header's, or an earlier result: callers stay far below 2^48); fold the result
/// with [`fold`] like any other sum.
pub(crate) fn checksum_add(sum: u64, data: &[u8]) -> u64 {
    let mut lanes = [0u64; 4];
    let mut blocks = data.chunks_exact(16);
    for b in &mut blocks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let w = [b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]];
            *lane += u64::from(u32::from_ne_bytes(w));
        }
    }
    // Each lane is below 2^62 here, so their sum does not overflow either.
    let bulk = u16::from_be(fold(lanes.iter().sum()));
    sum_by_words(sum + u64::from(bulk), blocks.remainder())
}

/// The plain sum: 32-bit big-endian words, then a 16-bit one, then an odd byte padded.
fn sum_by_words(mut sum: u64, data: &[u8]) -> u64 {
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        sum += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    let rest = words.remainder();
    let mut pairs = rest.chunks_exact(2);
    for p in &mut pairs {
        sum += u64::from(u16::from_be_bytes([p[0], p[1]]));
    }
    if let [last] = pairs.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

/// Folds a sum to 16 bits (not complemented).
pub fn fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // The loop leaves at most 16 bits.
    sum as u16
}

pub(crate) fn be16(p: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([p[at], p[at + 1]])
}

pub(crate) fn be32(p: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]])
}

/// The TCP pseudo-header sum for a TCP segment of `tcp_len` bytes in `packet`.
pub(crate) fn pseudo_sum(packet: &[u8], v6: bool, tcp_len: usize) -> u64 {
    pseudo_sum_of(packet, v6, TCP, tcp_len)
}

/// The pseudo-header sum for `len` bytes of protocol `proto` in `packet`.
pub(crate) fn pseudo_sum_of(packet: &[u8], v6: bool, proto: u8, len: usize) -> u64 {
    let addrs = if v6 {
        packet.get(8..40)
    } else {
        packet.get(12..20)
    };
    checksum_add(u64::from(proto) + len as u64, addrs.unwrap_or(&[]))
}

pub(crate) fn ipv4_header_checksum(packet: &mut [u8], ihl: usize) {
    packet[10] = 0;
    packet[11] = 0;
    let sum = !fold(checksum_add(0, &packet[..ihl]));
    packet[10..12].copy_from_slice(&sum.to_be_bytes());
}

/// Completes a partial checksum (`csum_start`/`csum_offset`) in place.
fn complete_checksum(packet: &mut [u8], start: usize, offset: usize) -> Result<(), OffloadError> {
    let at = start + offset;
    if at + 2 > packet.len() {
        return Err(OffloadError::Malformed);
    }
    // The field holds the pseudo-header sum; the checksum covers it and everything after start.
    let sum = !fold(checksum_add(0, &packet[start..]));
    packet[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    Ok(())
}

/// Turns one read from the TUN (`hdr` + `packet`) into plain IP packets with complete
/// checksums, appended to `out`. `packet` is scratch: it may be modified.
pub fn split(hdr: VnetHdr, packet: &mut [u8], out: &mut PacketBatch) -> Result<(), OffloadError> {
    let gso = hdr.gso_type & !GSO_ECN;
    if gso == GSO_NONE {
        if hdr.flags & F_NEEDS_CSUM != 0 {
            complete_checksum(packet, hdr.csum_start.into(), hdr.csum_offset.into())?;
        }
        out.push(packet, NO_ADDR);
        return Ok(());
    }
    let v6 = match gso {
        GSO_TCPV4 => false,
        GSO_TCPV6 => true,
        GSO_UDP_L4 => return split_udp(hdr, packet, out),
        other => return Err(OffloadError::GsoType(other)),
    };
    let ip_len = usize::from(hdr.csum_start);
    let tcp_hdr_len = packet
        .get(ip_len + 12)
        .map(|b| usize::from(b >> 4) * 4)
        .ok_or(OffloadError::Malformed)?;
    let hdr_len = ip_len + tcp_hdr_len;
    let mss = usize::from(hdr.gso_size);
    if mss == 0 || tcp_hdr_len < 20 || hdr_len >= packet.len() || (!v6 && ip_len < 20) {
        return Err(OffloadError::Malformed);
    }
    let (headers, payload) = packet.split_at(hdr_len);
    let seq = be32(headers, ip_len + 4);
    let id = if v6 { 0 } else { be16(headers, 4) };
    let flags = headers[ip_len + 13];
    let chunks = payload.len().div_ceil(mss);
    if chunks > MAX_SEGMENTS {
        return Err(OffloadError::Malformed);
    }
    for (i, chunk) in payload.chunks(mss).enumerate() {
        let total = hdr_len + chunk.len();
        let slot = out.next_slot();
        let Some(s) = slot.get_mut(..total) else {
            return Err(OffloadError::Malformed);
        };
        s[..hdr_len].copy_from_slice(headers);
        s[hdr_len..].copy_from_slice(chunk);
        set_segment_ip_header(s, v6, ip_len, id.wrapping_add(i as u16))?;
        let seg_seq = seq.wrapping_add((i * mss) as u32);
        s[ip_len + 4..ip_len + 8].copy_from_slice(&seg_seq.to_be_bytes());
        let mut f = flags;
        if i > 0 {
            f &= !TCP_CWR;
        }
        if i + 1 < chunks {
            f &= !(TCP_FIN | TCP_PSH);
        }
        s[ip_len + 13] = f;
        set_tcp_checksum(s, v6, ip_len);
        out.commit(total, NO_ADDR);
    }
    Ok(())
}

/// The IP header of segment `s` (its whole length is `s.len()`): the IPv6 payload length, or
/// the IPv4 total length, the segment's IP ID (consecutive IDs, as the kernel's own
/// segmentation gives; they wrap on purpose) and the header checksum.
fn set_segment_ip_header(
    s: &mut [u8],
    v6: bool,
    ip_len: usize,
    id: u16,
) -> Result<(), OffloadError> {
    let total = s.len();
    if v6 {
        let plen = u16::try_from(total - 40).map_err(|_| OffloadError::Malformed)?;
        s[4..6].copy_from_slice(&plen.to_be_bytes());
    } else {
        let tlen = u16::try_from(total).map_err(|_| OffloadError::Malformed)?;
        s[2..4].copy_from_slice(&tlen.to_be_bytes());
        s[4..6].copy_from_slice(&id.to_be_bytes());
        ipv4_header_checksum(s, ip_len);
    }
    Ok(())
}

/// Cuts a UDP super-datagram (`UDP_SEGMENT` on the host) into datagrams of `gso_size` bytes
/// of payload, the last one shorter, each with its IP and UDP lengths and complete checksums.
fn split_udp(hdr: VnetHdr, packet: &mut [u8], out: &mut PacketBatch) -> Result<(), OffloadError> {
    let v6 = match packet.first().map(|b| b >> 4) {
        Some(4) => false,
        Some(6) => true,
        _ => return Err(OffloadError::Malformed),
    };
    let ip_len = usize::from(hdr.csum_start);
    let hdr_len = ip_len + UDP_HDR_LEN;
    let size = usize::from(hdr.gso_size);
    if size == 0 || hdr_len >= packet.len() || ip_len < if v6 { 40 } else { 20 } {
        return Err(OffloadError::Malformed);
    }
    let (headers, payload) = packet.split_at(hdr_len);
    let id = if v6 { 0 } else { be16(headers, 4) };
    if payload.len().div_ceil(size) > MAX_SEGMENTS {
        return Err(OffloadError::Malformed);
    }
    for (i, chunk) in payload.chunks(size).enumerate() {
        let total = hdr_len + chunk.len();
        let slot = out.next_slot();
        let Some(s) = slot.get_mut(..total) else {
            return Err(OffloadError::Malformed);
        };
        s[..hdr_len].copy_from_slice(headers);
        s[hdr_len..].copy_from_slice(chunk);
        set_segment_ip_header(s, v6, ip_len, id.wrapping_add(i as u16))?;
        let udp_len = u16::try_from(total - ip_len).map_err(|_| OffloadError::Malformed)?;
        s[ip_len + 4..ip_len + 6].copy_from_slice(&udp_len.to_be_bytes());
        s[ip_len + 6] = 0;
        s[ip_len + 7] = 0;
        let sum = !fold(checksum_add(
            pseudo_sum_of(s, v6, UDP, usize::from(udp_len)),
            &s[ip_len..],
        ));
        // 0 means "no checksum" in UDP; a computed 0 is sent as all ones (RFC 768).
        let sum = if sum == 0 { 0xffff } else { sum };
        s[ip_len + 6..ip_len + 8].copy_from_slice(&sum.to_be_bytes());
        out.commit(total, NO_ADDR);
    }
    Ok(())
}

/// Writes the complete TCP checksum of the segment in `packet`.
fn set_tcp_checksum(packet: &mut [u8], v6: bool, ip_len: usize) {
    let tcp_len = packet.len() - ip_len;
    packet[ip_len + 16] = 0;
    packet[ip_len + 17] = 0;
    let sum = !fold(checksum_add(
        pseudo_sum(packet, v6, tcp_len),
        &packet[ip_len..],
    ));
    packet[ip_len + 16..ip_len + 18].copy_from_slice(&sum.to_be_bytes());
}

// Its tests (offload_tests.rs) split with `split` and coalesce with `coalesce::Coalescer`, so
// they hang off the crate root: this file does not import coalesce.rs, which imports it.
