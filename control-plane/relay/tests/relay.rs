//! A real relay on loopback and nodes made of the wire codecs: registration over UDP and
//! TCP/TLS, forwarding both ways, every refusal, STUN, and the limits.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use tokio::io::AsyncWriteExt as _;

use common::*;
use plexsphere_relay::Limits;
use plexsphere_wire::key::PublicKey;
use plexsphere_wire::reach::relay::{Frame, RefuseCode, prefix};
use plexsphere_wire::signed::DomainSigner;

fn refused(frame: Frame) -> (RefuseCode, String) {
    match frame {
        Frame::Refused { code, reason } => (code, reason),
        f => panic!("want refused, got {f:?}"),
    }
}

async fn exchange(a: &mut Node, b: &mut Node) {
    let wg = vec![4u8, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    a.send_to(&b.pk, &wg).await;
    assert_eq!(
        b.link.recv().await,
        Frame::Recv {
            src: prefix(&a.pk),
            payload: wg.clone()
        }
    );
    let big = vec![0xAB; 1452];
    b.send_to(&a.pk, &big).await;
    assert_eq!(
        a.link.recv().await,
        Frame::Recv {
            src: prefix(&b.pk),
            payload: big
        }
    );
}

#[tokio::test]
async fn udp_to_udp_both_ways() {
    let tls = tls();
    let relay = relay(Limits::default(), &tls).await;
    let mut a = Node::new(1, Link::udp(&relay).await);
    let mut b = Node::new(2, Link::udp(&relay).await);
    a.register().await;
    b.register().await;
    exchange(&mut a, &mut b).await;
    until(&relay, "two frames counted", |s| s.forwarded_frames == 2).await;
    assert_eq!(relay.registered(), 2);
}

#[tokio::test]
async fn udp_to_tcp_and_tcp_to_tcp_both_ways() {
    let tls = tls();
    let relay = relay(Limits::default(), &tls).await;
    let mut a = Node::new(1, Link::udp(&relay).await);
    let mut b = Node::new(2, Link::tcp(&relay, &tls).await);
    let mut c = Node::new(3, Link::tcp(&relay, &tls).await);
    a.register().await;
    b.register().await;
    c.register().await;
    exchange(&mut a, &mut b).await;
    exchange(&mut b, &mut c).await;
    // Ping over TCP.
    c.link.send(&Frame::Ping { nonce: [5; 8] }).await;
    assert_eq!(c.link.recv().await, Frame::Pong { nonce: [5; 8] });
}

/// A burst from UDP nodes to one TCP node leaves the relay's writer in few large writes
/// (`TCP_WRITE_BATCH`); every frame arrives whole and in order, each one after its length.
#[tokio::test]
async fn a_burst_to_a_tcp_node_arrives_whole_and_in_order() {
    let tls = tls();
    let relay = relay(Limits::default(), &tls).await;
    let mut a = Node::new(1, Link::udp(&relay).await);
    let mut b = Node::new(2, Link::tcp(&relay, &tls).await);
    a.register().await;
    b.register().await;
    // 40 WireGuard-sized frames: well inside the relay's socket buffer and b's queue.
    let frames: Vec<Vec<u8>> = (0..40u8)
        .map(|i| {
            let mut p = vec![0xCD; 1452];
            p[0] = i;
            p
        })
        .collect();
    for payload in &frames {
        a.send_to(&b.pk, payload).await;
    }
    for payload in frames {
        assert_eq!(
            b.link.recv().await,
            Frame::Recv {
                src: prefix(&a.pk),
                payload
            }
        );
    }
}

/// A TCP node's frames read together (many in one read, one cut across two writes with a
/// pause between) are handled in order: the sends to a UDP node leave as one batch and arrive
/// whole and in order, the ones to a TCP node and the answer to a ping interleaved as sent;
/// every forward is counted.
#[tokio::test]
async fn a_burst_from_a_tcp_node_is_forwarded_whole_in_order_and_counted() {
    let tls = tls();
    let relay = relay(Limits::default(), &tls).await;
    let mut a = Node::new(1, Link::tcp(&relay, &tls).await);
    let mut b = Node::new(2, Link::udp(&relay).await);
    let mut c = Node::new(3, Link::tcp(&relay, &tls).await);
    a.register().await;
    b.register().await;
    c.register().await;
    let payload = |i: u8, len: usize| {
        let mut p = vec![0xAB; len];
        p[0] = i;
        p
    };
    let mut stream = Vec::new();
    for i in 0..100u8 {
        let dst = if i % 10 == 9 { &c.pk } else { &b.pk };
        let send = Frame::Send {
            dst: prefix(dst),
            // Runs of one length (a GSO send) and others.
            payload: payload(i, if i % 7 == 0 { 300 } else { 1452 }),
        };
        stream.extend_from_slice(&send.to_stream());
        if i == 50 {
            stream.extend_from_slice(&Frame::Ping { nonce: [8; 8] }.to_stream());
        }
    }
    let Link::Tcp(s) = &mut a.link else {
        unreachable!("a is over TCP")
    };
    // All but half of the last frame, then the rest.
    let cut = stream.len() - 700;
    s.write_all(&stream[..cut]).await.unwrap();
    s.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(&stream[cut..]).await.unwrap();
    s.flush().await.unwrap();
    for (node, to_c) in [(&mut b, false), (&mut c, true)] {
        for i in (0..100u8).filter(|i| (i % 10 == 9) == to_c) {
            let want = payload(i, if i % 7 == 0 { 300 } else { 1452 });
            assert_eq!(
                node.link.recv().await,
                Frame::Recv {
                    src: prefix(&a.pk),
                    payload: want
                },
                "frame {i}"
            );
        }
    }
    assert_eq!(a.link.recv().await, Frame::Pong { nonce: [8; 8] });
    until(&relay, "every forward counted", |s| {
        s.forwarded_frames == 100
    })
    .await;
}

/// A read of many tiny frames (1,000 two-byte sends in one write, more than one hold of the
/// core's lock takes and more than one batch of recvs) is handled whole.
#[tokio::test]
async fn a_read_of_many_tiny_frames_is_handled_whole_in_order() {
    let tls = tls();
    let relay = relay(Limits::default(), &tls).await;
    let mut a = Node::new(1, Link::tcp(&relay, &tls).await);
    let mut b = Node::new(2, Link::udp(&relay).await);
    a.register().await;
    b.register().await;
    let mut stream = Vec::new();
    for i in 0..1000u16 {
        let send = Frame::Send {
            dst: prefix(&b.pk),
            payload: i.to_be_bytes().to_vec(),
        };
        stream.extend_from_slice(&send.to_stream());
    }
    let Link::Tcp(s) = &mut a.link else {
        unreachable!("a is over TCP")
    };
    s.write_all(&stream).await.unwrap();
    s.flush().await.unwrap();
    // Every one forwarded (b's socket buffer may drop some of 1,000 datagrams that arrive at
    // once; the relay's count is of what it sent), the first first.
    until(&relay, "1,000 forwards", |s| s.forwarded_frames == 1000).await;
    assert_eq!(
        b.link.recv().await,
        Frame::Recv {
            src: prefix(&a.pk),
            payload: vec![0, 0]
        }
    );
}

#[tokio::test]
async fn a_newer_registration_wins_wherever_it_comes_from() {
    let tls = tls();
    let relay = relay(Limits::default(), &tls).await;
    let mut a = Node::new(1, Link::udp(&relay).await);
    let mut b_udp = Node::new(2, Link::udp(&relay).await);
    b_udp.register().await;
    a.register().await;
    // The same key registers again over TCP: frames for it go there now.
    let mut b_tcp = Node::new(2, Link::tcp(&relay, &tls).await);
    b_tcp.register().await;
    a.send_to(&b_tcp.pk, b"moved").await;
    assert_eq!(
        b_tcp.link.recv().await,
        Frame::Recv {
            src: prefix(&a.pk),
            payload: b"moved".to_vec()
        }
    );
    assert_eq!(
        b_udp.link.recv_within(Duration::from_millis(200)).await,
        None
    );
    // The old UDP address is no longer registered.
    b_udp.send_to(&a.pk, b"x").await;
    assert_eq!(
        refused(b_udp.link.recv().await).0,
        RefuseCode::NotRegistered
    );
}

#[tokio::test]
async fn refusals_say_why() {
    let tls = tls();
    let relay = relay(Limits::default(), &tls).await;
    for link in [Link::udp(&relay).await, Link::tcp(&relay, &tls).await] {
        let tcp = matches!(link, Link::Tcp(_));
        let mut n = Node::new(9, link);
        let other = plexsphere_wire::reach::public_key(&[8; 32]);

        // A send before registering: over UDP refused (within the prefix's and the global
        // rate); over TCP, where a connection that never registered is answered nothing but
        // the registration exchange, dropped (the next frame it gets is the challenge below).
        n.send_to(&other, b"early").await;
        if !tcp {
            assert_eq!(refused(n.link.recv().await).0, RefuseCode::NotRegistered);
        }

        // A token for another key.
        let t = token(&domain(), &other, now_unix() + 600);
        let (code, reason) = refused(n.register_with(t).await);
        assert_eq!(code, RefuseCode::BadToken);
        assert!(reason.contains("another WireGuard key"), "{reason}");

        // An expired token.
        let t = token(&domain(), &n.pk, now_unix() - 1);
        assert_eq!(refused(n.register_with(t).await).0, RefuseCode::Expired);

        // A token signed by another Domain.
        let stranger = DomainSigner::from_seed(&[99; 32]).unwrap();
        let t = token(&stranger, &n.pk, now_unix() + 600);
        let (code, reason) = refused(n.register_with(t).await);
        assert_eq!(code, RefuseCode::BadToken);
        assert!(reason.contains("--domain-key"), "{reason}");

        // Not a token at all.
        assert_eq!(
            refused(n.register_with(b"{}".to_vec()).await).0,
            RefuseCode::BadToken
        );

        // A wrong proof.
        let cookie = n.challenge().await;
        let mut proof = n.proof(&cookie);
        proof[0] ^= 1;
        let good = token(&domain(), &n.pk, now_unix() + 600);
        n.link
            .send(&Frame::Register {
                node: n.pk,
                cookie,
                proof,
                token: good.clone(),
            })
            .await;
        let (code, reason) = refused(n.link.recv().await);
        assert_eq!(code, RefuseCode::BadProof);
        assert!(reason.contains("proof"), "{reason}");

        // A cookie this relay did not give this address (a stale one looks the same: its
        // epoch is over; the cookie's unit tests step the clock).
        let mut elsewhere = Node::new(9, Link::udp(&relay).await);
        let foreign = elsewhere.challenge().await;
        let proof = n.proof(&foreign);
        n.link
            .send(&Frame::Register {
                node: n.pk,
                cookie: foreign,
                proof,
                token: good,
            })
            .await;
        let (code, reason) = refused(n.link.recv().await);
        assert_eq!(code, RefuseCode::BadProof);
        assert!(reason.contains("cookie"), "{reason}");

        // Still not registered after all that.
        n.send_to(&other, b"late").await;
        if !tcp {
            assert_eq!(refused(n.link.recv().await).0, RefuseCode::NotRegistered);
        }
    }
    assert_eq!(relay.registered(), 0);
}

#[tokio::test]
async fn peer_gone_for_an_unknown_destination() {
    let tls = tls();
    let relay = relay(Limits::default(), &tls).await;
    let mut a = Node::new(1, Link::udp(&relay).await);
    a.register().await;
    a.send_to(&PublicKey([0xEE; 32]), b"anyone?").await;
    assert_eq!(a.link.recv().await, Frame::PeerGone { dst: [0xEE; 8] });
}

#[tokio::test]
async fn stun_answers_the_senders_address_v4_and_v6() {
    let tls = tls();
    let relay = relay(Limits::default(), &tls).await;
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let req = plexsphere_relay::stun::binding_request([7; 12]);
    sock.send_to(&req, relay.udp_addr.unwrap()).await.unwrap();
    let mut buf = [0u8; 1500];
    let (n, _) = tokio::time::timeout(WAIT, sock.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        plexsphere_relay::stun::mapped_address(&buf[..n], [7; 12]),
        Some(sock.local_addr().unwrap())
    );

    // The control plane's responder, on ::1.
    let Ok(server) = tokio::net::UdpSocket::bind("[::1]:0").await else {
        eprintln!("no IPv6 loopback here; skipping the v6 half");
        return;
    };
    let server_addr = server.local_addr().unwrap();
    let task = tokio::spawn(plexsphere_relay::stun::serve(
        server,
        plexsphere_relay::limits::DEFAULT_PREFIX_ANSWERS,
    ));
    let client = tokio::net::UdpSocket::bind("[::1]:0").await.unwrap();
    client.send_to(&req, server_addr).await.unwrap();
    let (n, _) = tokio::time::timeout(WAIT, client.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        plexsphere_relay::stun::mapped_address(&buf[..n], [7; 12]),
        Some(client.local_addr().unwrap())
    );
    task.abort();
}

#[tokio::test]
async fn a_flood_is_cut_at_the_nodes_budget() {
    let tls = tls();
    let limits = Limits {
        node_frames_per_sec: 50,
        ..Limits::default()
    };
    let relay = relay(limits, &tls).await;
    let mut a = Node::new(1, Link::udp(&relay).await);
    let mut b = Node::new(2, Link::udp(&relay).await);
    a.register().await;
    b.register().await;
    let started = std::time::Instant::now();
    // In batches the relay's socket buffer holds, so none is lost before the relay reads it.
    for batch in 1..=10u64 {
        for i in 0..100u32 {
            a.send_to(&b.pk, &i.to_be_bytes()).await;
        }
        until(&relay, "every send counted", |s| {
            s.forwarded_frames + s.dropped_budget >= batch * 100
        })
        .await;
    }
    let s = relay.stats();
    // The burst (50) plus what refilled while the flood lasted.
    let allowed = 50 + (started.elapsed().as_secs_f64() * 50.0).ceil() as u64;
    assert!(s.forwarded_frames <= allowed, "{s:?} allowed {allowed}");
    assert!(s.dropped_budget >= 1000 - allowed, "{s:?}");
    // The sender hears that it is over its budget.
    let mut busy = false;
    while let Some(f) = a.link.recv_within(Duration::from_millis(200)).await {
        busy |= matches!(
            f,
            Frame::Refused {
                code: RefuseCode::Busy,
                ..
            }
        );
    }
    assert!(busy);
}

#[tokio::test]
async fn max_nodes_gives_busy() {
    let tls = tls();
    let limits = Limits {
        max_nodes: 1,
        ..Limits::default()
    };
    let relay = relay(limits, &tls).await;
    let mut a = Node::new(1, Link::udp(&relay).await);
    a.register().await;
    let mut b = Node::new(2, Link::tcp(&relay, &tls).await);
    let t = token(&domain(), &b.pk, now_unix() + 600);
    let (code, reason) = refused(b.register_with(t).await);
    assert_eq!(code, RefuseCode::Busy);
    assert!(reason.contains("--max-nodes"), "{reason}");
    // A renewal of a registered node still works at the limit.
    a.register().await;
}

#[tokio::test]
async fn a_slow_tcp_reader_costs_bounded_memory() {
    let tls = tls();
    let limits = Limits {
        node_frames_per_sec: 0,
        node_bytes_per_sec: 0,
        ..Limits::default()
    };
    let relay = relay(limits, &tls).await;
    let mut a = Node::new(1, Link::udp(&relay).await);
    let mut slow = Node::new(2, Link::tcp(&relay, &tls).await);
    a.register().await;
    slow.register().await;
    // `slow` never reads again: its socket buffers fill, then its queue, then frames drop.
    let payload = vec![0x55; 1400];
    let mut sent = 0u64;
    while relay.stats().dropped_queue_full == 0 {
        for _ in 0..500 {
            a.send_to(&slow.pk, &payload).await;
        }
        sent += 500;
        assert!(sent < 500_000, "no frame was dropped: {:?}", relay.stats());
        tokio::task::yield_now().await;
    }
    // The relay is still there for everyone else.
    a.link.send(&Frame::Ping { nonce: [1; 8] }).await;
    let mut pong = false;
    while let Some(f) = a.link.recv_within(Duration::from_secs(2)).await {
        if f == (Frame::Pong { nonce: [1; 8] }) {
            pong = true;
            break;
        }
    }
    assert!(pong);
}

/// The UDP side runs one thread a core, each with its own socket on the one address; nodes the
/// kernel spreads over them reach each other, and every datagram a node gets from the relay
/// comes from the address the node sends to, whichever thread forwarded it.
#[tokio::test]
async fn udp_nodes_on_every_thread_reach_each_other_from_the_one_address() {
    let tls = tls();
    let relay = relay(Limits::default(), &tls).await;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(plexsphere_relay::limits::MAX_UDP_THREADS);
    assert_eq!(relay.udp_threads(), threads);
    ring_of_eight(&relay).await;
}

/// `--udp-threads` (`Limits::udp_threads`) sets how many threads, and sockets, share the
/// address, more than the cores included; nodes still reach each other from the one address.
#[tokio::test]
async fn udp_threads_sets_how_many_threads_share_the_address() {
    let tls = tls();
    let limits = Limits {
        udp_threads: 5,
        ..Limits::default()
    };
    let relay = relay(limits, &tls).await;
    assert_eq!(relay.udp_threads(), 5);
    ring_of_eight(&relay).await;
}

/// Eight UDP nodes each send one frame to the next; each gets it from the relay's address.
async fn ring_of_eight(relay: &plexsphere_relay::RelayHandle) {
    let relay_addr = relay.udp_addr.unwrap();
    let mut nodes = Vec::new();
    for seed in 1..=8 {
        let mut node = Node::new(seed, Link::udp(relay).await);
        node.register().await;
        nodes.push(node);
    }
    for i in 0..nodes.len() {
        let j = (i + 1) % nodes.len();
        let payload = vec![4u8, 0, 0, 0, i as u8];
        let dst = nodes[j].pk;
        nodes[i].send_to(&dst, &payload).await;
        let Link::Udp(socket, _) = &nodes[j].link else {
            unreachable!("UDP nodes")
        };
        let mut buf = vec![0u8; 2048];
        let (n, from) = tokio::time::timeout(Duration::from_secs(5), socket.recv_from(&mut buf))
            .await
            .expect("no frame from the relay in time")
            .unwrap();
        assert_eq!(from, relay_addr);
        assert_eq!(
            Frame::from_datagram(&buf[..n]).unwrap(),
            Frame::Recv {
                src: prefix(&nodes[i].pk),
                payload
            }
        );
    }
    until(relay, "eight frames counted", |s| s.forwarded_frames == 8).await;
}

/// A UDP port that anything holds is a `Bind` error, another relay (whose sockets share their
/// port with `SO_REUSEPORT`) included: two relays never split one port's nodes between them.
#[tokio::test]
async fn a_udp_port_in_use_is_a_bind_error_even_by_another_relay() {
    let tls = tls();
    let first = relay(Limits::default(), &tls).await;
    let plain = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for taken in [first.udp_addr.unwrap(), plain.local_addr().unwrap()] {
        let second = plexsphere_relay::start(plexsphere_relay::RelayConfig {
            name: "second".into(),
            secret_key: [9; 32],
            udp: Some(taken),
            tls: None,
            domain_keys: vec![domain().public_key_b64()],
            limits: Limits::default(),
        })
        .await;
        match second {
            Err(plexsphere_relay::StartError::Bind { what, addr, source }) => {
                assert_eq!((what, addr), ("UDP", taken));
                assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
            }
            Err(e) => panic!("want a UDP bind error, got {e}"),
            Ok(_) => panic!("a second relay started on {taken}, which is in use"),
        }
    }
}
