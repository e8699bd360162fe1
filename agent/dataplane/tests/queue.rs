//! The runner's queues in front of the cipher (`crate::lane`) under a saturating load, over
//! in-memory TUNs and a virtual UDP network: the handshake completes while bulk traffic floods
//! both directions, and no flow is reordered, neither the bulk one nor the small packets that
//! go ahead of it. No timing is asserted; every wait is bounded. No root needed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use plexd_dataplane::memory::{MemoryNetwork, MemoryTun, tun_pair};
use plexd_dataplane::packet::ipv4_udp;
use plexd_dataplane::runner::{RunConfig, RunError, Shutdown, run};
use plexd_dataplane::{Device, DeviceUpdate, PacketBatch, PeerUpdate, Protocol, SecretKey, Tun};

const BULK: u8 = 1;
const SMALL: u8 = 2;
const MARK: u32 = u32::MAX;

struct Node {
    device: Arc<Device>,
    host: MemoryTun,
    mesh: Ipv4Addr,
    shutdown: Shutdown,
    thread: Option<JoinHandle<Result<(), RunError>>>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shutdown.trigger();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Two runners with the default `RunConfig` (queues, AQM and priority on), peers of each other;
/// `workers`: the crypto pool's threads (0: none; a pool runs on `Protocol::Plexd` whatever
/// `protocol` says).
fn pair(workers: usize, protocol: Protocol) -> (Node, Node) {
    let net = MemoryNetwork::new();
    let keys = [
        SecretKey::generate().expect("test setup"),
        SecretKey::generate().expect("test setup"),
    ];
    let ip = |i: usize| IpAddr::from([192, 0, 2, 1 + i as u8]);
    let mesh = |i: usize| Ipv4Addr::new(10, 64, 0, 1 + i as u8);
    let mut nodes = (0..2).map(|i| {
        let other = 1 - i;
        let device = Arc::new(Device::with_protocol(
            protocol,
            plexsphere_wire::clock::Now::system(),
        ));
        let mut peer = PeerUpdate::new(keys[other].public_key());
        peer.allowed_ips
            .push(format!("{}/32", mesh(other)).parse().expect("test setup"));
        peer.endpoint = Some(SocketAddr::new(ip(other), 51820));
        device
            .apply(DeviceUpdate {
                private_key: Some(Some(keys[i].clone())),
                listen_port: Some(51820),
                peers: vec![peer],
                ..Default::default()
            })
            .expect("test setup");
        let (host, tun) = tun_pair();
        let shutdown = Shutdown::new();
        let (d, s, binder) = (device.clone(), shutdown.clone(), net.binder(ip(i)));
        let config = RunConfig {
            crypto_workers: workers,
            ..RunConfig::default()
        };
        let thread = std::thread::spawn(move || run(d, tun, binder, config, s));
        Node {
            device,
            host,
            mesh: mesh(i),
            shutdown,
            thread: Some(thread),
        }
    });
    let a = nodes.next().expect("test setup");
    let b = nodes.next().expect("test setup");
    (a, b)
}

/// A UDP packet of `flow` carrying sequence number `seq`, `size` bytes in all.
fn packet(src: Ipv4Addr, dst: Ipv4Addr, flow: u8, seq: u32, size: usize) -> Vec<u8> {
    let mut payload = vec![0u8; size - 28];
    payload[0] = flow;
    payload[1..5].copy_from_slice(&seq.to_be_bytes());
    ipv4_udp(src, dst, &payload)
}

/// Floods `from`'s host with bulk packets to `to`, and a small one every 8th.
fn flood(from: &Node, to: Ipv4Addr, batches: u32) {
    let mut batch = PacketBatch::for_packets(64);
    let mut seq = 0;
    for n in 0..batches {
        batch.clear();
        for k in 0..64u32 {
            let p = if k % 8 == 7 {
                packet(from.mesh, to, SMALL, n * 8 + k / 8, 60)
            } else {
                seq += 1;
                packet(from.mesh, to, BULK, seq, 1400)
            };
            batch.push(&p, plexd_dataplane::batch::NO_ADDR);
        }
        from.host.send(&batch).expect("test setup");
    }
}

/// What one host received, per flow, in arrival order; calls `again` (which sends the end
/// marks once the flood is over) every 200 ms, and returns once both marks arrived.
fn receive(host: &MemoryTun, again: impl Fn()) -> (Vec<u32>, Vec<u32>) {
    let (mut bulk, mut small) = (Vec::new(), Vec::new());
    let mut batch = PacketBatch::for_packets(64);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut next_mark = Instant::now();
    while bulk.last() != Some(&MARK) || small.last() != Some(&MARK) {
        assert!(
            Instant::now() < deadline,
            "the end marks did not arrive within 60 s: {} bulk, {} small",
            bulk.len(),
            small.len()
        );
        if Instant::now() >= next_mark {
            again();
            next_mark = Instant::now() + Duration::from_millis(200);
        }
        host.recv(&mut batch, Duration::from_millis(20))
            .expect("test setup");
        for (p, _) in batch.iter() {
            let seq = u32::from_be_bytes(p[29..33].try_into().expect("test setup"));
            match p[28] {
                BULK if bulk.last() != Some(&MARK) => bulk.push(seq),
                SMALL if small.last() != Some(&MARK) => small.push(seq),
                _ => {}
            }
        }
    }
    (bulk, small)
}

fn assert_in_order(name: &str, seqs: &[u32]) {
    assert!(seqs.len() > 1, "{name}: nothing crossed");
    for w in seqs.windows(2) {
        assert!(w[0] < w[1], "{name} reordered: {} then {}", w[0], w[1]);
    }
}

/// Floods both ways at once, then sends the end marks; answers what each host received
/// (a's, then b's).
fn flood_both_ways(a: &Node, b: &Node) -> [(Vec<u32>, Vec<u32>); 2] {
    let (ma, mb) = (a.mesh, b.mesh);
    let flooded = [AtomicBool::new(false), AtomicBool::new(false)];
    std::thread::scope(|s| {
        let flooded = &flooded;
        s.spawn(move || {
            flood(a, mb, 400);
            flooded[0].store(true, Ordering::Release);
        });
        s.spawn(move || {
            flood(b, ma, 400);
            flooded[1].store(true, Ordering::Release);
        });
        // The end marks follow each flood, so every packet of it is looked at.
        let marks = |from: &Node, to: Ipv4Addr, done: &AtomicBool| {
            if !done.load(Ordering::Acquire) {
                return;
            }
            let mut batch = PacketBatch::for_packets(2);
            let none = plexd_dataplane::batch::NO_ADDR;
            batch.push(&packet(from.mesh, to, BULK, MARK, 1400), none);
            batch.push(&packet(from.mesh, to, SMALL, MARK, 60), none);
            from.host.send(&batch).expect("test setup");
        };
        let at_b = s.spawn(move || receive(&b.host, || marks(a, mb, &flooded[0])));
        let at_a = receive(&a.host, || marks(b, ma, &flooded[1]));
        [at_a, at_b.join().expect("test setup")]
    })
}

fn handshake_since(node: &Node, since: SystemTime) {
    let snap = node.device.snapshot(Instant::now(), SystemTime::now());
    let peer = &snap.peers[0];
    assert!(
        peer.last_handshake
            .is_some_and(|t| t >= since - Duration::from_secs(1)),
        "no handshake: {snap:?}"
    );
    assert!(peer.rx_bytes > 0 && peer.tx_bytes > 0, "{snap:?}");
}

#[test]
fn the_handshake_completes_while_bulk_traffic_floods_both_ways() {
    handshake_under_flood(0, Protocol::Boringtun);
}

/// Both sides initiate at once under the flood: each must keep the session it answered.
#[test]
fn the_handshake_completes_while_bulk_traffic_floods_both_ways_on_plexds_protocol() {
    handshake_under_flood(0, Protocol::Plexd);
}

#[test]
fn the_handshake_completes_while_bulk_traffic_floods_both_ways_through_the_crypto_pool() {
    handshake_under_flood(2, Protocol::Plexd);
}

fn handshake_under_flood(workers: usize, protocol: Protocol) {
    let (a, b) = pair(workers, protocol);
    let before = SystemTime::now();
    // Both floods start before any handshake: the initiations and responses meet full queues,
    // both peers initiate at once, and boringtun queues what arrives before the session.
    let [at_a, at_b] = flood_both_ways(&a, &b);
    for (name, (bulk, small)) in [("at a", at_a), ("at b", at_b)] {
        assert!(
            bulk.len() > 100,
            "{name}: {} bulk packets crossed",
            bulk.len()
        );
        assert!(
            small.len() > 10,
            "{name}: {} small packets crossed",
            small.len()
        );
    }
    handshake_since(&a, before);
    handshake_since(&b, before);
}

#[test]
fn the_queues_reorder_no_flow_under_a_flood_both_ways() {
    no_reordering_under_flood(0, Protocol::Boringtun);
}

#[test]
fn the_queues_reorder_no_flow_under_a_flood_both_ways_on_plexds_protocol() {
    no_reordering_under_flood(0, Protocol::Plexd);
}

/// The pool's workers finish jobs in any order; the flows still arrive in the order sent.
#[test]
fn the_crypto_pool_reorders_no_flow_under_a_flood_both_ways() {
    no_reordering_under_flood(3, Protocol::Plexd);
}

fn no_reordering_under_flood(workers: usize, protocol: Protocol) {
    let (a, b) = pair(workers, protocol);
    let before = SystemTime::now();
    // A session first: across the very first handshake boringtun's own queue of early packets
    // is flushed by the receiving thread, and may race with the sending thread.
    for (from, to) in [(&a, &b), (&b, &a)] {
        let mut batch = PacketBatch::for_packets(1);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            from.host.send_one(&packet(from.mesh, to.mesh, 9, 0, 60));
            if to
                .host
                .recv(&mut batch, Duration::from_millis(200))
                .expect("test setup")
                > 0
            {
                break;
            }
            assert!(Instant::now() < deadline, "no session within 20 s");
        }
    }
    handshake_since(&a, before);
    let [at_a, at_b] = flood_both_ways(&a, &b);
    for (name, (bulk, small)) in [("b to a", at_a), ("a to b", at_b)] {
        assert_in_order(&format!("{name}, bulk"), &bulk);
        assert_in_order(&format!("{name}, small"), &small);
    }
    for node in [&a, &b] {
        let pooled = node.device.counters().pooled.load(Ordering::Relaxed);
        if workers > 0 {
            assert!(pooled > 100, "only {pooled} packets went through the pool");
        } else {
            assert_eq!(pooled, 0, "no pool, nothing pooled");
        }
    }
}
