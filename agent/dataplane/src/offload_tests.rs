//! Segmentation (`offload::split`) and its round trip through `coalesce::Coalescer`.

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use crate::batch::PacketBatch;
use crate::coalesce::Coalescer;
use crate::offload::*;

const ACK: u8 = 0x10;
const PSH: u8 = 0x08;

/// A TCP packet with valid checksums; `opts` are TCP options (a multiple of 4 bytes).
fn tcp(v6: bool, seq: u32, flags: u8, opts: &[u8], payload: &[u8]) -> Vec<u8> {
    let tcp_len = 20 + opts.len() + payload.len();
    let mut p = Vec::new();
    if v6 {
        p.extend_from_slice(&[0x60, 0, 0, 0]);
        p.extend_from_slice(&(tcp_len as u16).to_be_bytes());
        p.extend_from_slice(&[TCP, 64]);
        p.extend_from_slice(&Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).octets());
        p.extend_from_slice(&Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).octets());
    } else {
        p.extend_from_slice(&[0x45, 0]);
        p.extend_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
        p.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, TCP, 0, 0]);
        p.extend_from_slice(&Ipv4Addr::new(10, 64, 0, 1).octets());
        p.extend_from_slice(&Ipv4Addr::new(10, 64, 0, 2).octets());
        ipv4_header_checksum(&mut p, 20);
    }
    let ip_len = p.len();
    p.extend_from_slice(&40000u16.to_be_bytes());
    p.extend_from_slice(&5201u16.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&77u32.to_be_bytes());
    p.push((((20 + opts.len()) / 4) << 4) as u8);
    p.push(flags);
    p.extend_from_slice(&[0x01, 0xf6, 0, 0, 0, 0]);
    p.extend_from_slice(opts);
    p.extend_from_slice(payload);
    let sum = !fold(checksum_add(pseudo_sum(&p, v6, tcp_len), &p[ip_len..]));
    p[ip_len + 16..ip_len + 18].copy_from_slice(&sum.to_be_bytes());
    p
}

fn checksum_ok(p: &[u8], v6: bool) -> bool {
    let ip_len = if v6 { 40 } else { 20 };
    (v6 || fold(checksum_add(0, &p[..20])) == 0xffff)
        && fold(checksum_add(
            pseudo_sum(p, v6, p.len() - ip_len),
            &p[ip_len..],
        )) == 0xffff
}

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

#[test]
fn checksum_matches_rfc1071_example_and_header_round_trips() {
    // RFC 1071 section 3: the words 0001 f203 f4f5 f6f7 sum to ddf2.
    assert_eq!(
        fold(checksum_add(
            0,
            &[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]
        )),
        0xddf2
    );
    assert_eq!(
        fold(checksum_add(0, &[0xab])),
        0xab00,
        "an odd byte is padded"
    );
    let h = VnetHdr {
        flags: 1,
        gso_type: 4,
        hdr_len: 72,
        gso_size: 1368,
        csum_start: 40,
        csum_offset: 16,
    };
    assert_eq!(VnetHdr::parse(&h.encode()), Ok(h));
    assert_eq!(VnetHdr::parse(&[0; 3]), Err(OffloadError::Malformed));
}

fn segments_round_trip(v6: bool) {
    let opts = [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]; // NOP NOP timestamps
    let data = payload(3000);
    // What the kernel hands us: one 3000-byte segment, MSS 1000, partial checksum.
    let mut big = tcp(v6, 1_000_000, ACK | PSH, &opts, &data);
    let ip_len = if v6 { 40 } else { 20 };
    let partial = fold(pseudo_sum(&big, v6, big.len() - ip_len));
    big[ip_len + 16..ip_len + 18].copy_from_slice(&partial.to_be_bytes());
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 },
        hdr_len: (ip_len + 32) as u16,
        gso_size: 1000,
        csum_start: ip_len as u16,
        csum_offset: 16,
    };
    let mut out = PacketBatch::for_packets(8);
    split(hdr, &mut big.clone(), &mut out).expect("split");
    assert_eq!(out.len(), 3);
    let mut joined = Vec::new();
    for (i, (seg, _)) in out.iter().enumerate() {
        assert!(checksum_ok(seg, v6), "segment {i} checksums");
        assert_eq!(
            be32(seg, ip_len + 4),
            1_000_000 + 1000 * i as u32,
            "sequence"
        );
        let flags = seg[ip_len + 13];
        assert_eq!(flags & PSH != 0, i == 2, "PSH only on the last segment");
        if !v6 {
            assert_eq!(be16(seg, 4), 0x1234 + i as u16, "consecutive IP IDs");
        }
        joined.extend_from_slice(&seg[ip_len + 32..]);
    }
    assert_eq!(joined, data);

    // Coalescing the segments gives back the kernel's packet, and splitting that the segments.
    let mut writes = Vec::new();
    Coalescer::new()
        .writes(&out, |parts| {
            writes.push(one_write(parts));
            Ok::<(), ()>(())
        })
        .expect("writes");
    assert_eq!(writes.len(), 1, "three segments, one write");
    let (h, merged) = &writes[0];
    assert_eq!(*h, hdr);
    assert_eq!(merged, &big);
    let mut again = PacketBatch::for_packets(8);
    split(*h, &mut merged.clone(), &mut again).expect("split");
    assert!(again.iter().map(|(p, _)| p).eq(out.iter().map(|(p, _)| p)));
}

#[test]
fn ipv4_segments_round_trip_through_split_and_coalesce() {
    segments_round_trip(false);
}

#[test]
fn ipv6_segments_round_trip_through_split_and_coalesce() {
    segments_round_trip(true);
}

#[test]
fn a_partial_checksum_without_gso_is_completed() {
    let mut p = tcp(false, 5, ACK, &[], &payload(101));
    let partial = fold(pseudo_sum(&p, false, p.len() - 20));
    p[36..38].copy_from_slice(&partial.to_be_bytes());
    assert!(!checksum_ok(&p, false));
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        csum_start: 20,
        csum_offset: 16,
        ..Default::default()
    };
    let mut out = PacketBatch::for_packets(1);
    split(hdr, &mut p, &mut out).expect("split");
    assert!(checksum_ok(out.get(0), false));
}

/// One write's parts as the TUN reads them: the virtio-net header, then the packet.
fn one_write(parts: &[std::io::IoSlice<'_>]) -> (VnetHdr, Vec<u8>) {
    let hdr = VnetHdr::parse(&parts[0]).expect("a virtio-net header first");
    assert_eq!(parts[0].len(), VNET_HDR_LEN);
    (
        hdr,
        parts[1..].iter().flat_map(|p| p.iter().copied()).collect(),
    )
}

fn write_count(packets: &[Vec<u8>]) -> usize {
    let mut batch = PacketBatch::for_packets(8);
    for p in packets {
        batch.push(p, crate::batch::NO_ADDR);
    }
    let mut n = 0;
    Coalescer::new()
        .writes(&batch, |_| {
            n += 1;
            Ok::<(), ()>(())
        })
        .expect("writes");
    n
}

#[test]
fn only_consecutive_valid_segments_of_one_flow_are_merged() {
    let d = payload(100);
    let a = |seq| tcp(false, seq, ACK, &[], &d);
    assert_eq!(write_count(&[a(0), a(100), a(200)]), 1);
    assert_eq!(write_count(&[a(0), a(150)]), 2, "a sequence gap");
    assert_eq!(
        write_count(&[a(0), tcp(true, 100, ACK, &[], &d)]),
        2,
        "another family"
    );
    assert_eq!(
        write_count(&[a(0), tcp(false, 100, ACK | 0x02, &[], &d)]),
        2,
        "SYN"
    );
    assert_eq!(
        write_count(&[tcp(false, 0, ACK | PSH, &[], &d), a(100)]),
        2,
        "PSH ends a run"
    );
    assert_eq!(
        write_count(&[tcp(false, 0, ACK, &[], &d[..50]), a(50)]),
        2,
        "a short one ends a run"
    );
    let mut bad = a(100);
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    assert_eq!(
        write_count(&[a(0), bad]),
        2,
        "a bad checksum is never vouched for"
    );
    let mut other_port = a(100);
    other_port[21] ^= 1;
    assert_eq!(write_count(&[a(0), other_port]), 2, "another flow");
}

/// The checksum as RFC 1071 defines it: 16-bit big-endian words summed, an odd tail padded.
fn checksum_by_words(sum: u64, data: &[u8]) -> u16 {
    let mut s = sum;
    for w in data.chunks(2) {
        s += u64::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)]));
    }
    fold(s)
}

proptest! {
    /// The lane-by-lane sum folds to what the word-by-word definition gives, for every length
    /// and starting sum (a pseudo-header sum is passed in).
    #[test]
    fn checksum_add_equals_the_word_by_word_sum(
        data in proptest::collection::vec(any::<u8>(), 0..2000),
        start in 0u64..(1 << 40),
    ) {
        prop_assert_eq!(fold(checksum_add(start, &data)), checksum_by_words(start, &data));
    }
}

/// All ones everywhere, up to a 64 KiB segment: every lane and every fold at its largest.
#[test]
fn checksum_add_keeps_every_carry() {
    for len in (0..100).chain([65_535, 65_536]) {
        let data = vec![0xffu8; len];
        assert_eq!(
            fold(checksum_add(1 << 40, &data)),
            checksum_by_words(1 << 40, &data),
            "{len} bytes of 0xff"
        );
    }
}

proptest! {
    #[test]
    fn arbitrary_reads_never_panic(
        head in proptest::collection::vec(any::<u8>(), VNET_HDR_LEN),
        body in proptest::collection::vec(any::<u8>(), 0..3000),
    ) {
        let hdr = VnetHdr::parse(&head).expect("10 bytes");
        let mut out = PacketBatch::new(2048, 4);
        let _ = split(hdr, &mut body.clone(), &mut out);
        let _ = Coalescer::new().writes(&out, |_| Ok::<(), ()>(()));
    }
}

/// A UDP super-datagram as a `UDP_SEGMENT` sender hands it to the TUN: one IP header, one UDP
/// header with the whole length, a partial (pseudo-header) checksum.
fn udp_super(v6: bool, data: &[u8]) -> Vec<u8> {
    let udp_len = 8 + data.len();
    let mut p = Vec::new();
    if v6 {
        p.extend_from_slice(&[0x60, 0, 0, 0]);
        p.extend_from_slice(&(udp_len as u16).to_be_bytes());
        p.extend_from_slice(&[UDP, 64]);
        p.extend_from_slice(&Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).octets());
        p.extend_from_slice(&Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).octets());
    } else {
        p.extend_from_slice(&[0x45, 0]);
        p.extend_from_slice(&((20 + udp_len) as u16).to_be_bytes());
        p.extend_from_slice(&[0x43, 0x21, 0x40, 0, 64, UDP, 0, 0]);
        p.extend_from_slice(&Ipv4Addr::new(10, 64, 0, 1).octets());
        p.extend_from_slice(&Ipv4Addr::new(10, 64, 0, 2).octets());
        ipv4_header_checksum(&mut p, 20);
    }
    let ip_len = p.len();
    p.extend_from_slice(&4433u16.to_be_bytes());
    p.extend_from_slice(&5353u16.to_be_bytes());
    p.extend_from_slice(&(udp_len as u16).to_be_bytes());
    let partial = fold(pseudo_sum_of(&p, v6, UDP, udp_len));
    p.extend_from_slice(&partial.to_be_bytes());
    p.extend_from_slice(data);
    let _ = ip_len;
    p
}

fn udp_hdr(v6: bool, size: u16) -> VnetHdr {
    let ip_len: u16 = if v6 { 40 } else { 20 };
    VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_UDP_L4,
        hdr_len: ip_len + 8,
        gso_size: size,
        csum_start: ip_len,
        csum_offset: 6,
    }
}

fn udp_segments_are_whole_datagrams(v6: bool) {
    let ip_len = if v6 { 40 } else { 20 };
    // 3 full datagrams of 1200 bytes and a short last one of 345.
    let data = payload(3 * 1200 + 345);
    let mut big = udp_super(v6, &data);
    let mut out = PacketBatch::for_packets(8);
    split(udp_hdr(v6, 1200), &mut big, &mut out).expect("split");
    assert_eq!(out.len(), 4);
    let mut joined = Vec::new();
    for (i, (d, _)) in out.iter().enumerate() {
        let want = if i == 3 { 345 } else { 1200 };
        assert_eq!(d.len(), ip_len + 8 + want, "datagram {i}");
        assert_eq!(usize::from(be16(d, ip_len + 4)), 8 + want, "UDP length {i}");
        if v6 {
            assert_eq!(usize::from(be16(d, 4)), 8 + want, "payload length {i}");
        } else {
            assert_eq!(usize::from(be16(d, 2)), 20 + 8 + want, "total length {i}");
            assert_eq!(
                fold(checksum_add(0, &d[..20])),
                0xffff,
                "IP header checksum {i}"
            );
            assert_eq!(be16(d, 4), 0x4321 + i as u16, "consecutive IP IDs");
        }
        let sum = checksum_add(pseudo_sum_of(d, v6, UDP, 8 + want), &d[ip_len..]);
        assert_eq!(fold(sum), 0xffff, "UDP checksum {i}");
        assert_ne!(be16(d, ip_len + 6), 0, "a checksum is present");
        assert_eq!(be16(d, ip_len), 4433, "ports are kept");
        joined.extend_from_slice(&d[ip_len + 8..]);
    }
    assert_eq!(joined, data);
}

#[test]
fn a_udp_super_datagram_splits_into_datagrams_with_their_own_lengths_and_checksums() {
    udp_segments_are_whole_datagrams(false);
    udp_segments_are_whole_datagrams(true);
}

#[test]
fn a_malformed_udp_super_datagram_is_refused() {
    let mut out = PacketBatch::for_packets(8);
    let mut big = udp_super(false, &payload(3000));
    assert_eq!(
        split(udp_hdr(false, 0), &mut big.clone(), &mut out),
        Err(OffloadError::Malformed),
        "segment size 0"
    );
    big[0] = 0x55;
    assert_eq!(
        split(udp_hdr(false, 1000), &mut big, &mut out),
        Err(OffloadError::Malformed),
        "not IPv4 or IPv6"
    );
    let mut many = udp_super(false, &payload(MAX_SEGMENTS * 2 + 1));
    assert_eq!(
        split(udp_hdr(false, 2), &mut many, &mut out),
        Err(OffloadError::Malformed),
        "more than MAX_SEGMENTS datagrams"
    );
    let mut short = udp_super(true, &[]);
    assert_eq!(
        split(udp_hdr(true, 1000), &mut short, &mut out),
        Err(OffloadError::Malformed),
        "no payload"
    );
}

proptest! {
    #[test]
    fn any_udp_super_datagram_splits_back_into_its_payload(len in 1usize..9000, size in 1u16..1500, v6: bool) {
        let data = payload(len);
        prop_assume!(len.div_ceil(usize::from(size)) <= MAX_SEGMENTS);
        let mut big = udp_super(v6, &data);
        let mut out = PacketBatch::for_packets(MAX_SEGMENTS);
        split(udp_hdr(v6, size), &mut big, &mut out).expect("split");
        let ip_len = if v6 { 40 } else { 20 };
        let mut joined = Vec::new();
        for (d, _) in out.iter() {
            let n = d.len() - ip_len;
            prop_assert_eq!(fold(checksum_add(pseudo_sum_of(d, v6, UDP, n), &d[ip_len..])), 0xffff);
            joined.extend_from_slice(&d[ip_len + 8..]);
        }
        prop_assert_eq!(joined, data);
    }
}
