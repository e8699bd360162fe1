//! Root: the access policy's filter with real TCP and ICMP between two namespaces joined by a
//! veth (issue 25). Namespace a is "db" (10.201.0.1): the data plane runs in this process
//! with the filter of "web may open tcp/7000 on db", installed before the interface carries
//! a packet. Namespace b is "web" (10.201.0.2): plexd-wg with NO filter, i.e. a sender that
//! rewrote its own interface; only db's filter stands in its way.
//!
//! Needs root, `ip`, `wg` and `ping`; fails (never skips) without them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a failure here is a test failure

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use plexd_dataplane::linux::{LinuxTun, LinuxUdpBinder};
use plexd_dataplane::runner::{self, RunConfig, RunError, Shutdown};
use plexd_dataplane::{Device, PolicyFilter, SecretKey};
use plexsphere_policy::{Compiled, Inventory, NodeInfo, ProjectInfo, parse};
use uuid::Uuid;

#[allow(dead_code)] // the shared lab's helpers other tests use
mod lab;

use lab::*;

const WEB_TO_DB: &str = "rules:\n  - {src: tag:web, dst: tag:db, proto: tcp, ports: 7000}\n";
const NOTHING: &str = "rules: []\n";

struct Plane {
    shutdown: Shutdown,
    thread: Option<JoinHandle<Result<(), RunError>>>,
}

impl Drop for Plane {
    fn drop(&mut self) {
        self.shutdown.trigger();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start_plane(lab: &Lab, device: Arc<Device>) -> Plane {
    let shutdown = Shutdown::new();
    let config = RunConfig {
        uapi_socket: Some(lab.socket(0)),
        ..RunConfig::default()
    };
    let (iface, s) = (lab.ifaces[0].clone(), shutdown.clone());
    let thread = in_netns(&lab.ns[0], move || {
        let tun = LinuxTun::create(&iface, 1420, true).expect("create the TUN");
        runner::run(device, tun, LinuxUdpBinder::default(), config, s)
    });
    let plane = Plane {
        shutdown,
        thread: Some(thread),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(lab.socket(0)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the data plane serves its UAPI socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    plane
}

/// db's filter under `doc` (db is node 1 at MESH_A, web node 2 at MESH_B).
fn filter(doc: &str, version: u64) -> PolicyFilter {
    let project = Uuid::from_u128(100);
    let node = |i: u128, name: &str, ip: &str| NodeInfo {
        id: Uuid::from_u128(i),
        name: name.into(),
        project_id: project,
        project_slug: "p".into(),
        tags: vec![name.into()],
        ipv4: Some(ip.parse::<Ipv4Addr>().unwrap()),
        ipv6: None,
    };
    let inv = Inventory {
        projects: vec![ProjectInfo {
            id: project,
            slug: "p".into(),
        }],
        nodes: vec![node(1, "db", MESH_A), node(2, "web", MESH_B)],
        tags: vec![],
    };
    let view = Compiled::new(&parse(doc).unwrap(), &inv)
        .node_view(Uuid::from_u128(1))
        .unwrap();
    let (f, e) = PolicyFilter::from_view(version, &view);
    assert!(e.is_none());
    f
}

fn inbound_drops(device: &Device, reason: &str) -> u64 {
    device
        .counters()
        .policy
        .read()
        .into_iter()
        .find(|(r, _, _)| *r == reason)
        .map(|(_, i, _)| i)
        .unwrap()
}

/// A listener on db's mesh address, bound inside db's namespace.
fn listen(lab: &Lab, port: u16) -> TcpListener {
    let addr: SocketAddr = format!("{MESH_A}:{port}").parse().unwrap();
    in_netns(&lab.ns[0], move || TcpListener::bind(addr).expect("listen"))
        .join()
        .unwrap()
}

#[test]
fn real_tcp_and_icmp_meet_the_filter_and_a_revocation_cuts_a_live_connection() {
    let mut lab = Lab::new('p');
    let device = Arc::new(Device::new(plexsphere_wire::clock::Now::system()));
    // Installed before the data plane reads its TUN or socket.
    device.set_policy(Some(filter(WEB_TO_DB, 1)));
    let plane = start_plane(&lab, device.clone());
    lab.start(1, PLEXD_WG);
    let (ka, kb) = (
        SecretKey::generate().expect("key"),
        SecretKey::generate().expect("key"),
    );
    lab.configure(0, &ka, &kb);
    lab.configure(1, &kb, &ka);

    // web -> db tcp/7000 (real TCP, db's replies included).
    assert_eq!(tcp_echo(&lab.ns[1], &lab.ns[0], MESH_A, 1000).len(), 1000);

    // tcp/7001: db listens, but no rule lets web open it: the SYN stops at db's filter.
    let _closed = listen(&lab, 7001);
    let before = inbound_drops(&device, "no_rule");
    let refused = in_netns(&lab.ns[1], || {
        let addr: SocketAddr = format!("{MESH_A}:7001").parse().unwrap();
        TcpStream::connect_timeout(&addr, Duration::from_secs(2))
    })
    .join()
    .unwrap();
    assert!(refused.is_err(), "{refused:?}");
    assert!(inbound_drops(&device, "no_rule") > before);

    // icmp: no rule.
    let out = std::process::Command::new("ip")
        .args([
            "netns", "exec", &lab.ns[1], "ping", "-n", "-c", "2", "-i", "0.2", "-W", "1",
        ])
        .arg(MESH_A)
        .output()
        .expect("run ping");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(" 0 received"), "{text}");

    // A live connection, then the revocation: the next bytes never reach db's host.
    let listener = listen(&lab, 7000);
    let (echoed_tx, echoed_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).expect("first bytes");
        conn.write_all(&buf).expect("echo");
        conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        conn.read(&mut buf)
    });
    let client = in_netns(&lab.ns[1], move || {
        let addr: SocketAddr = format!("{MESH_A}:7000").parse().unwrap();
        let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        conn.write_all(b"hello").unwrap();
        let mut back = [0u8; 5];
        conn.read_exact(&mut back).unwrap();
        echoed_tx.send(back).unwrap();
        go_rx.recv().unwrap();
        conn.write_all(b"again").unwrap();
        // Keep the connection open until the server has given up on it.
        let _ = done_rx.recv_timeout(Duration::from_secs(20));
    });
    assert_eq!(
        &echoed_rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        b"hello"
    );
    let before = inbound_drops(&device, "unknown_peer");
    device.set_policy(Some(filter(NOTHING, 2)));
    go_tx.send(()).unwrap();
    let after = server.join().unwrap();
    done_tx.send(()).unwrap();
    assert!(
        after.is_err(),
        "no byte of the revoked connection reaches db: {after:?}"
    );
    assert!(
        inbound_drops(&device, "unknown_peer") > before,
        "web is no peer of db's any more"
    );
    client.join().unwrap();

    // A new rule lets a new connection through at once.
    device.set_policy(Some(filter(WEB_TO_DB, 3)));
    assert_eq!(tcp_echo(&lab.ns[1], &lab.ns[0], MESH_A, 100).len(), 100);
    drop(plane);
}
