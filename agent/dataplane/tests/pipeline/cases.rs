// In-memory devices exchanging real WireGuard messages, with time stepped by the test;
// included by ../pipeline.rs once per protocol implementation (`PROTOCOL`).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use plexd_dataplane::packet::ipv4_udp;
use plexd_dataplane::{Crypto, Device, DeviceUpdate, PublicKey, PacketBatch, PeerUpdate, SecretKey};

use super::PROTOCOL;

struct Node {
    device: Device,
    key: PublicKey,
    addr: SocketAddr,
    mesh: Ipv4Addr,
    /// What the device handed to its TUN.
    tun: Vec<Vec<u8>>,
}

fn node(last: u8) -> (Node, SecretKey) {
    let sk = SecretKey::generate().expect("random");
    let device = Device::with_protocol(PROTOCOL, plexsphere_wire::clock::Now::system());
    device
        .apply(DeviceUpdate {
            private_key: Some(Some(sk.clone())),
            listen_port: Some(51820),
            ..Default::default()
        })
        .expect("key");
    let node = Node {
        device,
        key: sk.public_key(),
        addr: SocketAddr::from(([192, 0, 2, last], 51820)),
        mesh: Ipv4Addr::new(10, 64, 0, last),
        tun: Vec::new(),
    };
    (node, sk)
}

/// Makes `b` a peer of `a`: allowed IP b's mesh /32, endpoint if `with_endpoint`.
fn link(a: &Node, b: &Node, with_endpoint: bool, keepalive: Option<u16>) {
    let mut peer = PeerUpdate::new(b.key);
    peer.allowed_ips
        .push(format!("{}/32", b.mesh).parse().expect("net"));
    peer.endpoint = with_endpoint.then_some(b.addr);
    peer.persistent_keepalive = keepalive;
    a.device
        .apply(DeviceUpdate {
            peers: vec![peer],
            ..Default::default()
        })
        .expect("peer");
}

type Wire = Vec<(SocketAddr, SocketAddr, Vec<u8>)>;

fn collect(from: SocketAddr, out: &PacketBatch, wire: &mut Wire) {
    for (d, to) in out.iter() {
        wire.push((from, to, d.to_vec()));
    }
}

/// Delivers everything on the wire (and whatever that provokes) until it is quiet.
/// Datagrams to an address no node has are lost. Answers how many were delivered.
fn pump(nodes: &mut [&mut Node], now: Instant, wire: &mut Wire) -> usize {
    let mut delivered = 0;
    for _ in 0..100 {
        let Some((from, to, d)) = (!wire.is_empty()).then(|| wire.remove(0)) else {
            return delivered;
        };
        let Some(n) = nodes.iter_mut().find(|n| n.addr == to) else {
            continue;
        };
        delivered += 1;
        let mut net = PacketBatch::for_datagrams(4);
        let mut tun = PacketBatch::for_packets(4);
        n.device
            .handle_udp(now, [(&d[..], from, None)], &mut net, Crypto::Inline(&mut tun));
        n.tun.extend(tun.iter().map(|(p, _)| p.to_vec()));
        collect(n.addr, &net, wire);
    }
    panic!("the wire never went quiet");
}

fn send(n: &Node, now: Instant, dst: Ipv4Addr, payload: &[u8], wire: &mut Wire) {
    let mut net = PacketBatch::for_datagrams(4);
    n.device
        .handle_tun(now, [&ipv4_udp(n.mesh, dst, payload)[..]], Crypto::Inline(&mut net));
    collect(n.addr, &net, wire);
}

fn payloads(n: &mut Node) -> Vec<Vec<u8>> {
    n.tun.drain(..).map(|p| p[28..].to_vec()).collect()
}

#[test]
fn two_devices_handshake_and_exchange_packets_both_ways() {
    let (mut a, _) = node(1);
    let (mut b, _) = node(2);
    link(&a, &b, true, None);
    link(&b, &a, false, None); // b learns a's endpoint from the handshake
    let now = Instant::now();
    let mut wire = Wire::new();

    send(&a, now, b.mesh, b"first", &mut wire);
    assert_eq!(
        wire.len(),
        1,
        "a handshake initiation, the packet is queued"
    );
    assert_eq!(wire[0].2[0], 1, "message type 1");
    pump(&mut [&mut a, &mut b], now, &mut wire);
    assert_eq!(payloads(&mut b), vec![b"first".to_vec()]);

    send(&b, now, a.mesh, b"reply", &mut wire);
    assert_eq!(wire.len(), 1, "the session exists: straight to data");
    assert_eq!(
        wire[0].1, a.addr,
        "b learned a's endpoint from the handshake"
    );
    pump(&mut [&mut a, &mut b], now, &mut wire);
    assert_eq!(payloads(&mut a), vec![b"reply".to_vec()]);

    let snap = a.device.snapshot(now, std::time::SystemTime::now());
    assert!(snap.peers[0].last_handshake.is_some());
    assert!(snap.peers[0].tx_bytes > 0 && snap.peers[0].rx_bytes > 0);
}

#[test]
fn a_roaming_peer_is_followed_to_its_new_address() {
    let (mut a, _) = node(1);
    let (mut c, _) = node(3);
    link(&a, &c, false, None);
    link(&c, &a, true, None);
    let now = Instant::now();
    let mut wire = Wire::new();
    send(&c, now, a.mesh, b"hello", &mut wire);
    pump(&mut [&mut a, &mut c], now, &mut wire);
    assert_eq!(payloads(&mut a), vec![b"hello".to_vec()]);
    assert_eq!(a.device.peer(&c.key).expect("c").endpoint(), Some(c.addr));

    // c's NAT mapping changes: same keys, new source address.
    c.addr = SocketAddr::from(([198, 51, 100, 7], 40000));
    send(&c, now, a.mesh, b"moved", &mut wire);
    pump(&mut [&mut a, &mut c], now, &mut wire);
    assert_eq!(payloads(&mut a), vec![b"moved".to_vec()]);
    assert_eq!(a.device.peer(&c.key).expect("c").endpoint(), Some(c.addr));

    send(&a, now, c.mesh, b"found you", &mut wire);
    assert_eq!(wire[0].1, c.addr, "a answers at the new address");
    pump(&mut [&mut a, &mut c], now, &mut wire);
    assert_eq!(payloads(&mut c), vec![b"found you".to_vec()]);
}

#[test]
fn unknown_destinations_forged_sources_and_corrupt_datagrams_are_dropped_and_counted() {
    let (mut a, _) = node(1);
    let (mut b, _) = node(2);
    link(&a, &b, true, None);
    link(&b, &a, true, None);
    let now = Instant::now();
    let mut wire = Wire::new();

    send(&a, now, Ipv4Addr::new(192, 0, 2, 200), b"nobody", &mut wire);
    assert!(wire.is_empty());
    assert_eq!(a.device.counters().no_route.load(Ordering::Relaxed), 1);

    send(&a, now, b.mesh, b"x", &mut wire);
    pump(&mut [&mut a, &mut b], now, &mut wire);
    assert_eq!(payloads(&mut b).len(), 1);

    // A data message with one flipped byte fails authentication.
    send(&a, now, b.mesh, b"tampered", &mut wire);
    let (from, _, mut d) = wire.remove(0);
    let last = d.len() - 1;
    d[last] ^= 1;
    let mut net = PacketBatch::for_datagrams(4);
    let mut tun = PacketBatch::for_packets(4);
    b.device
        .handle_udp(now, [(&d[..], from, None)], &mut net, Crypto::Inline(&mut tun));
    assert!(net.is_empty() && tun.is_empty());
    assert_eq!(b.device.counters().rejected.load(Ordering::Relaxed), 1);

    // Garbage of every short length, and random bytes with valid message types.
    for len in 0..200 {
        let mut g = vec![0xa5u8; len];
        if let Some(t) = g.first_mut() {
            *t = (len % 5) as u8;
        }
        b.device
            .handle_udp(now, [(&g[..], from, None)], &mut net, Crypto::Inline(&mut tun));
    }
    assert!(tun.is_empty(), "garbage never reaches the TUN");
    assert!(b.device.counters().malformed.load(Ordering::Relaxed) > 0);

    // b may only send from its own mesh IP; a forged source is dropped by a.
    let mut out = PacketBatch::for_datagrams(4);
    let forged = ipv4_udp(Ipv4Addr::new(10, 64, 0, 99), a.mesh, b"forged");
    b.device.handle_tun(now, [&forged[..]], Crypto::Inline(&mut out));
    collect(b.addr, &out, &mut wire);
    pump(&mut [&mut a, &mut b], now, &mut wire);
    assert!(a.tun.is_empty());
    assert_eq!(a.device.counters().not_allowed.load(Ordering::Relaxed), 1);

    // And the session still works after all that.
    send(&b, now, a.mesh, b"still here", &mut wire);
    pump(&mut [&mut a, &mut b], now, &mut wire);
    assert_eq!(payloads(&mut a), vec![b"still here".to_vec()]);
}

#[test]
fn persistent_keepalives_follow_the_stepped_clock() {
    let (mut a, _) = node(1);
    let (mut b, _) = node(2);
    link(&a, &b, true, Some(25));
    link(&b, &a, false, None);
    let t0 = Instant::now();
    let mut wire = Wire::new();
    let tick = |n: &Node, at: Instant, wire: &mut Wire| {
        let mut out = PacketBatch::for_datagrams(4);
        // The wall clock at `at`, as the device's own reading (taken at its start) expects it.
        let now = plexsphere_wire::clock::Now::system();
        let wall = now.wall_at(at).expect("a wall time");
        n.device.handle_timer(plexsphere_wire::clock::Now::new(at, wall), &mut out);
        collect(n.addr, &out, wire);
    };

    // Turning keepalive on with a known endpoint starts the session right away.
    tick(&a, t0, &mut wire);
    assert_eq!(wire.len(), 1);
    assert_eq!(wire[0].2[0], 1, "a handshake initiation");
    pump(&mut [&mut a, &mut b], t0, &mut wire);
    assert!(b.device.peer(&a.key).expect("a").endpoint().is_some());

    tick(&a, t0 + Duration::from_secs(10), &mut wire);
    assert!(wire.is_empty(), "not due before 25 s");

    tick(&a, t0 + Duration::from_secs(25), &mut wire);
    assert_eq!(wire.len(), 1, "one keepalive at 25 s");
    assert_eq!(wire[0].2[0], 4, "a data message");
    assert_eq!(wire[0].2.len(), 32, "with an empty payload");
    assert_eq!(pump(&mut [&mut a, &mut b], t0, &mut wire), 1);
    assert!(b.tun.is_empty(), "a keepalive carries nothing to the TUN");

    tick(&a, t0 + Duration::from_secs(30), &mut wire);
    assert!(wire.is_empty(), "the next one is due at 50 s");
    tick(&a, t0 + Duration::from_secs(50), &mut wire);
    assert_eq!(wire.len(), 1);

    // b has no keepalive configured: its timer sends nothing on its own.
    wire.clear();
    tick(&b, t0 + Duration::from_secs(50), &mut wire);
    assert!(wire.is_empty());
}

#[test]
fn packets_without_an_endpoint_are_dropped_and_counted() {
    let (a, _) = node(1);
    let (b, _) = node(2);
    link(&a, &b, false, None);
    let mut wire = Wire::new();
    send(&a, Instant::now(), b.mesh, b"where?", &mut wire);
    assert!(wire.is_empty());
    assert_eq!(a.device.counters().no_endpoint.load(Ordering::Relaxed), 1);
}

#[test]
fn a_loaded_device_answers_with_cookies_and_accepts_initiations_that_carry_one() {
    use boringtun::noise::{Tunn, TunnResult};
    use boringtun::x25519::{PublicKey, StaticSecret};

    let (b, kb) = node(2);
    let ka = SecretKey::generate().expect("key");
    let mut peer = PeerUpdate::new(ka.public_key());
    peer.allowed_ips.push("10.64.0.1/32".parse().expect("net"));
    b.device
        .apply(DeviceUpdate {
            peers: vec![peer],
            ..Default::default()
        })
        .expect("peer");
    // The initiator is a bare boringtun state machine, so the test controls every message.
    let mut a = Tunn::new(
        StaticSecret::from(*ka.bytes()),
        PublicKey::from(kb.public_key().0),
        None,
        None,
        7,
        None,
    );
    let from = SocketAddr::from(([198, 51, 100, 1], 40000));
    let now = Instant::now();
    let mut buf = vec![0u8; 256];
    let mut cookie = None;
    // More initiations than the device takes per second: it starts asking for cookies.
    for _ in 0..2 * plexd_dataplane::device::HANDSHAKE_RATE_LIMIT {
        let TunnResult::WriteToNetwork(init) = a.format_handshake_initiation(&mut buf, true) else {
            panic!("no initiation");
        };
        let init = init.to_vec();
        let mut net = PacketBatch::for_datagrams(4);
        let mut tun = PacketBatch::for_packets(4);
        b.device
            .handle_udp(now, [(&init[..], from, None)], &mut net, Crypto::Inline(&mut tun));
        if let Some((reply, to)) = net.iter().next()
            && reply[0] == 3
        {
            assert_eq!(to, from, "the cookie goes back to the sender's address");
            cookie = Some(reply.to_vec());
            break;
        }
    }
    let cookie = cookie.expect("a loaded device answers initiations with a cookie reply");
    // With the cookie, the next initiation carries a valid MAC2 and is answered.
    let mut out = vec![0u8; 256];
    assert!(matches!(
        a.decapsulate(Some(from.ip()), &cookie, &mut out),
        TunnResult::Done
    ));
    let TunnResult::WriteToNetwork(init) = a.format_handshake_initiation(&mut buf, true) else {
        panic!("no initiation");
    };
    let init = init.to_vec();
    let mut net = PacketBatch::for_datagrams(4);
    let mut tun = PacketBatch::for_packets(4);
    // A second later: a responder takes at most 20 initiations a second from one peer
    // (plexd's own protocol, like the kernel's), whatever their cookies.
    let later = now + Duration::from_secs(1);
    b.device
        .handle_udp(later, [(&init[..], from, None)], &mut net, Crypto::Inline(&mut tun));
    assert_eq!(net.len(), 1);
    assert_eq!(net.get(0)[0], 2, "a handshake response, despite the load");
    assert_eq!(
        b.device.peer(&ka.public_key()).expect("peer").endpoint(),
        Some(from)
    );
}

#[test]
fn a_flow_keeps_its_order_across_the_first_handshake_on_the_responder_side() {
    let (mut a, _) = node(1);
    let (mut b, _) = node(2);
    link(&a, &b, true, None);
    link(&b, &a, true, None);
    let now = Instant::now();
    let mut wire = Wire::new();
    send(&a, now, b.mesh, b"a0", &mut wire);
    // Only the initiation reaches b; b answers, but has no session to send on until a's
    // first data confirms it: boringtun queues what b's host sends meanwhile.
    let (from, _, init) = wire.remove(0);
    let mut net = PacketBatch::for_datagrams(4);
    let mut tun = PacketBatch::for_packets(4);
    b.device
        .handle_udp(now, [(&init[..], from, None)], &mut net, Crypto::Inline(&mut tun));
    collect(b.addr, &net, &mut wire);
    send(&b, now, a.mesh, b"b0", &mut wire);
    pump(&mut [&mut a, &mut b], now, &mut wire);
    assert_eq!(payloads(&mut b), vec![b"a0".to_vec()]);
    send(&b, now, a.mesh, b"b1", &mut wire);
    pump(&mut [&mut a, &mut b], now, &mut wire);
    assert_eq!(
        payloads(&mut a),
        vec![b"b0".to_vec(), b"b1".to_vec()],
        "b's early packet first, then the later one"
    );
}

#[test]
fn a_forged_cookie_reply_from_another_address_does_not_move_the_endpoint() {
    use boringtun::noise::TunnResult;
    use boringtun::noise::rate_limiter::RateLimiter;
    use boringtun::x25519::PublicKey;

    let (mut a, _) = node(1);
    let (mut b, _) = node(2);
    link(&a, &b, true, None);
    link(&b, &a, false, None);
    let now = Instant::now();
    let mut wire = Wire::new();
    send(&a, now, b.mesh, b"first", &mut wire);
    assert_eq!(wire.len(), 1);
    let init = wire[0].2.clone();
    assert_eq!(init[0], 1, "a's initiation, seen on the way");

    // Anyone who saw the initiation and knows b's public key (every peer of b does) can make
    // a cookie reply to it that a's state machine opens.
    let forger = RateLimiter::new(&PublicKey::from(b.key.0), 0);
    let attacker = SocketAddr::from(([203, 0, 113, 66], 40000));
    let mut buf = [0u8; 256];
    let Err(TunnResult::WriteToNetwork(cookie)) =
        forger.verify_packet(Some(attacker.ip()), &init, &mut buf)
    else {
        panic!("the forger makes a cookie reply");
    };
    let cookie = cookie.to_vec();
    assert_eq!(cookie[0], 3);
    for _ in 0..2 {
        let mut net = PacketBatch::for_datagrams(4);
        let mut tun = PacketBatch::for_packets(4);
        a.device
            .handle_udp(now, [(&cookie[..], attacker, None)], &mut net, Crypto::Inline(&mut tun));
        assert!(net.is_empty() && tun.is_empty());
        assert_eq!(
            a.device.peer(&b.key).expect("b").endpoint(),
            Some(b.addr),
            "a cookie reply (here forged, then replayed) does not move the endpoint"
        );
    }
    let snap = a.device.snapshot(now, std::time::SystemTime::now());
    assert_eq!(snap.peers[0].rx_bytes, 0, "nothing was received from b");

    // The handshake still completes with b at its own address, and traffic flows.
    pump(&mut [&mut a, &mut b], now, &mut wire);
    assert_eq!(payloads(&mut b), vec![b"first".to_vec()]);
    assert_eq!(a.device.peer(&b.key).expect("b").endpoint(), Some(b.addr));
}
