//! The runtime in kernel mode over loopback sockets: a socket stands in for the kernel
//! interface, another for a remote peer. Every peer gets a forwarder as its endpoint, and
//! WireGuard crosses forwarder and underlay both ways.

use std::net::UdpSocket;

use super::*;
use crate::reach::io::Path;

/// Records the endpoints the runtime sets.
struct Recorder(Arc<Mutex<Vec<(PeerKey, SocketAddr)>>>);

impl PathControl for Recorder {
    fn set_endpoint(&self, peer: PeerKey, endpoint: SocketAddr) -> io::Result<()> {
        lock(&self.0).push((peer, endpoint));
        Ok(())
    }

    fn handshakes(&self) -> io::Result<Vec<(PeerKey, Option<SystemTime>)>> {
        Ok(vec![])
    }
}

fn recv(s: &UdpSocket) -> (Vec<u8>, SocketAddr) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 2048];
    let (n, from) = s.recv_from(&mut buf).expect("a datagram within 10 s");
    (buf[..n].to_vec(), from)
}

fn wait<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "not within 10 s");
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn kernel_mode_carries_every_peer_through_a_forwarder_over_the_underlay() {
    let kernel = UdpSocket::bind("127.0.0.1:0").unwrap();
    let kernel_port = kernel.local_addr().unwrap().port();
    let underlay = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
    let underlay_addr = underlay.local_addr().unwrap();
    let remote = UdpSocket::bind("127.0.0.1:0").unwrap();
    let remote_addr = remote.local_addr().unwrap();
    let set = Arc::new(Mutex::new(Vec::new()));
    let rt = Runtime::start(RuntimeSetup {
        secret: [0x11; 32],
        mode: Mode::Kernel,
        underlay: underlay.clone(),
        listen_port: Box::new(move || underlay_addr.port()),
        wg_port: Box::new(move || kernel_port),
        control: Box::new(Recorder(set.clone())),
        local_addrs: Box::new(Vec::new),
    })
    .unwrap();
    rt.serve_underlay(underlay).unwrap();
    let peer = PeerKey([0x22; 32]);
    rt.set_peers(vec![PeerReach {
        key: peer,
        node_id: uuid::Uuid::from_u128(2),
        hostname: "peer".into(),
        endpoints: vec![remote_addr],
        home_relay: None,
    }]);
    // The kernel's endpoint for the peer is its forwarder on loopback, and the diff is told so.
    let fwd = wait(|| lock(&set).first().map(|(k, a)| (*k, *a)));
    assert_eq!(fwd.0, peer);
    assert!(fwd.1.ip().is_loopback() && fwd.1 != remote_addr);
    assert_eq!(
        rt.owner(&peer),
        Owner::Reach {
            endpoint: Some(fwd.1)
        }
    );
    assert_eq!(rt.owner(&PeerKey([9; 32])), Owner::Rotation);

    // Kernel -> forwarder -> the peer's direct address, from the underlay socket.
    kernel.send_to(&[1, 0, 0, 0, 0xAA], fwd.1).unwrap();
    assert_eq!(recv(&remote), (vec![1, 0, 0, 0, 0xAA], underlay_addr));
    // The peer -> underlay -> its forwarder -> the kernel, from the forwarder's address.
    remote.send_to(&[2, 0, 0, 0, 0xBB], underlay_addr).unwrap();
    assert_eq!(recv(&kernel), (vec![2, 0, 0, 0, 0xBB], fwd.1));

    // A new direct path moves the route; the old address is no longer the peer's.
    let moved = UdpSocket::bind("127.0.0.1:0").unwrap();
    rt.perform(Effect::SetPath {
        peer,
        path: Path::Direct {
            endpoint: moved.local_addr().unwrap(),
        },
    });
    wait(|| {
        kernel.send_to(&[4, 0, 0, 0, 0xCC], fwd.1).unwrap();
        moved
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut buf = [0u8; 64];
        moved.recv_from(&mut buf).ok().map(|_| ())
    });
    let before = rt.shared.unknown_src.load(Ordering::Relaxed);
    remote.send_to(&[4, 0, 0, 0, 0xDD], underlay_addr).unwrap();
    wait(|| (rt.shared.unknown_src.load(Ordering::Relaxed) > before).then_some(()));
    // The peer leaves: its forwarder goes with it.
    rt.set_peers(vec![]);
    wait(|| (rt.owner(&peer) == Owner::Rotation).then_some(()));
    rt.stop();
}
