//! The runtime over loopback sockets: sockets stand in for the data plane or the kernel
//! interface, the underlay, remote peers and relays (over UDP, and over TCP with TLS).
//!
//! Every decision lives in the node (`crate::reach::node`), tested there and in the simulator
//! (`node/sim/`); a test stays here for the sockets, threads and shared state it drives (issue
//! 26, "the socket tests that stay are the ones that test sockets"). Each one, and where its
//! decision is tested:
//!
//! | test | what of the shell it drives | its decision, tested in |
//! |---|---|---|
//! | `kernel_mode_makes_a_direct_path_the_kernel_peer_s_endpoint_and_relays_through_a_forwarder` | the kernel peer's endpoint through `PathControl`, a loopback forwarder's bytes framed to the relay from the underlay socket, its removal, the endpoint's owner | direct as the endpoint, relayed through a forwarder: `node/tests/carry.rs` |
//! | `a_relay_with_only_a_tls_address_registers_and_carries_a_relayed_peer_over_tcp` | the TLS link (handshake, the proof it carries), frames both ways between forwarder and link | no UDP address starts over TCP: `node/tests/relays.rs` `udp_blocked_or_no_udp_address_starts_over_tcp`; a UDP-dropping node relayed over TCP: `node/sim/tests/pairs.rs` |
//! | `a_relay_silent_over_udp_is_reached_over_tcp` | as the one above, after a silent UDP socket; a UDP frame for the TLS connection counted in the runtime's `unknown_src` (the node's `Dropped` mirrored) | the move to TCP: `node/tests/relays.rs` `a_relay_unanswered_over_udp_for_give_up_moves_to_tcp_before_any_relay_down`; the drop: `a_udp_frame_for_a_connection_over_tcp_is_dropped_and_counted` |
//! | `userspace_relays_over_udp_inside_the_data_plane_without_a_forwarder` | the data plane's `relay_endpoint` and `set_relays` called, no forwarder opened | `node/tests/carry.rs` (the plane's endpoint, `PlaneRelays`) |
//! | `userspace_relays_over_tcp_on_the_link_inside_the_data_plane_without_a_forwarder` | the data plane's `link_endpoint` called with the TLS link's queue, no forwarder opened, the queue closed with the link | `node/tests/carry.rs` (`PlaneLink`) |
//! | `a_full_queue_drops_a_relay_s_frames_but_never_the_end_of_its_connection` | the loop's bounded queue and the kept end of a TCP link | none (no decision) |
//!
//! None tests a decision only, so none was retired when the simulator came.

use std::net::UdpSocket;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, SystemTime};

use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::signed::SignedEnvelope;

use super::shared::lock;
use super::*;
use crate::reach::io::{Path, Transport};

/// Records the endpoints the runtime sets.
struct Recorder(Arc<Mutex<Vec<(PublicKey, SocketAddr)>>>);

impl PathControl for Recorder {
    fn set_endpoint(&self, peer: PublicKey, endpoint: SocketAddr) -> io::Result<()> {
        lock(&self.0).push((peer, endpoint));
        Ok(())
    }

    fn handshakes(&self) -> io::Result<Vec<(PublicKey, Option<SystemTime>)>> {
        Ok(vec![])
    }
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
fn kernel_mode_makes_a_direct_path_the_kernel_peer_s_endpoint_and_relays_through_a_forwarder() {
    let kernel = UdpSocket::bind("127.0.0.1:0").unwrap();
    let kernel_port = kernel.local_addr().unwrap().port();
    let underlay = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
    let underlay_addr = underlay.local_addr().unwrap();
    let remote = UdpSocket::bind("127.0.0.1:0").unwrap();
    let remote_addr = remote.local_addr().unwrap();
    // Bound and never answering: frames to it are read here, registration never completes.
    let relay = UdpSocket::bind("127.0.0.1:0").unwrap();
    let relay_addr = relay.local_addr().unwrap();
    let set = Arc::new(Mutex::new(Vec::new()));
    let rt = Runtime::start(RuntimeSetup {
        secret: [0x11; 32],
        mesh: "10.64.0.0/16".parse().unwrap(),
        underlay: underlay.clone(),
        listen_port: Box::new(move || kernel_port),
        wg_port: Box::new(move || kernel_port),
        control: Box::new(Recorder(set.clone())),
        local_addrs: Box::new(Vec::new),
        tls: None,
    })
    .unwrap();
    rt.set_relays(vec![relay_r1([0x66; 32], Some(relay_addr), None)], vec![]);
    let peer = PublicKey([0x22; 32]);
    rt.set_peers(vec![PeerReach {
        key: peer,
        node_id: uuid::Uuid::from_u128(2),
        hostname: "peer".into(),
        endpoints: vec![],
        home_relay: None,
        routes: Vec::new(),
    }]);
    let last = || lock(&set).last().copied();

    // Direct: the kernel peer's endpoint is the peer's address itself, no forwarder between.
    let direct = Effect::SetPath {
        peer,
        path: Path::Direct {
            endpoint: remote_addr,
        },
    };
    rt.perform(direct.clone());
    wait(|| (last() == Some((peer, remote_addr))).then_some(()));
    assert_eq!(
        rt.owner(&peer),
        Owner::Reach {
            endpoint: Some(remote_addr)
        }
    );
    assert_eq!(rt.owner(&PublicKey([9; 32])), Owner::Rotation);

    // Relayed: the kernel cannot frame for a relay, so the endpoint is a loopback forwarder
    // whose datagrams reach the relay as a `send` to the peer, from the underlay socket.
    rt.perform(Effect::SetPath {
        peer,
        path: Path::Relay {
            relay: "r1".into(),
            transport: Transport::Udp,
        },
    });
    let fwd = wait(|| last().map(|(_, a)| a).filter(|a| *a != remote_addr));
    assert!(fwd.ip().is_loopback(), "{fwd}");
    kernel.send_to(&[1, 0, 0, 0, 0xAA], fwd).unwrap();
    relay
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 2048];
    let (dst, payload, from) = loop {
        let (n, from) = relay.recv_from(&mut buf).expect("a frame within 10 s");
        if let Ok(plexsphere_wire::reach::relay::Frame::Send { dst, payload }) =
            plexsphere_wire::reach::relay::Frame::from_datagram(&buf[..n])
        {
            break (dst, payload, from);
        }
    };
    assert_eq!(dst, plexsphere_wire::reach::relay::prefix(&peer));
    assert_eq!(payload, vec![1, 0, 0, 0, 0xAA]);
    assert_eq!(from, underlay_addr);

    // Direct again: the endpoint is the address again, and the forwarder is gone.
    rt.perform(direct);
    wait(|| (last() == Some((peer, remote_addr))).then_some(()));
    rt.set_peers(vec![]);
    wait(|| (rt.owner(&peer) == Owner::Rotation).then_some(()));
    rt.stop();
}

/// A relay stand-in over TCP with TLS (a self-signed certificate for `relay.test`): answers
/// the registration and echoes every `send` back as a `recv` from its destination. Reports
/// whether a register with a good proof came; with the client config that trusts it.
fn tls_relay(relay_secret: [u8; 32]) -> (SocketAddr, rustls::ClientConfig, mpsc::Receiver<bool>) {
    use plexsphere_wire::reach::relay::{self, Frame};
    use std::io::{Read as _, Write as _};
    let (config, client) = crate::reach::relay_client::tcp::relay_test_tls();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (registered_tx, registered) = mpsc::channel();
    thread::spawn(move || {
        let (tcp, _) = listener.accept().unwrap();
        let conn = rustls::ServerConnection::new(Arc::new(config)).unwrap();
        let mut s = rustls::StreamOwned::new(conn, tcp);
        let mut pending = Vec::new();
        let mut buf = [0u8; 4096];
        let (mut seal, mut counter) = (None, 0u64);
        loop {
            let n = match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buf[..n]);
            while pending.len() >= 2 {
                let len = usize::from(u16::from_be_bytes([pending[0], pending[1]]));
                if pending.len() < 2 + len {
                    break;
                }
                let frame = Frame::decode(&pending[2..2 + len]).unwrap();
                pending.drain(..2 + len);
                let answer = match frame {
                    Frame::Hello { .. } => Frame::Challenge { cookie: [3; 32] },
                    Frame::Register {
                        node,
                        cookie,
                        proof,
                        ..
                    } => {
                        let shared = plexsphere_wire::reach::shared_secret(&relay_secret, &node);
                        let _ = registered_tx
                            .send(relay::sealed_proof_matches(&shared, &cookie, &node, &proof));
                        seal = Some(relay::FrameKey::new(&shared));
                        counter += 1;
                        Frame::Registered { lease_secs: 60 }
                    }
                    Frame::Send { dst, payload } => Frame::Recv { src: dst, payload },
                    Frame::Ping { nonce } => Frame::Pong { nonce },
                    _ => continue,
                };
                // What a relay seals for a sealed registration, sealed.
                let answer = match (&seal, &answer) {
                    (Some(k), Frame::Registered { .. } | Frame::Pong { .. }) => {
                        counter += 1;
                        k.seal(counter, &answer)
                    }
                    _ => answer,
                };
                if s.write_all(&answer.to_stream())
                    .and_then(|()| s.flush())
                    .is_err()
                {
                    return;
                }
            }
        }
    });
    (addr, client, registered)
}

/// A userspace runtime on its own loopback underlay socket whose data plane listens on
/// `wg_port`, telling `control` what it sets.
fn userspace_runtime(
    wg_port: u16,
    control: Box<dyn PathControl>,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Arc<Runtime> {
    let underlay = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
    Runtime::start(RuntimeSetup {
        secret: [0x11; 32],
        mesh: "10.64.0.0/16".parse().unwrap(),
        underlay,
        listen_port: Box::new(move || wg_port),
        wg_port: Box::new(move || wg_port),
        control,
        local_addrs: Box::new(Vec::new),
        tls,
    })
    .unwrap()
}

/// The relay "r1" with the public key of `relay_secret`, at `udp` and/or over TLS at `tls`
/// (certificate for `relay.test`).
fn relay_r1(relay_secret: [u8; 32], udp: Option<SocketAddr>, tls: Option<SocketAddr>) -> RelaySpec {
    RelaySpec {
        name: "r1".into(),
        public_key: plexsphere_wire::reach::public_key(&relay_secret).to_base64(),
        udp,
        tls,
        tls_server_name: tls.map(|_| "relay.test".into()),
    }
}

/// Wants the peer `[0x22; 32]` homed on "r1" and sets its path through "r1" over `transport`.
/// A wanted peer, because relays name a datagram's sender by key prefix, which maps to wanted
/// peers.
fn relayed_peer(rt: &Runtime, transport: Transport) -> PublicKey {
    let peer = PublicKey([0x22; 32]);
    rt.set_peers(vec![PeerReach {
        key: peer,
        node_id: uuid::Uuid::nil(),
        hostname: "peer".into(),
        endpoints: vec![],
        home_relay: Some("r1".into()),
        routes: Vec::new(),
    }]);
    rt.perform(Effect::SetPath {
        peer,
        path: Path::Relay {
            relay: "r1".into(),
            transport,
        },
    });
    peer
}

#[test]
fn a_relay_with_only_a_tls_address_registers_and_carries_a_relayed_peer_over_tcp() {
    relayed_over_tls(None);
}

#[test]
fn a_relay_silent_over_udp_is_reached_over_tcp() {
    // Bound and never read: every hello over UDP goes unanswered until the client gives up.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    relayed_over_tls(Some(silent.local_addr().unwrap()));
}

fn relayed_over_tls(udp: Option<SocketAddr>) {
    let relay_secret = [0x66; 32];
    let (relay_addr, tls, registered) = tls_relay(relay_secret);
    // The "data plane": a loopback socket the forwarder delivers to.
    let wg = UdpSocket::bind("127.0.0.1:0").unwrap();
    let wg_port = wg.local_addr().unwrap().port();
    let set = Arc::new(Mutex::new(Vec::new()));
    let rt = userspace_runtime(
        wg_port,
        Box::new(Recorder(set.clone())),
        Some(Arc::new(tls)),
    );
    rt.set_relays(vec![relay_r1(relay_secret, udp, Some(relay_addr))], vec![]);
    rt.set_relay_token(SignedEnvelope {
        payload: "e30".into(),
        signature: "sig".into(),
    });
    assert!(
        registered.recv_timeout(Duration::from_secs(10)).unwrap(),
        "the register over TLS carried a good proof"
    );
    if let Some(udp) = udp {
        // The connection runs over TLS: a UDP frame from the relay's address is none of its
        // business, even one that is sealed right and newer (a relay confused about transports,
        // or one captured and held back); over TCP it would have ended the registration.
        use plexsphere_wire::reach::relay::{self, Frame};
        let key = relay::FrameKey::new(&plexsphere_wire::reach::shared_secret(
            &relay_secret,
            &plexsphere_wire::reach::public_key(&[0x11; 32]),
        ));
        let expired = Frame::Refused {
            code: relay::RefuseCode::Expired,
            reason: "over UDP".into(),
        };
        let before = rt.shared.unknown_src.load(Ordering::Relaxed);
        rt.offer(&key.seal(u64::MAX - 1, &expired).to_datagram(), udp);
        // Dropped and counted, not handed to the connection.
        wait(|| (rt.shared.unknown_src.load(Ordering::Relaxed) > before).then_some(()));
    }
    relayed_peer(&rt, Transport::Tcp);
    let fwd = wait(|| lock(&set).first().map(|(_, a)| *a));
    // Data plane -> forwarder -> send over TLS; the stand-in's recv -> forwarder -> data plane.
    wait(|| {
        wg.send_to(&[4, 0, 0, 0, 0x5A], fwd).unwrap();
        wg.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut buf = [0u8; 64];
        match wg.recv_from(&mut buf) {
            Ok((n, from)) => {
                assert_eq!((&buf[..n], from), (&[4u8, 0, 0, 0, 0x5A][..], fwd));
                Some(())
            }
            Err(_) => None,
        }
    });
    rt.stop();
}

/// Records what a data plane that frames for relays itself is told.
#[derive(Default, Clone)]
struct PlaneRecorder {
    endpoints: Arc<Mutex<Vec<(PublicKey, SocketAddr)>>>,
    relays: Arc<Mutex<Vec<Vec<SocketAddr>>>>,
    /// The relay links the data plane was asked for endpoints on.
    links: Arc<Mutex<Vec<Arc<plexd_dataplane::LinkQueue>>>>,
}

/// What the stand-in data plane answers as the relay endpoint of any peer.
const RELAY_ENDPOINT: &str = "[100::2222:2222:2222:2222]:1";

impl PathControl for PlaneRecorder {
    fn set_endpoint(&self, peer: PublicKey, endpoint: SocketAddr) -> io::Result<()> {
        lock(&self.endpoints).push((peer, endpoint));
        Ok(())
    }

    fn handshakes(&self) -> io::Result<Vec<(PublicKey, Option<SystemTime>)>> {
        Ok(vec![])
    }

    fn relay_endpoint(
        &self,
        _relay: SocketAddr,
        _peer: PublicKey,
    ) -> io::Result<Option<SocketAddr>> {
        Ok(Some(RELAY_ENDPOINT.parse().unwrap()))
    }

    fn set_relays(&self, relays: &[SocketAddr]) -> io::Result<()> {
        lock(&self.relays).push(relays.to_vec());
        Ok(())
    }

    fn link_endpoint(
        &self,
        link: &Arc<plexd_dataplane::LinkQueue>,
        _peer: PublicKey,
    ) -> io::Result<Option<SocketAddr>> {
        lock(&self.links).push(link.clone());
        Ok(Some(RELAY_ENDPOINT.parse().unwrap()))
    }
}

/// Userspace, a path through a relay whose connection runs over TCP/TLS: the peer's endpoint
/// is the data plane's endpoint on that link's queue (no loopback forwarder); the link's end
/// closes the queue, so the data plane's endpoints on it are gone.
#[test]
fn userspace_relays_over_tcp_on_the_link_inside_the_data_plane_without_a_forwarder() {
    let relay_secret = [0x66; 32];
    let (relay_addr, tls, registered) = tls_relay(relay_secret);
    let control = PlaneRecorder::default();
    let rt = userspace_runtime(51820, Box::new(control.clone()), Some(Arc::new(tls)));
    rt.set_relays(vec![relay_r1(relay_secret, None, Some(relay_addr))], vec![]);
    rt.set_relay_token(SignedEnvelope {
        payload: "e30".into(),
        signature: "sig".into(),
    });
    assert!(registered.recv_timeout(Duration::from_secs(10)).unwrap());
    let peer = relayed_peer(&rt, Transport::Tcp);
    let set = wait(|| lock(&control.endpoints).first().copied());
    assert_eq!(set, (peer, RELAY_ENDPOINT.parse().unwrap()), "no forwarder");
    let link = lock(&control.links)
        .first()
        .cloned()
        .expect("asked on the link");
    assert!(!link.is_closed());
    rt.stop();
    assert!(link.is_closed(), "the link's end closes its queue");
    let endpoints = lock(&control.endpoints).clone();
    assert!(
        endpoints.iter().all(|(_, e)| *e == set.1),
        "never a loopback forwarder: {endpoints:?}"
    );
}

/// Userspace, a path through a relay over UDP: the peer's endpoint is the data plane's relay
/// endpoint (no loopback forwarder), and the data plane is told to take that relay's frames.
#[test]
fn userspace_relays_over_udp_inside_the_data_plane_without_a_forwarder() {
    let relay = UdpSocket::bind("127.0.0.1:0").unwrap();
    let relay_addr = relay.local_addr().unwrap();
    let (endpoints, relays) = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(Mutex::new(Vec::new())),
    );
    let control = PlaneRecorder {
        endpoints: endpoints.clone(),
        relays: relays.clone(),
        ..PlaneRecorder::default()
    };
    let rt = userspace_runtime(51820, Box::new(control), None);
    rt.set_relays(vec![relay_r1([0x66; 32], Some(relay_addr), None)], vec![]);
    let peer = relayed_peer(&rt, Transport::Udp);
    let set = wait(|| lock(&endpoints).first().copied());
    assert_eq!(set, (peer, RELAY_ENDPOINT.parse().unwrap()), "no forwarder");
    wait(|| {
        lock(&relays)
            .last()
            .is_some_and(|r| r == &[relay_addr])
            .then_some(())
    });
    rt.stop();
    assert_eq!(lock(&endpoints).len(), 1, "never a loopback forwarder");
}

/// A relay connection over TCP reports into the loop's queue. When that queue is full its
/// frames are dropped (and counted) like datagrams, but the end of the connection must never
/// be: a loop that missed it would keep the relay up until it fell silent. (The old report
/// closure sent `Closed` with `try_send` too and lost it here.)
#[test]
fn a_full_queue_drops_a_relay_s_frames_but_never_the_end_of_its_connection() {
    use super::shared::{Event, Shared, tcp_sink};
    use crate::reach::relay_client::tcp::TcpEvent;
    use plexsphere_wire::reach::relay::Frame;

    let (tx, rx) = mpsc::sync_channel(1);
    let shared = Arc::new(Shared::new(tx));
    let report = tcp_sink(shared.clone(), "r1".to_owned());
    assert!(
        shared.events.try_send(Event::Wake).is_ok(),
        "the queue is full now"
    );

    report(TcpEvent::Frame(Frame::Ping { nonce: [1; 8] }));
    assert_eq!(
        shared.dropped.load(Ordering::Relaxed),
        1,
        "the frame is dropped and counted"
    );
    report(TcpEvent::Closed("reset by peer".to_owned()));
    assert_eq!(
        *lock(&shared.closed),
        vec![("r1".to_owned(), "reset by peer".to_owned())],
        "the end is kept for the loop's next turn"
    );
    assert_eq!(
        shared.dropped.load(Ordering::Relaxed),
        1,
        "and not counted as dropped"
    );
    assert!(matches!(rx.try_recv(), Ok(Event::Wake)));
    assert!(
        rx.try_recv().is_err(),
        "nothing else went on the full queue"
    );
}
