//! Relayed peers inside the data plane over the in-memory network: two nodes whose endpoints
//! for each other are relay endpoints (`plexd_dataplane::relay`) carry traffic through a
//! stand-in relay (frames `send` in, `recv` out, as `plexsphere relay` does) with no forwarder;
//! a `recv` that names another peer than its datagram's, or a frame from an address that is not
//! a relay the node uses, moves no endpoint.

mod memory_node;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use memory_node::{Node, bounded_sink, wait, with_side};
use plexd_dataplane::batch::NO_ADDR;
use plexd_dataplane::memory::{MemoryNetwork, MemorySocket};
use plexd_dataplane::packet::ipv4_udp;
use plexd_dataplane::relay::decode;
use plexd_dataplane::runner::{QueueConfig, RunConfig};
use plexd_dataplane::{PacketBatch, Tun, Udp};
use plexsphere_wire::reach::relay::{Frame, KeyPrefix, prefix};

/// `other` as a peer of `node` reached through the relay at `relay`; answers its relay endpoint.
fn add_relayed_peer(node: &Node, other: &Node, relay: SocketAddr, mesh: &str) -> SocketAddr {
    node.device
        .relays()
        .set(&[relay])
        .expect("room for a relay");
    let endpoint = node
        .device
        .relay_endpoint(relay, &other.public())
        .expect("a relay endpoint");
    node.add_peer(other, endpoint, mesh);
    endpoint
}

fn endpoint_of(node: &Node, other: &Node) -> Option<SocketAddr> {
    node.device.peer(&other.public()).and_then(|p| p.endpoint())
}

/// A stand-in relay: forwards each `send` as a `recv` naming its sender's key prefix (or, while
/// `misname` is on, another prefix) to the registered node of the destination prefix; keeps a
/// copy of every `recv` it sent.
struct StandInRelay {
    addr: SocketAddr,
    misname: Arc<AtomicBool>,
    sends: Arc<AtomicU64>,
    sent: mpsc::Receiver<(Vec<u8>, SocketAddr)>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StandInRelay {
    fn start(socket: MemorySocket, nodes: &[(KeyPrefix, SocketAddr)]) -> Self {
        let addr = socket.addr();
        let by_prefix: HashMap<KeyPrefix, SocketAddr> = nodes.iter().copied().collect();
        let by_addr: HashMap<SocketAddr, KeyPrefix> = nodes.iter().map(|(p, a)| (*a, *p)).collect();
        let (misname, sends, stop) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (tx, sent) = mpsc::channel();
        let thread = {
            let (misname, sends, stop) = (misname.clone(), sends.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut batch = PacketBatch::for_datagrams(16);
                let mut out = PacketBatch::for_datagrams(16);
                while !stop.load(Ordering::Relaxed) {
                    if socket
                        .recv(&mut batch, Duration::from_millis(20))
                        .expect("relay recv")
                        == 0
                    {
                        continue;
                    }
                    out.clear();
                    for (d, from) in batch.datagrams() {
                        let Ok(Frame::Send { dst, payload }) = Frame::from_datagram(d) else {
                            continue;
                        };
                        sends.fetch_add(1, Ordering::Relaxed);
                        let (Some(src), Some(to)) = (by_addr.get(&from), by_prefix.get(&dst))
                        else {
                            continue;
                        };
                        let src = if misname.load(Ordering::Relaxed) {
                            [0xEE; 8]
                        } else {
                            *src
                        };
                        let recv = Frame::Recv { src, payload }.to_datagram();
                        let _ = tx.send((recv.clone(), *to));
                        out.push(&recv, *to);
                    }
                    if !out.is_empty() {
                        socket.send(&out).expect("relay send");
                    }
                }
            })
        };
        Self {
            addr,
            misname,
            sends,
            sent,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for StandInRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

const MA: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 1);
const MB: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 2);

/// Sends `payload` from `from`'s host to `to_ip` and waits until `to`'s host has it.
fn carries(from: &Node, to: &Node, (src, dst): (Ipv4Addr, Ipv4Addr), payload: &[u8]) {
    from.host.send_one(&ipv4_udp(src, dst, payload));
    let mut batch = PacketBatch::for_packets(4);
    let mut got = false;
    wait(
        || {
            if to
                .host
                .recv(&mut batch, Duration::from_millis(20))
                .expect("host recv")
                > 0
            {
                got = batch.iter().any(|(p, _)| p.get(28..) == Some(payload));
            }
            got
        },
        "the packet through the relay",
    );
}

/// Two nodes relayed to each other through a stand-in relay; each node's side channel is its
/// `*_side` receiver.
struct Lab {
    a: Node,
    b: Node,
    a_side: Side,
    b_side: Side,
    relay: StandInRelay,
    net: MemoryNetwork,
}

type Side = mpsc::Receiver<(Vec<u8>, SocketAddr)>;

fn lab() -> Lab {
    lab_with(QueueConfig::default(), 0)
}

/// `lab` with the packet loops' queue configured by `queue` and `workers` crypto-pool threads.
fn lab_with(queue: QueueConfig, workers: usize) -> Lab {
    let net = MemoryNetwork::new();
    let (sink_a, a_side) = bounded_sink(64);
    let (sink_b, b_side) = bounded_sink(64);
    let config = |side| RunConfig {
        queue,
        crypto_workers: workers,
        ..with_side(Some(side))
    };
    let a = Node::start(&net, [192, 0, 2, 1], 51820, config(sink_a));
    let b = Node::start(&net, [192, 0, 2, 2], 51820, config(sink_b));
    let socket = net
        .bind("203.0.113.9:3478".parse().expect("addr"))
        .expect("bind the relay");
    let relay = StandInRelay::start(
        socket,
        &[
            (prefix(&a.public()), a.addr()),
            (prefix(&b.public()), b.addr()),
        ],
    );
    let ea = add_relayed_peer(&b, &a, relay.addr, "10.64.0.1/32");
    let eb = add_relayed_peer(&a, &b, relay.addr, "10.64.0.2/32");
    assert_eq!(decode(eb).map(|(_, p)| p), Some(prefix(&b.public())));
    assert_eq!(decode(ea).map(|(_, p)| p), Some(prefix(&a.public())));
    Lab {
        a,
        b,
        a_side,
        b_side,
        relay,
        net,
    }
}

#[test]
fn relayed_peers_carry_traffic_framed_by_the_data_plane_itself() {
    let l = lab();
    let eb = endpoint_of(&l.a, &l.b).expect("a relay endpoint");
    carries(&l.a, &l.b, (MA, MB), b"through the relay");
    carries(&l.b, &l.a, (MB, MA), b"and back");
    // Every WireGuard datagram went out framed, and came in unwrapped: the relay saw sends
    // (handshake, data), the side channels saw no WireGuard.
    for (n, side) in [(&l.a, &l.a_side), (&l.b, &l.b_side)] {
        let c = &n.device.relays().counters;
        assert!(c.framed.load(Ordering::Relaxed) >= 2, "framed: {c:?}");
        assert!(c.unwrapped.load(Ordering::Relaxed) >= 2, "unwrapped: {c:?}");
        assert_eq!(c.gone.load(Ordering::Relaxed), 0);
        assert!(side.try_recv().is_err(), "nothing for the runtime");
    }
    assert!(l.relay.sends.load(Ordering::Relaxed) >= 4);
    // The endpoints stay the relay endpoints (replies go back through the relay).
    assert_eq!(endpoint_of(&l.a, &l.b), Some(eb));
    assert_eq!(
        endpoint_of(&l.b, &l.a).and_then(decode).map(|(_, p)| p),
        Some(prefix(&l.a.public()))
    );
}

/// Relayed traffic through every configuration of the one packet loop (`crate::loops`: the
/// queue on and off, the crypto inline and on the pool): a batch of bulk packets with small
/// ones among them (those skip the queue, so both the urgent and the queued datagrams are
/// unwrapped) crosses each way whole, each flow in order, every datagram framed and unwrapped.
#[test]
fn relayed_bulk_and_small_packets_cross_every_loop_in_order() {
    const N: u32 = 64;
    for (enabled, workers) in [(true, 0), (true, 2), (false, 0), (false, 2)] {
        let queue = QueueConfig {
            enabled,
            // Its drops depend on timing; tests/queue.rs covers them.
            aqm: false,
            ..QueueConfig::default()
        };
        let l = lab_with(queue, workers);
        let name = format!("queue {enabled}, {workers} pool workers");
        carries(&l.a, &l.b, (MA, MB), b"the handshake first");
        for (from, to, (src, dst)) in [(&l.a, &l.b, (MA, MB)), (&l.b, &l.a, (MB, MA))] {
            let mut batch = PacketBatch::for_packets(N as usize);
            for seq in 0..N {
                let size = if seq % 4 == 3 { 60 } else { 1400 };
                let mut payload = vec![0xB0; size - 28];
                payload[1..5].copy_from_slice(&seq.to_be_bytes());
                batch.push(&ipv4_udp(src, dst, &payload), NO_ADDR);
            }
            from.host.send(&batch).expect("test setup");
            let (mut small, mut bulk) = (Vec::new(), Vec::new());
            wait(
                || {
                    let n = to
                        .host
                        .recv(&mut batch, Duration::from_millis(20))
                        .expect("host recv");
                    for (p, _) in batch.iter().take(n) {
                        if p.get(28) == Some(&0xB0) {
                            let seq = u32::from_be_bytes(p[29..33].try_into().expect("seq"));
                            let flow = if p.len() == 60 { &mut small } else { &mut bulk };
                            flow.push(seq);
                        }
                    }
                    small.len() + bulk.len() >= N as usize
                },
                "the batch through the relay",
            );
            let sent = |small: bool| (0..N).filter(|s| (s % 4 == 3) == small).collect::<Vec<_>>();
            assert_eq!(small, sent(true), "{name}: the small packets, in order");
            assert_eq!(bulk, sent(false), "{name}: the bulk packets, in order");
        }
        for n in [&l.a, &l.b] {
            let c = &n.device.relays().counters;
            assert!(
                c.framed.load(Ordering::Relaxed) > u64::from(N),
                "{name}: framed {c:?}"
            );
            assert!(
                c.unwrapped.load(Ordering::Relaxed) > u64::from(N),
                "{name}: unwrapped {c:?}"
            );
            let pooled = n.device.counters().pooled.load(Ordering::Relaxed);
            assert_eq!(pooled > 0, workers > 0, "{name}: pooled {pooled}");
        }
    }
}

#[test]
fn a_recv_naming_another_peer_is_dropped_and_moves_no_endpoint() {
    let l = lab();
    carries(&l.a, &l.b, (MA, MB), b"first");
    let ea = endpoint_of(&l.b, &l.a).expect("endpoint");
    // From now on the relay names a key prefix no one has for a's datagrams.
    l.relay.misname.store(true, Ordering::Relaxed);
    l.a.host.send_one(&ipv4_udp(MA, MB, b"misnamed"));
    let misnamed = &l.b.device.counters().relay_misnamed;
    wait(
        || misnamed.load(Ordering::Relaxed) >= 1,
        "b refuses the misnamed datagram",
    );
    assert_eq!(endpoint_of(&l.b, &l.a), Some(ea), "a's endpoint unchanged");
    let mut batch = PacketBatch::for_packets(4);
    let n =
        l.b.host
            .recv(&mut batch, Duration::from_millis(100))
            .expect("recv");
    assert!(
        batch
            .iter()
            .take(n)
            .all(|(p, _)| p.get(28..) != Some(&b"misnamed"[..])),
        "the misnamed packet never reached b's host"
    );
}

#[test]
fn a_relay_frame_from_an_address_that_is_not_a_relay_in_use_goes_to_the_side_channel() {
    let l = lab();
    carries(&l.a, &l.b, (MA, MB), b"first");
    // A real `recv` the relay sent b, replayed from another address (a spoofer's).
    let (frame, to) = l
        .relay
        .sent
        .try_iter()
        .find(|(_, to)| *to == l.b.addr())
        .expect("a recv for b");
    while l.b_side.try_recv().is_ok() {}
    let unwrapped =
        l.b.device
            .relays()
            .counters
            .unwrapped
            .load(Ordering::Relaxed);
    let spoofer = l
        .net
        .bind("198.51.100.66:3478".parse().expect("addr"))
        .expect("bind");
    let mut batch = PacketBatch::for_datagrams(1);
    batch.push(&frame, to);
    assert_eq!(spoofer.send(&batch).expect("send"), 1);
    let (got, from) = l
        .b_side
        .recv_timeout(Duration::from_secs(10))
        .expect("the frame reaches the side channel, not the device");
    assert_eq!((got, from), (frame, spoofer.addr()));
    assert_eq!(
        l.b.device
            .relays()
            .counters
            .unwrapped
            .load(Ordering::Relaxed),
        unwrapped,
        "not unwrapped"
    );
    assert!(decode(endpoint_of(&l.b, &l.a).expect("endpoint")).is_some());
}
