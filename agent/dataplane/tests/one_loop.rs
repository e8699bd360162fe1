//! The one packet loop per direction (`crate::loops`) under each of its configurations: the
//! queue on and off, the crypto inline and on the ordered pool. The same packets from the host
//! (bulk, small, one with no route, one malformed) and the same datagrams from a stranger (a
//! small and a large one that are not WireGuard) go through each, round by round, and each
//! must deliver the same: every packet of a flow in the order sent (with the queue off, all of
//! them in the order sent: nothing goes ahead), the side channel's datagrams in the order sent,
//! and the same drop counters. The AQM is off here (its drops depend on timing; tests/queue.rs
//! covers it). No timing is asserted; every wait is bounded. No root needed.

mod memory_node;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use memory_node::{Node, bounded_sink, with_side};
use plexd_dataplane::memory::{MemoryNetwork, MemoryTun};
use plexd_dataplane::packet::ipv4_udp;
use plexd_dataplane::runner::QueueConfig;
use plexd_dataplane::{Device, PacketBatch, Tun, Udp};

const BULK: u8 = 1;
const SMALL: u8 = 2;
const WARM: u8 = 3;
const ROUNDS: u32 = 8;
/// Packets from the host per round: 54 bulk, 8 small, one with no route, one malformed.
const PER_ROUND: u32 = 64;

const A_MESH: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 1);
const B_MESH: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 2);
const NOWHERE: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);

/// A UDP packet of `flow` carrying sequence number `seq`, `size` bytes in all.
fn packet(dst: Ipv4Addr, flow: u8, seq: u32, size: usize) -> Vec<u8> {
    let mut payload = vec![0u8; size - 28];
    payload[0] = flow;
    payload[1..5].copy_from_slice(&seq.to_be_bytes());
    ipv4_udp(A_MESH, dst, &payload)
}

/// What one configuration delivered.
#[derive(Debug)]
struct Delivered {
    /// (flow, seq) in the order b's host received them.
    order: Vec<(u8, u32)>,
    /// The side channel's datagrams, in the order b's sink got them.
    side: Vec<Vec<u8>>,
    /// a's and b's drop counters: no route, malformed, rejected, not allowed, side dropped,
    /// queue dropped.
    counters: [[u64; 6]; 2],
}

impl Delivered {
    fn flow(&self, flow: u8) -> Vec<u32> {
        self.order
            .iter()
            .filter(|(f, _)| *f == flow)
            .map(|(_, s)| *s)
            .collect()
    }
}

fn counters(d: &Device) -> [u64; 6] {
    let c = d.counters();
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    [
        get(&c.no_route),
        get(&c.malformed),
        get(&c.rejected),
        get(&c.not_allowed),
        get(&c.side_dropped),
        get(&c.queue_dropped),
    ]
}

/// Receives at `host` until `n` packets of the bulk and small flows arrived (a warm-up packet
/// is skipped), at most 10 s.
fn receive(host: &MemoryTun, n: usize, order: &mut Vec<(u8, u32)>) {
    let mut batch = PacketBatch::for_packets(64);
    let want = order.len() + n;
    let deadline = Instant::now() + Duration::from_secs(10);
    while order.len() < want {
        assert!(
            Instant::now() < deadline,
            "{} of {want} packets within 10 s",
            order.len()
        );
        host.recv(&mut batch, Duration::from_millis(20))
            .expect("test setup");
        for (p, _) in batch.iter() {
            let seq = u32::from_be_bytes(p[29..33].try_into().expect("test setup"));
            if p[28] != WARM {
                order.push((p[28], seq));
            }
        }
    }
}

/// Takes `n` datagrams from the side channel, at most 10 s.
fn take_side(rx: &Receiver<(Vec<u8>, SocketAddr)>, n: usize, got: &mut Vec<Vec<u8>>) {
    for _ in 0..n {
        let (d, _) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a side-channel datagram within 10 s");
        got.push(d);
    }
}

/// A datagram that is not WireGuard (first byte 0) of `len` bytes, numbered `n`.
fn stranger_datagram(n: u32, len: usize) -> Vec<u8> {
    let mut d = vec![0u8; len];
    d[1] = 1;
    d[4..8].copy_from_slice(&n.to_be_bytes());
    d
}

/// Sends the rounds through two runners whose loops have the queue `queue` and `workers`
/// crypto-pool threads (0: inline), and answers what b delivered and the sent order.
fn cross(queue: bool, workers: usize) -> (Delivered, Vec<(u8, u32)>) {
    let net = MemoryNetwork::new();
    let (sink, side_rx) = bounded_sink(64);
    let config = |side| plexd_dataplane::runner::RunConfig {
        queue: QueueConfig {
            enabled: queue,
            aqm: false,
            ..QueueConfig::default()
        },
        crypto_workers: workers,
        ..with_side(side)
    };
    let a = Node::start(&net, [192, 0, 2, 1], 51820, config(None));
    let b = Node::start(&net, [192, 0, 2, 2], 51820, config(Some(sink)));
    a.add_peer(&b, b.addr(), "10.64.0.2/32");
    b.add_peer(&a, a.addr(), "10.64.0.1/32");
    let stranger = net
        .bind("198.51.100.9:3478".parse().expect("test setup"))
        .expect("test setup");

    // The handshake first, so every round meets a session.
    let mut order = Vec::new();
    a.host.send_one(&packet(B_MESH, WARM, 0, 60));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut batch = PacketBatch::for_packets(64);
    while !batch.iter().any(|(p, _)| p.get(28) == Some(&WARM)) {
        assert!(Instant::now() < deadline, "the handshake within 10 s");
        b.host
            .recv(&mut batch, Duration::from_millis(20))
            .expect("test setup");
    }

    let (mut sent, mut side_got) = (Vec::new(), Vec::new());
    let (mut bulk, mut small) = (0, 0);
    for round in 0..ROUNDS {
        batch.clear();
        for k in 0..PER_ROUND {
            let p = match k {
                3 => packet(NOWHERE, BULK, 0, 1400),
                // Version 0: no IP packet; small, so it skips the queue.
                5 => vec![0u8; 40],
                k if k % 8 == 7 => {
                    small += 1;
                    sent.push((SMALL, small));
                    packet(B_MESH, SMALL, small, 60)
                }
                _ => {
                    bulk += 1;
                    sent.push((BULK, bulk));
                    packet(B_MESH, BULK, bulk, 1400)
                }
            };
            batch.push(&p, plexd_dataplane::batch::NO_ADDR);
        }
        a.host.send(&batch).expect("test setup");
        // A small datagram (it skips the queue) and a large one (it is queued).
        let mut datagrams = PacketBatch::for_datagrams(2);
        datagrams.push(&stranger_datagram(2 * round, 20), b.addr());
        datagrams.push(&stranger_datagram(2 * round + 1, 600), b.addr());
        stranger.send(&datagrams).expect("test setup");
        receive(&b.host, PER_ROUND as usize - 2, &mut order);
        take_side(&side_rx, 2, &mut side_got);
    }
    let delivered = Delivered {
        order,
        side: side_got,
        counters: [counters(&a.device), counters(&b.device)],
    };
    let pooled = |n: &Node| n.device.counters().pooled.load(Ordering::Relaxed);
    assert_eq!(
        (pooled(&a) > 0, pooled(&b) > 0),
        (workers > 0, workers > 0),
        "the pool seals and opens exactly when there is one"
    );
    (delivered, sent)
}

#[test]
fn the_same_packets_cross_every_loop_alike() {
    let (inline_queued, sent) = cross(true, 0);
    let flow = |flow: u8| -> Vec<u32> {
        sent.iter()
            .filter(|(f, _)| *f == flow)
            .map(|(_, s)| *s)
            .collect()
    };
    assert_eq!(
        inline_queued.flow(BULK),
        flow(BULK),
        "bulk in order, none lost"
    );
    assert_eq!(
        inline_queued.flow(SMALL),
        flow(SMALL),
        "small in order, none lost"
    );
    let side: Vec<Vec<u8>> = (0..2 * ROUNDS)
        .map(|n| stranger_datagram(n, if n % 2 == 0 { 20 } else { 600 }))
        .collect();
    assert_eq!(
        inline_queued.side, side,
        "the side channel's datagrams in order"
    );
    assert_eq!(
        inline_queued.counters,
        [[u64::from(ROUNDS), u64::from(ROUNDS), 0, 0, 0, 0], [0; 6]],
        "a counts the packet with no route and the malformed one of each round; b drops nothing"
    );
    for (queue, workers) in [(true, 2), (false, 0), (false, 2)] {
        let (got, _) = cross(queue, workers);
        let name = format!("queue {queue}, {workers} pool workers");
        assert_eq!(got.flow(BULK), flow(BULK), "{name}: bulk");
        assert_eq!(got.flow(SMALL), flow(SMALL), "{name}: small");
        assert_eq!(got.side, inline_queued.side, "{name}: side channel");
        assert_eq!(got.counters, inline_queued.counters, "{name}: counters");
        if !queue {
            assert_eq!(
                got.order, sent,
                "{name}: without the queue, nothing goes ahead"
            );
        }
    }
}
