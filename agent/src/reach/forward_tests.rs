//! The loopback forwarders against real sockets on loopback, in a `ForwardLoop`: one, and
//! hundreds on one thread.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use plexsphere_wire::key::PublicKey;
use plexsphere_wire::reach::relay::Frame;

use super::forward::*;

fn recv(s: &UdpSocket) -> (Vec<u8>, SocketAddr) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 2048];
    let (n, from) = s.recv_from(&mut buf).expect("a datagram within 10 s");
    (buf[..n].to_vec(), from)
}

fn wait(ok: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "not within 10 s");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn carries_the_data_plane_s_datagrams_along_the_route_and_delivers_the_peer_s() {
    // The "data plane": a socket on loopback; the underlay: another; the peer and the relay.
    let wg = UdpSocket::bind("127.0.0.1:0").unwrap();
    let underlay = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    let relay = UdpSocket::bind("127.0.0.1:0").unwrap();
    let f = Forwarder::open(wg.local_addr().unwrap().port()).unwrap();
    let forwarders = ForwardLoop::start(underlay.clone()).unwrap();
    forwarders.add(&f).unwrap();

    // Held: dropped and counted.
    wg.send_to(&[4, 0, 0, 0, 1], f.addr()).unwrap();
    wait(|| f.counters.dropped.load(Ordering::Relaxed) == 1);

    // Relay: wrapped in `send` to the peer's key, to the relay.
    f.set_route(Route::Relay {
        relay: relay.local_addr().unwrap(),
        dst: PublicKey([7; 32]),
    });
    wg.send_to(&[4, 0, 0, 0, 3], f.addr()).unwrap();
    let (d, from) = recv(&relay);
    assert_eq!(from, underlay.local_addr().unwrap());
    assert_eq!(
        Frame::from_datagram(&d).unwrap(),
        Frame::Send {
            dst: [7; 8],
            payload: vec![4, 0, 0, 0, 3]
        }
    );

    // Anyone but the data plane is ignored.
    peer.send_to(&[4, 0, 0, 0, 9], f.addr()).unwrap();
    wait(|| f.counters.foreign.load(Ordering::Relaxed) == 1);

    // From the peer to the data plane, from the forwarder's address.
    f.deliver(&[4, 0, 0, 0, 4]).unwrap();
    assert_eq!(recv(&wg), (vec![4, 0, 0, 0, 4], f.addr()));
    assert_eq!(f.counters.out.load(Ordering::Relaxed), 1);
    forwarders.stop();
}

/// The relay `send` frame a forwarder made, and where it came from.
fn recv_send(relay: &UdpSocket) -> (Frame, SocketAddr) {
    let (d, from) = recv(relay);
    (Frame::from_datagram(&d).expect("a relay frame"), from)
}

fn send_frame(payload: &[u8]) -> Frame {
    Frame::Send {
        dst: [7; 8],
        payload: payload.to_vec(),
    }
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn one_loop_carries_hundreds_of_forwarders_on_one_thread_and_a_removed_one_stops() {
    const N: usize = 300;
    let wg = UdpSocket::bind("127.0.0.1:0").unwrap();
    let underlay = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
    let relay = UdpSocket::bind("127.0.0.1:0").unwrap();
    let before = threads();
    let forwarders = ForwardLoop::start(underlay.clone()).unwrap();
    let mut all = Vec::new();
    for _ in 0..N {
        let f = Forwarder::open(wg.local_addr().unwrap().port()).unwrap();
        f.set_route(Route::Relay {
            relay: relay.local_addr().unwrap(),
            dst: PublicKey([7; 32]),
        });
        let token = forwarders.add(&f).unwrap();
        all.push((f, token));
    }
    assert_eq!(forwarders.len(), N);
    // A thread per forwarder would be 300; the loop is one (other tests may add a few).
    assert!(
        threads() - before < 10,
        "{} threads for {N} forwarders",
        threads() - before
    );

    // In rounds of 50, so the relay's receive buffer (about 200 kB on loopback, some 300
    // small datagrams) never overflows while the test is still sending.
    for round in all.chunks(50) {
        for (f, _) in round {
            wg.send_to(&[4, 0, 0, 0, 1], f.addr()).unwrap();
        }
        for _ in round {
            assert_eq!(
                recv_send(&relay),
                (send_frame(&[4, 0, 0, 0, 1]), underlay.local_addr().unwrap())
            );
        }
    }
    // The loop counts a datagram after its send returns, so the last count may trail the
    // relay's receipt by a moment.
    wait(|| {
        all.iter()
            .all(|(f, _)| f.counters.out.load(Ordering::Relaxed) == 1)
    });

    // Removed: its datagrams are no longer carried; the others still are.
    let (gone, token) = all.remove(0);
    forwarders.remove(token);
    assert_eq!(forwarders.len(), N - 1);
    wg.send_to(&[4, 0, 0, 0, 1], gone.addr()).unwrap();
    wg.send_to(&[4, 0, 0, 0, 2], all[0].0.addr()).unwrap();
    assert_eq!(recv_send(&relay).0, send_frame(&[4, 0, 0, 0, 2]));
    thread::sleep(POLL);
    assert_eq!(gone.counters.out.load(Ordering::Relaxed), 1);

    // Foreign sources are counted, not carried.
    relay.send_to(&[4, 0, 0, 0, 9], all[1].0.addr()).unwrap();
    wait(|| all[1].0.counters.foreign.load(Ordering::Relaxed) == 1);
    forwarders.stop();
}
