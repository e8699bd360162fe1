//! Relayed peers inside the data plane over the in-memory network: two nodes whose endpoints
//! for each other are relay endpoints (`plexd_dataplane::relay`) carry traffic through a
//! stand-in relay (frames `send` in, `recv` out, as `plexsphere relay` does) with no forwarder;
//! a `recv` that names another peer than its datagram's, or a frame from an address that is not
//! a relay the node uses, moves no endpoint.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use plexd_dataplane::memory::{MemoryNetwork, MemorySocket, MemoryTun, tun_pair};
use plexd_dataplane::packet::ipv4_udp;
use plexd_dataplane::relay::decode;
use plexd_dataplane::runner::{RunConfig, RunError, Shutdown, run};
use plexd_dataplane::{
    Device, DeviceUpdate, Key, PacketBatch, PeerUpdate, RawSender, SecretKey, SideSink, Tun, Udp,
};
use plexsphere_wire::reach::relay::{Frame, KeyPrefix, prefix};

struct Node {
    host: MemoryTun,
    device: Arc<Device>,
    raw: RawSender,
    shutdown: Shutdown,
    thread: Option<JoinHandle<Result<(), RunError>>>,
    key: SecretKey,
    side: mpsc::Receiver<(Vec<u8>, SocketAddr)>,
}

impl Node {
    fn start(net: &MemoryNetwork, ip: [u8; 4]) -> Node {
        let (host, tun) = tun_pair();
        let key = SecretKey::generate().expect("key");
        let device = Arc::new(Device::new());
        device
            .apply(DeviceUpdate {
                private_key: Some(Some(key.clone())),
                ..DeviceUpdate::default()
            })
            .expect("key");
        device.set_listen_port(51820);
        let raw = RawSender::new();
        let (tx, side) = mpsc::sync_channel(64);
        let config = RunConfig {
            side: Some(SideSink::new(move |d, from| {
                tx.try_send((d.to_vec(), from)).is_ok()
            })),
            raw: Some(raw.clone()),
            ..RunConfig::default()
        };
        let shutdown = Shutdown::new();
        let (d, s, binder) = (
            device.clone(),
            shutdown.clone(),
            net.binder(IpAddr::from(ip)),
        );
        let thread = std::thread::spawn(move || run(d, tun, binder, config, s));
        wait(|| raw.local_addr().is_some(), "the runner binds its socket");
        Node {
            host,
            device,
            raw,
            shutdown,
            thread: Some(thread),
            key,
            side,
        }
    }

    fn public(&self) -> Key {
        Key(self.key.public_key().0)
    }

    fn addr(&self) -> SocketAddr {
        self.raw.local_addr().expect("bound")
    }

    /// `other` as a peer reached through the relay at `relay`; answers its relay endpoint.
    fn add_relayed_peer(&self, other: &Node, relay: SocketAddr, mesh: &str) -> SocketAddr {
        self.device
            .relays()
            .set(&[relay])
            .expect("room for a relay");
        let endpoint = self
            .device
            .relay_endpoint(relay, &other.public())
            .expect("a relay endpoint");
        self.device
            .apply(DeviceUpdate {
                peers: vec![PeerUpdate {
                    endpoint: Some(endpoint),
                    replace_allowed_ips: true,
                    allowed_ips: vec![mesh.parse().expect("net")],
                    ..PeerUpdate::new(other.public())
                }],
                ..DeviceUpdate::default()
            })
            .expect("peer");
        endpoint
    }

    fn endpoint_of(&self, other: &Node) -> Option<SocketAddr> {
        self.device.peer(&other.public()).and_then(|p| p.endpoint())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shutdown.trigger();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn wait(mut ok: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "{what} within 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
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

struct Lab {
    a: Node,
    b: Node,
    relay: StandInRelay,
    net: MemoryNetwork,
}

fn lab() -> Lab {
    let net = MemoryNetwork::new();
    let a = Node::start(&net, [192, 0, 2, 1]);
    let b = Node::start(&net, [192, 0, 2, 2]);
    let socket = net
        .bind("203.0.113.9:3478".parse().expect("addr"))
        .expect("bind the relay");
    let relay = StandInRelay::start(
        socket,
        &[
            (prefix(&a.public().0), a.addr()),
            (prefix(&b.public().0), b.addr()),
        ],
    );
    let ea = b.add_relayed_peer(&a, relay.addr, "10.64.0.1/32");
    let eb = a.add_relayed_peer(&b, relay.addr, "10.64.0.2/32");
    assert_eq!(decode(eb).map(|(_, p)| p), Some(prefix(&b.public().0)));
    assert_eq!(decode(ea).map(|(_, p)| p), Some(prefix(&a.public().0)));
    Lab { a, b, relay, net }
}

#[test]
fn relayed_peers_carry_traffic_framed_by_the_data_plane_itself() {
    let l = lab();
    let eb = l.a.endpoint_of(&l.b).expect("a relay endpoint");
    carries(&l.a, &l.b, (MA, MB), b"through the relay");
    carries(&l.b, &l.a, (MB, MA), b"and back");
    // Every WireGuard datagram went out framed, and came in unwrapped: the relay saw sends
    // (handshake, data), the side channels saw no WireGuard.
    for n in [&l.a, &l.b] {
        let c = &n.device.relays().counters;
        assert!(c.framed.load(Ordering::Relaxed) >= 2, "framed: {c:?}");
        assert!(c.unwrapped.load(Ordering::Relaxed) >= 2, "unwrapped: {c:?}");
        assert_eq!(c.gone.load(Ordering::Relaxed), 0);
        assert!(n.side.try_recv().is_err(), "nothing for the runtime");
    }
    assert!(l.relay.sends.load(Ordering::Relaxed) >= 4);
    // The endpoints stay the relay endpoints (replies go back through the relay).
    assert_eq!(l.a.endpoint_of(&l.b), Some(eb));
    assert_eq!(
        l.b.endpoint_of(&l.a).and_then(decode).map(|(_, p)| p),
        Some(prefix(&l.a.public().0))
    );
}

#[test]
fn a_recv_naming_another_peer_is_dropped_and_moves_no_endpoint() {
    let l = lab();
    carries(&l.a, &l.b, (MA, MB), b"first");
    let ea = l.b.endpoint_of(&l.a).expect("endpoint");
    // From now on the relay names a key prefix no one has for a's datagrams.
    l.relay.misname.store(true, Ordering::Relaxed);
    l.a.host.send_one(&ipv4_udp(MA, MB, b"misnamed"));
    let misnamed = &l.b.device.counters().relay_misnamed;
    wait(
        || misnamed.load(Ordering::Relaxed) >= 1,
        "b refuses the misnamed datagram",
    );
    assert_eq!(l.b.endpoint_of(&l.a), Some(ea), "a's endpoint unchanged");
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
    while l.b.side.try_recv().is_ok() {}
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
    let (got, from) =
        l.b.side
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
    assert!(decode(l.b.endpoint_of(&l.a).expect("endpoint")).is_some());
}
