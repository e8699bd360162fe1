//! What a stranger gets from a relay: TCP connections bounded per source and closed unless
//! they register in time, nothing answered before the registration but its exchange, and
//! STUN and relay answers to an unregistered source bounded per /24. Sources are loopback
//! addresses of their own (127.0.0.2 is not 127.0.0.3; 127.0.2.1 is another /24).

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use plexsphere_relay::prefix::PrefixLimits;
use plexsphere_relay::{Limits, RelayHandle, Stats};
use plexsphere_wire::reach::relay::Frame;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UdpSocket};

/// Raises this process's RLIMIT_NOFILE to at least `want` (the test is root here; without
/// the right to raise the hard limit, up to it).
fn raise_nofile(want: u64) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft >= want {
        return;
    }
    if setrlimit(Resource::RLIMIT_NOFILE, want, hard.max(want)).is_err() {
        setrlimit(Resource::RLIMIT_NOFILE, hard.min(want), hard).unwrap();
    }
}

/// `n` plain TCP connections from `ip`, opened 200 at a time, held open; each batch is taken
/// in by the relay (held or closed at accept) before the next is opened, so the listen
/// backlog never overflows (an overflow drops a handshake's last ACK: the client holds a
/// connection the relay never accepts, and a loaded CI machine saw 11 of 10,000 so).
async fn hold(relay: &RelayHandle, ip: [u8; 4], n: usize, cap: usize) -> Vec<TcpStream> {
    let before = relay.stats().tcp_accepted;
    let addr = relay.tls_addr.unwrap();
    let mut held = Vec::with_capacity(n);
    for chunk in 0..n.div_ceil(200) {
        let size = 200.min(n - chunk * 200);
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..size {
            tasks.spawn(tcp_from_addr(addr, ip));
        }
        while let Some(c) = tasks.join_next().await {
            held.push(c.unwrap());
        }
        let opened = held.len() as u64;
        // The bound is generous for a loaded machine; the condition is exact.
        until_within(
            relay,
            "every connection accepted",
            Duration::from_secs(60),
            |s| s.tcp_accepted - before >= opened,
        )
        .await;
    }
    // Past the cap each was closed at accept; a slot comes free only when a held one closes
    // (its TLS handshake time is up, should the flood last that long).
    let s = relay.stats();
    let freed = s.tcp_closed_error + s.tcp_closed_unregistered;
    assert!(
        s.tcp_refused_per_source + freed >= (n - cap) as u64,
        "{s:?}"
    );
    held
}

async fn tcp_from_addr(relay: SocketAddr, ip: [u8; 4]) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::from((ip, 0))).unwrap();
    sock.connect(relay).await.unwrap()
}

/// A relay whose global TCP cap (`global`) a source over its own cap (`per_source`) cannot
/// take; `sockets` idle connections from 127.0.0.2, then a node from 127.0.0.3 registers.
async fn one_source_cannot_shut_out_the_others(sockets: usize, per_source: usize, global: usize) {
    raise_nofile(2 * sockets as u64 + 1024);
    let tls = tls();
    let limits = Limits {
        max_tcp_connections: global,
        max_tcp_per_source: per_source,
        // Nothing here waits for the registration deadline.
        tcp_register_within: Duration::from_secs(300),
        ..Limits::default()
    };
    let relay = relay(limits, &tls).await;
    let started = Instant::now();
    let _held = hold(&relay, [127, 0, 0, 2], sockets, per_source).await;
    eprintln!(
        "{sockets} sockets from one source in {:?}",
        started.elapsed()
    );
    // A real node from another source: TLS, hello, register, and traffic.
    let mut node = Node::new(1, Link::tcp_from(&relay, &tls, [127, 0, 0, 3]).await);
    node.register().await;
    node.link.send(&Frame::Ping { nonce: [1; 8] }).await;
    assert_eq!(node.link.recv().await, Frame::Pong { nonce: [1; 8] });
    let mut other = Node::new(2, Link::tcp_from(&relay, &tls, [127, 0, 0, 4]).await);
    other.register().await;
    node.send_to(&other.pk, b"through").await;
    assert!(matches!(other.link.recv().await, Frame::Recv { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_over_its_cap_does_not_shut_out_a_node() {
    // 600 idle sockets against a cap of 64 per source and 128 in all: without the per-source
    // cap the first 128 would hold every slot and the node would be closed.
    one_source_cannot_shut_out_the_others(600, 64, 128).await;
}

/// The figure: 10,000 idle sockets from one source, against the default global cap
/// and a per-source cap of 256 (20,000 descriptors in this process; about 30 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_sockets_from_one_source() {
    one_source_cannot_shut_out_the_others(10_000, 256, 10_000).await;
}

/// Reads frames from a TLS link until the relay closes it; every frame must pass `ok`.
async fn frames_until_closed(link: &mut Link, what: &str, ok: impl Fn(&Frame) -> bool) {
    let Link::Tcp(s) = link else {
        panic!("a TCP link")
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout_at(deadline, s.read_exact(&mut len)).await {
            Err(_) => panic!("{what}: still open after {WAIT:?}"),
            Ok(Err(_)) => return,
            Ok(Ok(_)) => {}
        }
        let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
        match tokio::time::timeout_at(deadline, s.read_exact(&mut buf)).await {
            Err(_) => panic!("{what}: still open after {WAIT:?}"),
            Ok(Err(_)) => return,
            Ok(Ok(_)) => {}
        }
        let frame = Frame::decode(&buf).unwrap();
        assert!(ok(&frame), "{what}: the relay sent {frame:?}");
    }
}

/// Sends `frame` every `period` (back to back when `None`) on the write half of a TLS link
/// until it fails.
async fn keep_sending(
    mut wr: impl tokio::io::AsyncWrite + Unpin,
    frame: Frame,
    period: Option<Duration>,
) {
    let mut every = period.map(tokio::time::interval);
    loop {
        if let Some(every) = &mut every {
            every.tick().await;
        }
        if wr.write_all(&frame.to_stream()).await.is_err() || wr.flush().await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_connection_that_does_not_register_in_time_is_closed() {
    let tls = tls();
    let limits = Limits {
        tcp_register_within: Duration::from_millis(400),
        ..Limits::default()
    };
    let relay = relay(limits, &tls).await;
    // A node that registers in time stays, past the deadline; one with sealed answers too.
    let mut node = Node::new(1, Link::tcp(&relay, &tls).await);
    node.register().await;
    let mut sealed = Node::new(6, Link::tcp_from(&relay, &tls, [127, 0, 0, 6]).await);
    let key = sealed.register_sealed().await;

    // A plain TCP socket that never starts TLS.
    let mut idle = tcp_from(&relay, [127, 0, 0, 2]).await.unwrap();
    closed_by_relay(&mut idle, "an idle socket").await;

    // TLS done, then pings, every 50 ms or back to back: unanswered, and they do not extend
    // the deadline (a reader that always finds a frame waiting must still see it).
    for (ip, period) in [(3, Some(Duration::from_millis(50))), (5, None)] {
        let Link::Tcp(pinger) = Link::tcp_from(&relay, &tls, [127, 0, 0, ip]).await else {
            unreachable!()
        };
        let (mut rd, wr) = tokio::io::split(*pinger);
        let sender = tokio::spawn(keep_sending(wr, Frame::Ping { nonce: [2; 8] }, period));
        closed_by_relay(&mut rd, "a connection that only pings").await;
        sender.abort();
    }

    // Hellos get challenges, but a challenge is not a registration.
    let mut hello = Link::tcp_from(&relay, &tls, [127, 0, 0, 4]).await;
    let pk = plexsphere_wire::reach::public_key(&[9; 32]);
    for _ in 0..3 {
        hello.send(&Frame::Hello { node: pk }).await;
        assert!(matches!(hello.recv().await, Frame::Challenge { .. }));
    }
    frames_until_closed(&mut hello, "a connection that only says hello", |f| {
        matches!(f, Frame::Challenge { .. })
    })
    .await;

    until(&relay, "four closed unregistered", |s| {
        s.tcp_closed_unregistered >= 4
    })
    .await;
    // Every deadline above has passed for the node's connection too (it was accepted first).
    node.link.send(&Frame::Ping { nonce: [3; 8] }).await;
    assert_eq!(node.link.recv().await, Frame::Pong { nonce: [3; 8] });
    sealed.link.send(&Frame::Ping { nonce: [4; 8] }).await;
    match sealed.link.recv().await {
        Frame::Sealed { counter, body, tag } => {
            assert_eq!(
                key.open(counter, &body, &tag).unwrap(),
                Frame::Pong { nonce: [4; 8] }
            );
        }
        f => panic!("want a sealed pong, got {f:?}"),
    }
    assert_eq!(relay.registered(), 2);
}

#[tokio::test]
async fn a_ping_before_registration_is_not_answered() {
    let tls = tls();
    let relay = relay(Limits::default(), &tls).await;
    for (seed, link) in [
        (1, Link::udp(&relay).await),
        (2, Link::tcp(&relay, &tls).await),
    ] {
        let mut n = Node::new(seed, link);
        n.link.send(&Frame::Ping { nonce: [7; 8] }).await;
        // The relay answers in order: were the ping answered, the pong would come first.
        n.challenge().await;
        n.register().await;
        n.link.send(&Frame::Ping { nonce: [8; 8] }).await;
        assert_eq!(n.link.recv().await, Frame::Pong { nonce: [8; 8] });
    }
    until(&relay, "two pings dropped", |s| s.dropped_unregistered == 2).await;
}

/// Sends `n` copies of `request` from `sock` in batches the relay's socket buffer holds,
/// reading the answers meanwhile; each batch is done when every datagram is either answered
/// (received here) or counted as dropped by `dropped`. The answers received, and their sizes.
async fn flood(
    relay: &RelayHandle,
    sock: &UdpSocket,
    to: SocketAddr,
    request: &[u8],
    n: u64,
    dropped: impl Fn(&Stats) -> u64,
) -> Vec<usize> {
    let base = dropped(&relay.stats());
    let mut answers = Vec::new();
    let mut buf = [0u8; 2048];
    let mut sent = 0;
    while sent < n {
        for _ in 0..50.min(n - sent) {
            sock.send_to(request, to).await.unwrap();
            sent += 1;
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        while answers.len() as u64 + dropped(&relay.stats()) - base < sent {
            match tokio::time::timeout(Duration::from_millis(10), sock.recv_from(&mut buf)).await {
                Ok(Ok((len, _))) => answers.push(len),
                Ok(Err(e)) => panic!("{e}"),
                Err(_) => assert!(
                    tokio::time::Instant::now() < deadline,
                    "{} of {sent} answered or dropped: {:?}",
                    answers.len(),
                    relay.stats()
                ),
            }
        }
    }
    answers
}

#[tokio::test]
async fn answers_to_a_flood_from_one_prefix_stay_under_its_bucket() {
    let tls = tls();
    let (per_sec, burst) = (1, 16);
    let limits = Limits {
        prefix_answers: PrefixLimits {
            per_sec,
            burst,
            max_prefixes: 1024,
        },
        ..Limits::default()
    };
    let relay = relay(limits, &tls).await;
    let to = relay.udp_addr.unwrap();
    let started = Instant::now();

    // STUN Binding requests from 127.0.2.1.
    let stun = UdpSocket::bind("127.0.2.1:0").await.unwrap();
    let request = plexsphere_relay::stun::binding_request([1; 12]);
    let answers = flood(&relay, &stun, to, &request, 400, |s| s.dropped_prefix_rate).await;
    // The bucket's burst, plus what refilled while the flood lasted.
    let allowed = burst + (started.elapsed().as_secs_f64() * per_sec as f64).ceil() as u64;
    assert!(answers.len() as u64 >= burst, "{answers:?}");
    assert!(
        answers.len() as u64 <= allowed,
        "{} > {allowed}",
        answers.len()
    );
    assert_eq!(relay.stats().stun_answered, answers.len() as u64);
    // Each answer the 32 bytes of a header and an IPv4 XOR-MAPPED-ADDRESS: no SOFTWARE.
    assert!(answers.iter().all(|&len| len == 32), "{answers:?}");

    // Hellos from 127.0.3.1: challenges at the same bounded rate.
    let hellos = UdpSocket::bind("127.0.3.1:0").await.unwrap();
    let hello = Frame::Hello {
        node: plexsphere_wire::reach::public_key(&[5; 32]),
    }
    .to_datagram();
    let dropped_before = relay.stats().dropped_prefix_rate;
    let started = Instant::now();
    let challenges = flood(&relay, &hellos, to, &hello, 400, |s| s.dropped_prefix_rate).await;
    let allowed = burst + (started.elapsed().as_secs_f64() * per_sec as f64).ceil() as u64;
    assert!(challenges.len() as u64 >= burst);
    assert!(
        challenges.len() as u64 <= allowed,
        "{} > {allowed}",
        challenges.len()
    );
    assert_eq!(
        relay.stats().dropped_prefix_rate - dropped_before,
        400 - challenges.len() as u64
    );

    // Another /24 has its own bucket: a node there registers and gets STUN answers.
    let mut node = Node::new(3, Link::udp_from(&relay, [127, 0, 4, 1]).await);
    node.register().await;
    let Link::Udp(sock, _) = &node.link else {
        unreachable!()
    };
    let answered = flood(&relay, sock, to, &request, 100, |s| s.dropped_prefix_rate).await;
    // A registered node's own address is not charged at all.
    assert_eq!(answered.len(), 100);
}

#[tokio::test]
async fn the_control_planes_responder_answers_a_flood_within_the_bucket() {
    let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let to = server.local_addr().unwrap();
    let limits = PrefixLimits {
        per_sec: 1,
        burst: 8,
        max_prefixes: 16,
    };
    let task = tokio::spawn(plexsphere_relay::stun::serve(server, limits));
    let client = UdpSocket::bind("127.0.5.1:0").await.unwrap();
    let marker = UdpSocket::bind("127.0.6.1:0").await.unwrap();
    let request = plexsphere_relay::stun::binding_request([2; 12]);
    let started = Instant::now();
    for _ in 0..40 {
        client.send_to(&request, to).await.unwrap();
    }
    // The responder reads in order: once another /24's request is answered, every answer to
    // the flood has been sent, and on loopback it is in the client's buffer already.
    marker.send_to(&request, to).await.unwrap();
    let mut buf = [0u8; 256];
    tokio::time::timeout(WAIT, marker.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let mut answered = 0u64;
    while let Ok((len, _)) = client.try_recv_from(&mut buf) {
        assert_eq!(len, 32);
        answered += 1;
    }
    let allowed = 8 + started.elapsed().as_secs_f64().ceil() as u64;
    assert!(
        (8..=allowed).contains(&answered),
        "{answered} answers, allowed {allowed}"
    );
    task.abort();
}
