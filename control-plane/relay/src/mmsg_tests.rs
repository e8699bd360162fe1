use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use super::*;

/// A `recv` datagram's length for a 1452-byte WireGuard datagram.
const LEN: usize = HEAD + 1452;

fn receiver() -> (UdpSocket, SocketAddr) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

/// Slot i holds `len` bytes that start with i.
fn slot(i: usize, len: usize) -> Vec<u8> {
    let mut s = vec![0xab; len];
    s[..8].copy_from_slice(&(i as u64).to_be_bytes());
    s
}

/// The next `n` datagrams at `socket`: each one's length and the number it starts with.
fn take(socket: &UdpSocket, n: usize) -> Vec<(usize, u64)> {
    let mut buf = vec![0u8; 65_536];
    (0..n)
        .map(|_| {
            let (len, _) = socket.recv_from(&mut buf).unwrap();
            (len, u64::from_be_bytes(buf[..8].try_into().unwrap()))
        })
        .collect()
}

/// Sends a batch of `n` equal frames to one plain socket, and checks they arrive one datagram
/// each, whole and in order.
fn batch_to_one_node(mut sender: Sender, n: usize) -> (Sender, Sent) {
    let relay = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (node, to) = receiver();
    let slots: Vec<Vec<u8>> = (0..n).map(|i| slot(i, LEN)).collect();
    let forwards: Vec<_> = (0..n).map(|i| (i, LEN, to)).collect();
    let sent = sender.send(&relay, &slots, &forwards);
    assert_eq!(sent.frames, n as u64);
    assert_eq!(sent.payload, (n * (LEN - HEAD)) as u64);
    let want: Vec<(usize, u64)> = (0..n as u64).map(|i| (LEN, i)).collect();
    assert_eq!(take(&node, n), want);
    (sender, sent)
}

#[test]
fn a_gso_batch_to_one_node_arrives_whole_and_in_order() {
    let (sender, sent) = batch_to_one_node(Sender::new(), 32);
    // Loopback takes UDP_SEGMENT (Linux 4.18 and later): the batch went as one GSO send.
    assert!(sender.gso(), "the kernel refused UDP GSO on loopback");
    assert_eq!(sent.gso_sends, 1);
}

#[test]
fn without_gso_the_batch_arrives_the_same() {
    let (sender, sent) = batch_to_one_node(Sender::with_gso(false), 32);
    assert!(!sender.gso());
    assert_eq!(sent.gso_sends, 0);
}

#[test]
fn runs_to_two_nodes_and_a_shorter_frame_arrive_in_order_at_each() {
    let relay = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (a, to_a) = receiver();
    let (b, to_b) = receiver();
    // a a a b b a(short) a: runs of 3 and 2 by GSO, the rest by sendmmsg.
    let plan = [
        (to_a, LEN),
        (to_a, LEN),
        (to_a, LEN),
        (to_b, LEN),
        (to_b, LEN),
        (to_a, 100),
        (to_a, LEN),
    ];
    let slots: Vec<Vec<u8>> = plan
        .iter()
        .enumerate()
        .map(|(i, &(_, len))| slot(i, len))
        .collect();
    let forwards: Vec<_> = plan
        .iter()
        .enumerate()
        .map(|(i, &(to, len))| (i, len, to))
        .collect();
    let mut sender = Sender::new();
    let sent = sender.send(&relay, &slots, &forwards);
    assert_eq!((sent.frames, sent.gso_sends), (7, 2));
    assert_eq!(
        take(&a, 5),
        vec![(LEN, 0), (LEN, 1), (LEN, 2), (100, 5), (LEN, 6)]
    );
    assert_eq!(take(&b, 2), vec![(LEN, 3), (LEN, 4)]);
    assert!(sender.gso());
}

#[test]
fn a_gso_run_stops_at_another_node_another_length_or_the_limits() {
    let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
    assert_eq!(gso_run(&[]), 0);
    assert_eq!(gso_run(&[(0, LEN, a), (1, LEN, a), (2, LEN, b)]), 2);
    assert_eq!(gso_run(&[(0, LEN, a), (1, 100, a)]), 1);
    let many: Vec<_> = (0..100).map(|i| (i, 100, a)).collect();
    assert_eq!(gso_run(&many), GSO_MAX_SEGMENTS);
    let big: Vec<_> = (0..60).map(|i| (i, LEN, a)).collect();
    assert_eq!(gso_run(&big), GSO_MAX_BYTES / LEN);
}
