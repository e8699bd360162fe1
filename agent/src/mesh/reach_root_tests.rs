//! The reach runtime with two embedded data planes in two network namespaces joined by a veth
//! pair (root): a real ping crosses the mesh with the path pinned Direct, then through both
//! data planes' relay endpoints (no loopback forwarder) and an in-test relay stand-in (a UDP
//! socket that answers the registration and turns each `send` into a `recv` for the
//! destination) with the path pinned Relay. Namespaces and links are named `c2r*` and removed at the end. The engine
//! runs too (its disco probes cross the veth); a path it already chose emits no new effect,
//! so the pinned paths hold, and the relay stand-in's count shows which one the pings took.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd as _;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};
use plexd_dataplane::relay::is_relay_endpoint;
use plexsphere_wire::node::{PeerSpec, RelaySpec};
use plexsphere_wire::reach::public_key;
use plexsphere_wire::reach::relay::Frame;
use plexsphere_wire::signed::SignedEnvelope;

use super::diff::PublicKey;
use super::worker::WgMesh;
use super::*;
use crate::config::WireguardConfig;
use crate::reach::io::{Effect, Path, PeerReach, ReachHandle, Transport};

const NS: [&str; 2] = ["c2ra", "c2rb"];
const UNDERLAY: [&str; 2] = ["10.231.0.1", "10.231.0.2"];
const MESH: [&str; 2] = ["10.78.0.1", "10.78.0.2"];
const SECRETS: [[u8; 32]; 2] = [[0x31; 32], [0x32; 32]];
const PORT: u16 = 51820;

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The two namespaces and the veth between them; removed on drop.
struct Lab;

impl Lab {
    fn new() -> Lab {
        for ns in NS {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        for ns in NS {
            sh(&["ip", "netns", "add", ns]);
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        sh(&[
            "ip", "link", "add", "c2rva", "netns", NS[0], "type", "veth", "peer", "c2rvb", "netns",
            NS[1],
        ]);
        for (i, (ns, dev)) in NS.iter().zip(["c2rva", "c2rvb"]).enumerate() {
            sh(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", UNDERLAY[i]),
                "dev",
                dev,
            ]);
            sh(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        Lab
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in NS {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// Runs `f` on a thread inside namespace `ns` (threads it starts stay there too).
fn in_ns<T: Send + 'static>(ns: &'static str, f: impl FnOnce() -> T + Send + 'static) -> T {
    thread::spawn(move || {
        let file = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
        setns(file.as_fd(), CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .expect("the namespace thread panicked")
}

fn key(i: usize) -> PublicKey {
    public_key(&SECRETS[i])
}

fn spec(i: usize) -> PeerSpec {
    PeerSpec {
        node_id: uuid::Uuid::from_u128(i as u128 + 1),
        hostname: format!("node-{i}"),
        public_key: key(i).to_base64(),
        mesh_ip: MESH[i].parse().unwrap(),
        allowed_ips: vec![format!("{}/32", MESH[i]).parse().unwrap()],
        endpoints: vec![SocketAddr::new(UNDERLAY[i].parse().unwrap(), PORT)],
        persistent_keepalive_secs: None,
        home_relay: None,
        dns_name: None,
    }
}

fn open_node(i: usize) -> WgMesh {
    let cfg = WireguardConfig {
        backend: Backend::Userspace,
        interface: format!("c2rw{i}{}", std::process::id() % 10_000),
        listen_port: PORT,
        ..WireguardConfig::default()
    };
    let node = NodeSetup::new(SECRETS[i], MESH[i].parse().unwrap(), 16);
    let mut m = userspace::open(&cfg, &node).unwrap();
    // The embedded data plane starts closed; no policy (an older server's state) opens it,
    // as the daemon's first apply does.
    m.set_policy(None).unwrap();
    let other = 1 - i;
    m.apply(Arc::new(vec![spec(other)])).unwrap();
    m
}

fn ping(ns: &str, to: &str) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ping", "-c", "1", "-W", "1", to])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn ping_within(ns: &str, to: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ping(ns, to) {
        assert!(
            Instant::now() < deadline,
            "no ping {ns} -> {to} within 20 s"
        );
    }
}

/// The relay stand-in: learns each key's address from its hello, answers the registration,
/// turns `send` into `recv` for the destination's address; counts what it relayed.
fn relay_stand_in(
    socket: UdpSocket,
    stop: Arc<AtomicBool>,
    relayed: Arc<AtomicU64>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let mut at: HashMap<PublicKey, SocketAddr> = HashMap::new();
        let mut keys = HashMap::new();
        let mut counter = 0u64;
        let mut buf = vec![0u8; 65535];
        while !stop.load(Ordering::Relaxed) {
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                continue;
            };
            let Ok(frame) = Frame::from_datagram(&buf[..n]) else {
                continue; // STUN from the nodes' probes
            };
            let (answer, to) = match frame {
                Frame::Hello { node } => {
                    at.insert(node, from);
                    (Frame::Challenge { cookie: [5; 32] }, from)
                }
                Frame::Register { node, .. } => {
                    // Answers a relay seals, sealed under the node's key (relay secret 0x77).
                    let shared = plexsphere_wire::reach::shared_secret(&[0x77; 32], &node);
                    keys.insert(from, plexsphere_wire::reach::relay::FrameKey::new(&shared));
                    (Frame::Registered { lease_secs: 60 }, from)
                }
                Frame::Send { dst, payload } => {
                    let src = at.iter().find(|(_, a)| **a == from).map(|(k, _)| *k);
                    let to = at
                        .iter()
                        .find(|(k, _)| plexsphere_wire::reach::relay::prefix(k) == dst)
                        .map(|(_, a)| *a);
                    let (Some(src), Some(to)) = (src, to) else {
                        continue;
                    };
                    relayed.fetch_add(1, Ordering::Relaxed);
                    let src = plexsphere_wire::reach::relay::prefix(&src);
                    (Frame::Recv { src, payload }, to)
                }
                Frame::Ping { nonce } => (Frame::Pong { nonce }, from),
                _ => continue,
            };
            let answer = match (&answer, keys.get(&to)) {
                (Frame::Registered { .. } | Frame::Pong { .. }, Some(k)) => {
                    counter += 1;
                    k.seal(counter, &answer)
                }
                _ => answer,
            };
            let _ = socket.send_to(&answer.to_datagram(), to);
        }
    })
}

#[test]
fn a_ping_crosses_the_mesh_on_a_direct_path_and_then_through_a_relay() {
    let _lab = Lab::new();
    // The relay stand-in lives in namespace a, on its underlay address.
    let relay_addr: SocketAddr = format!("{}:3478", UNDERLAY[0]).parse().unwrap();
    let relay_socket = in_ns(NS[0], move || UdpSocket::bind(relay_addr).unwrap());
    let (stop, relayed) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let relay = relay_stand_in(relay_socket, stop.clone(), relayed.clone());

    let a = in_ns(NS[0], || open_node(0));
    let b = in_ns(NS[1], || open_node(1));
    let (ra, rb) = (a.runtime().unwrap(), b.runtime().unwrap());

    // Direct: each side's endpoint pinned to the other's underlay address.
    for (rt, other) in [(&ra, 1), (&rb, 0)] {
        rt.set_peers(vec![PeerReach {
            key: key(other),
            node_id: spec(other).node_id,
            hostname: spec(other).hostname,
            endpoints: spec(other).endpoints,
            home_relay: Some("r1".into()),
            routes: Vec::new(),
        }]);
        rt.perform(Effect::SetPath {
            peer: key(other),
            path: Path::Direct {
                endpoint: spec(other).endpoints[0],
            },
        });
    }
    ping_within(NS[0], MESH[1]);
    assert_eq!(
        relayed.load(Ordering::Relaxed),
        0,
        "nothing relayed on the direct path"
    );

    // Relay: both nodes know r1 and hold a token; each side's path goes through it.
    let spec_r1 = RelaySpec {
        name: "r1".into(),
        public_key: public_key(&[0x77; 32]).to_base64(),
        udp: Some(relay_addr),
        tls: None,
        tls_server_name: None,
    };
    let token = SignedEnvelope {
        payload: "e30".into(),
        signature: "sig".into(),
    };
    for (rt, other) in [(&ra, 1), (&rb, 0)] {
        rt.set_relays(vec![spec_r1.clone()], vec![]);
        rt.set_relay_token(token.clone());
        rt.perform(Effect::SetPath {
            peer: key(other),
            path: Path::Relay {
                relay: "r1".into(),
                transport: Transport::Udp,
            },
        });
    }
    // Both endpoints are now the data plane's own relay endpoints (a UDP relay is carried
    // inside the userspace data plane, with no loopback forwarder); the diff leaves them so.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let relayed_in_plane = [&a, &b].iter().all(|m| {
            m.live_peers()
                .unwrap()
                .iter()
                .all(|p| p.endpoint.is_some_and(is_relay_endpoint))
        });
        if relayed_in_plane {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the endpoints never moved to the data plane's relay endpoints"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let before = relayed.load(Ordering::Relaxed);
    ping_within(NS[0], MESH[1]);
    ping_within(NS[1], MESH[0]);
    assert!(
        relayed.load(Ordering::Relaxed) >= before + 4,
        "the pings went through the relay ({} frames)",
        relayed.load(Ordering::Relaxed)
    );
    // A periodic reconcile does not write the direct candidates back.
    thread::sleep(worker::RECONCILE_EVERY + Duration::from_secs(1));
    for m in [&a, &b] {
        let live = m.live_peers().unwrap();
        assert!(live[0].endpoint.is_some_and(is_relay_endpoint), "{live:?}");
    }
    stop.store(true, Ordering::Relaxed);
    relay.join().unwrap();
    drop(a);
    drop(b);
}
