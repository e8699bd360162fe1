//! The WireGuard socket's side channel over the in-memory network: datagrams that are not
//! WireGuard reach the sink (and a full sink drops and counts them), WireGuard still flows,
//! and raw datagrams go out from the current socket, also after a listen-port rebind.

mod memory_node;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use memory_node::{Node, bounded_sink, wait, with_side};
use plexd_dataplane::memory::{MemoryNetwork, tun_pair};
use plexd_dataplane::packet::ipv4_udp;
use plexd_dataplane::runner::{RunConfig, Shutdown, run};
use plexd_dataplane::{Device, PacketBatch, RawSender, Tun, Udp};

fn recv_one(socket: &impl Udp) -> (Vec<u8>, SocketAddr) {
    let mut batch = PacketBatch::for_datagrams(4);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if socket
            .recv(&mut batch, Duration::from_millis(50))
            .expect("recv")
            > 0
        {
            return (batch.get(0).to_vec(), batch.addr(0));
        }
        assert!(Instant::now() < deadline, "no datagram within 10 s");
    }
}

fn send_one(socket: &impl Udp, datagram: &[u8], to: SocketAddr) {
    let mut batch = PacketBatch::for_datagrams(1);
    batch.push(datagram, to);
    assert_eq!(socket.send(&batch).expect("send"), 1);
}

#[test]
fn other_datagrams_reach_the_sink_while_wireguard_flows_and_raw_sends_use_the_socket() {
    let net = MemoryNetwork::new();
    let (sink, side) = bounded_sink(16);
    let a = Node::start(&net, [192, 0, 2, 1], 51820, with_side(Some(sink)));
    let b = Node::start(&net, [192, 0, 2, 2], 51820, with_side(None));
    let (ea, eb): (SocketAddr, SocketAddr) = (
        "192.0.2.1:51820".parse().expect("addr"),
        "192.0.2.2:51820".parse().expect("addr"),
    );
    a.add_peer(&b, eb, "10.64.0.2/32");
    b.add_peer(&a, ea, "10.64.0.1/32");

    // A STUN-looking datagram and a disco one from a stranger reach a's sink, in order.
    let stranger = net
        .bind("198.51.100.9:3478".parse().expect("addr"))
        .expect("bind");
    let stun = [
        0u8, 1, 0, 0, 0x21, 0x12, 0xA4, 0x42, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    ];
    send_one(&stranger, &stun, ea);
    send_one(&stranger, b"pxd\x01probe", ea);
    let got = side
        .recv_timeout(Duration::from_secs(10))
        .expect("stun in the sink");
    assert_eq!(got, (stun.to_vec(), stranger.addr()));
    let got = side
        .recv_timeout(Duration::from_secs(10))
        .expect("disco in the sink");
    assert_eq!(got.0, b"pxd\x01probe");

    // WireGuard still works both ways with a sink in place.
    let (ma, mb) = (Ipv4Addr::new(10, 64, 0, 1), Ipv4Addr::new(10, 64, 0, 2));
    b.host
        .send_one(&ipv4_udp(mb, ma, b"to the node with a sink"));
    let mut batch = PacketBatch::for_packets(4);
    wait(
        || {
            a.host
                .recv(&mut batch, Duration::from_millis(50))
                .expect("recv")
                > 0
        },
        "the packet through a's data plane",
    );
    assert_eq!(&batch.get(0)[28..], b"to the node with a sink");
    assert!(side.try_recv().is_err(), "WireGuard never reaches the sink");
    assert_eq!(a.device.counters().malformed.load(Ordering::Relaxed), 0);

    // A raw datagram goes out from the WireGuard socket itself.
    a.raw
        .send(b"pxd\x01answer", stranger.addr())
        .expect("raw send");
    assert_eq!(recv_one(&stranger), (b"pxd\x01answer".to_vec(), ea));
}

#[test]
fn a_full_sink_drops_and_counts_and_no_sink_counts_malformed() {
    let net = MemoryNetwork::new();
    let (sink, side) = bounded_sink(2);
    let a = Node::start(&net, [192, 0, 2, 1], 51820, with_side(Some(sink)));
    let b = Node::start(&net, [192, 0, 2, 2], 51820, with_side(None));
    let stranger = net
        .bind("198.51.100.9:3478".parse().expect("addr"))
        .expect("bind");
    for i in 0..5u8 {
        send_one(&stranger, &[b'p', b'x', b'd', 1, i], a.addr());
        send_one(&stranger, &[b'p', b'x', b'd', 1, i], b.addr());
    }
    let dropped = &a.device.counters().side_dropped;
    wait(
        || dropped.load(Ordering::Relaxed) == 3,
        "three drops counted",
    );
    assert_eq!(side.try_iter().count(), 2, "the two the sink had room for");
    let malformed = &b.device.counters().malformed;
    wait(
        || malformed.load(Ordering::Relaxed) == 5,
        "b without a sink counts them malformed",
    );
    assert_eq!(b.device.counters().side_dropped.load(Ordering::Relaxed), 0);
}

#[test]
fn raw_sends_follow_a_listen_port_rebind() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    let net = MemoryNetwork::new();
    let dir = tempfile::tempdir().expect("dir");
    let socket = dir.path().join("a.sock");
    let (_host, tun) = tun_pair();
    let raw = RawSender::new();
    let config = RunConfig {
        uapi_socket: Some(socket.clone()),
        raw: Some(raw.clone()),
        ..RunConfig::default()
    };
    let shutdown = Shutdown::new();
    let (s, binder) = (shutdown.clone(), net.binder(IpAddr::from([192, 0, 2, 1])));
    let thread = std::thread::spawn(move || {
        run(
            Arc::new(Device::new(plexsphere_wire::clock::Now::system())),
            tun,
            binder,
            config,
            s,
        )
    });
    wait(|| UnixStream::connect(&socket).is_ok(), "the UAPI socket");
    let first = raw.local_addr().expect("bound");
    let peer = net
        .bind("198.51.100.1:9".parse().expect("addr"))
        .expect("bind");
    raw.send(b"pxr\x01one", peer.addr()).expect("send");
    assert_eq!(recv_one(&peer).1, first);

    let mut c = UnixStream::connect(&socket).expect("connect");
    c.write_all(b"set=1\nlisten_port=51999\n\n").expect("write");
    let mut line = String::new();
    BufReader::new(c).read_line(&mut line).expect("answer");
    assert_eq!(line.trim(), "errno=0");
    let moved: SocketAddr = "192.0.2.1:51999".parse().expect("addr");
    assert_eq!(raw.local_addr(), Some(moved));
    raw.send(b"pxr\x01two", peer.addr()).expect("send");
    assert_eq!(recv_one(&peer), (b"pxr\x01two".to_vec(), moved));
    shutdown.trigger();
    thread.join().expect("join").expect("clean stop");
}
