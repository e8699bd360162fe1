use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use super::*;
use crate::batch::NO_ADDR;
use crate::codel::{CODEL_INTERVAL, CODEL_TARGET};
use crate::packet::ipv4_udp;

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

/// An IPv4/TCP packet with `payload` bytes of data (checksums are not looked at here).
fn tcp(payload: usize) -> Vec<u8> {
    let total = 40 + payload;
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[8] = 64;
    p[9] = TCP;
    p[12..16].copy_from_slice(&A.octets());
    p[16..20].copy_from_slice(&B.octets());
    p[32] = 5 << 4;
    p[33] = 0x10;
    p
}

fn bulk_batch(n: usize, size: usize) -> PacketBatch {
    let mut b = PacketBatch::new(2048, 64);
    for _ in 0..n {
        b.push(&tcp(size - 40), NO_ADDR);
    }
    b
}

#[test]
fn small_packets_are_urgent_unless_they_are_tcp_data() {
    assert!(
        is_urgent_packet(&ipv4_udp(A, B, &[0; 56])),
        "a ping-sized UDP packet"
    );
    assert!(is_urgent_packet(&tcp(0)), "a pure ACK");
    assert!(
        !is_urgent_packet(&tcp(1)),
        "TCP data keeps its place in its flow"
    );
    assert!(!is_urgent_packet(&tcp(1000)));
    assert!(
        !is_urgent_packet(&ipv4_udp(A, B, &[0; 1200])),
        "a large packet"
    );
    assert!(!is_urgent_packet(&[]));
    assert!(is_urgent_datagram(&[4, 0, 0, 0, 1]));
    assert!(is_urgent_datagram(&[0; 148]), "a handshake initiation");
    assert!(!is_urgent_datagram(&[0; 1452]));
}

#[test]
fn urgent_packets_leave_a_read_batch_and_the_rest_keep_their_order() {
    let mut b = bulk_batch(3, 1400);
    b.push(&ipv4_udp(A, B, b"ping"), NO_ADDR);
    b.push(&tcp(0), NO_ADDR);
    b.push(&tcp(10), NO_ADDR);
    let mut urgent = Vec::new();
    assert_eq!(
        take_urgent(&mut b, is_urgent_packet, |p, _, _| urgent.push(p.to_vec())),
        2
    );
    assert_eq!(urgent, vec![ipv4_udp(A, B, b"ping"), tcp(0)]);
    let mut lane = Lane::new(1 << 20, 1000, None);
    let now = Instant::now();
    lane.push(b, now);
    let chunk = lane.next_chunk(now, QUANTUM_BYTES).expect("a chunk");
    let left: Vec<usize> = chunk.datagrams().map(|(p, _, _)| p.len()).collect();
    assert_eq!(
        left,
        vec![1400, 1400, 1400, 50],
        "bulk and small TCP data, in order"
    );
}

#[test]
fn of_a_gro_slot_only_a_short_urgent_tail_is_taken() {
    let from: SocketAddr = "192.0.2.1:51820".parse().expect("as built");
    let mut b = PacketBatch::new(8192, 4);
    // Three 1452 B datagrams and a 128 B one (a ping) in one GRO slot.
    let slot = b.next_slot();
    slot[..3 * 1452 + 128].fill(4);
    b.commit_segmented(3 * 1452 + 128, from, 1452);
    // A slot of four 96 B datagrams (ACKs): all urgent.
    b.next_slot()[..384].fill(4);
    b.commit_segmented(384, from, 96);
    let mut urgent = Vec::new();
    assert_eq!(
        take_urgent(&mut b, is_urgent_datagram, |d, a, _| urgent
            .push((d.len(), a))),
        5
    );
    assert_eq!(urgent[0], (128, from));
    assert!(urgent[1..].iter().all(|&u| u == (96, from)));
    assert_eq!(b.get(0).len(), 3 * 1452);
    assert_eq!(b.get(1).len(), 0);
}

#[test]
fn chunks_are_bounded_by_bytes_and_the_lane_by_bytes_and_items() {
    let mut lane = Lane::new(200_000, 100, None);
    let now = Instant::now();
    lane.push(bulk_batch(64, 1400), now);
    assert!(!lane.is_full());
    lane.push(bulk_batch(64, 1400), now);
    assert!(lane.is_full(), "128 packets > 100 items");
    let mut total = 0;
    let mut chunks = 0;
    while let Some(c) = lane.next_chunk(now, 10_000) {
        let bytes: usize = c.datagrams().map(|(p, _, _)| p.len()).sum();
        assert!(
            bytes <= 10_000 + 1400,
            "a quantum and at most one packet more: {bytes}"
        );
        total += bytes;
        chunks += 1;
    }
    assert_eq!(total, 128 * 1400);
    assert!(chunks >= 16, "{chunks}");
    assert!(lane.is_empty());
    assert_eq!(lane.bytes(), 0);
}

#[test]
fn codel_drops_only_from_a_standing_queue_and_not_during_a_brief_burst() {
    let codel = Codel::new(CODEL_TARGET, CODEL_INTERVAL, 1500);
    let mut lane = Lane::new(usize::MAX, usize::MAX, Some(codel));
    let t0 = Instant::now();
    // A burst that is worked off within the target: nothing dropped.
    lane.push(bulk_batch(64, 1400), t0);
    let mut t = t0;
    while let Some(c) = lane.next_chunk(t, 1400) {
        assert_eq!(c.dropped, 0);
        t += Duration::from_micros(10);
    }
    // A standing queue: every batch waits 5 ms; served one packet each 100 µs for 200 ms.
    let mut delivered = 0;
    let mut dropped = 0;
    let mut pushed = 0;
    let mut now = t0 + Duration::from_millis(10);
    for _ in 0..2000 {
        if lane.bytes() < 64 * 1400 {
            lane.push(bulk_batch(64, 1400), now - Duration::from_millis(5));
            pushed += 64;
        }
        let c = lane.next_chunk(now, 1).expect("a chunk");
        dropped += c.dropped;
        delivered += c.datagrams().count();
        now += Duration::from_micros(100);
    }
    assert!(
        dropped > 0,
        "a 5 ms standing queue for 200 ms is dropped from"
    );
    assert!(
        dropped < 100,
        "one drop per interval/sqrt(n), not every packet: {dropped}"
    );
    // Every packet is delivered, dropped, or still queued.
    let queued = lane.bytes() / 1400;
    assert_eq!(
        delivered + dropped + queued,
        pushed,
        "{delivered} {dropped} {queued}"
    );
    assert_eq!(lane.dropped(), dropped as u64);
}
