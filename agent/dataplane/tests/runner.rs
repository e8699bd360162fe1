//! The runner's threads over in-memory TUNs and a virtual UDP network, configured through a
//! real UAPI unix socket in a temporary directory. No root needed.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use plexd_dataplane::memory::{MemoryNetwork, MemoryTun, tun_pair};
use plexd_dataplane::packet::ipv4_udp;
use plexd_dataplane::runner::{RunConfig, RunError, Shutdown, run};
use plexd_dataplane::{Device, PacketBatch, SecretKey, Tun};

struct Node {
    host: MemoryTun,
    socket: PathBuf,
    shutdown: Shutdown,
    thread: Option<JoinHandle<Result<(), RunError>>>,
    key: SecretKey,
}

impl Node {
    fn start(net: &MemoryNetwork, ip: [u8; 4], dir: &Path, name: &str) -> Node {
        let (host, tun) = tun_pair();
        let socket = dir.join(format!("{name}.sock"));
        let shutdown = Shutdown::new();
        let config = RunConfig {
            uapi_socket: Some(socket.clone()),
            ..RunConfig::default()
        };
        let binder = net.binder(IpAddr::from(ip));
        let s = shutdown.clone();
        let thread = std::thread::spawn(move || {
            run(
                Arc::new(Device::new(plexsphere_wire::clock::Now::system())),
                tun,
                binder,
                config,
                s,
            )
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "the UAPI socket never came up");
            std::thread::sleep(Duration::from_millis(5));
        }
        Node {
            host,
            socket,
            shutdown,
            thread: Some(thread),
            key: SecretKey::generate().expect("key"),
        }
    }

    /// One UAPI request; answers the lines up to the empty line.
    fn uapi(&self, request: &str) -> Vec<String> {
        let mut s = UnixStream::connect(&self.socket).expect("connect to the UAPI socket");
        s.write_all(request.as_bytes()).expect("write");
        let mut lines = Vec::new();
        let mut reader = BufReader::new(s);
        loop {
            let mut line = String::new();
            assert!(
                reader.read_line(&mut line).expect("read") > 0,
                "answer cut short: {lines:?}"
            );
            let line = line.trim_end().to_owned();
            if line.is_empty() {
                return lines;
            }
            lines.push(line);
        }
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

fn wait_for_packet(host: &MemoryTun) -> Vec<u8> {
    let mut batch = PacketBatch::for_packets(4);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if host
            .recv(&mut batch, Duration::from_millis(100))
            .expect("recv")
            > 0
        {
            return batch.get(0).to_vec();
        }
        assert!(Instant::now() < deadline, "no packet within 10 s");
    }
}

#[test]
fn two_runners_configured_over_uapi_carry_packets_both_ways_and_stop_cleanly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let net = MemoryNetwork::new();
    let a = Node::start(&net, [192, 0, 2, 1], dir.path(), "a");
    let b = Node::start(&net, [192, 0, 2, 2], dir.path(), "b");
    for (me, other, ip, other_mesh) in [
        (&a, &b, "192.0.2.2", "10.64.0.2"),
        (&b, &a, "192.0.2.1", "10.64.0.1"),
    ] {
        let answer = me.uapi(&format!(
            "set=1\nprivate_key={}\nlisten_port=51820\nreplace_peers=true\npublic_key={}\n\
             endpoint={ip}:51820\nallowed_ip={other_mesh}/32\n\n",
            me.key.to_hex(),
            other.key.public_key().to_hex()
        ));
        assert_eq!(answer, vec!["errno=0"]);
    }
    let get = a.uapi("get=1\n\n");
    assert!(
        get.contains(&"listen_port=51820".to_owned()),
        "rebound: {get:?}"
    );
    assert_eq!(get.last().map(String::as_str), Some("errno=0"));

    let (ma, mb) = (Ipv4Addr::new(10, 64, 0, 1), Ipv4Addr::new(10, 64, 0, 2));
    a.host.send_one(&ipv4_udp(ma, mb, b"over the mesh"));
    assert_eq!(&wait_for_packet(&b.host)[28..], b"over the mesh");
    b.host.send_one(&ipv4_udp(mb, ma, b"and back"));
    assert_eq!(&wait_for_packet(&a.host)[28..], b"and back");

    let get = a.uapi("get=1\n\n");
    let handshake = get
        .iter()
        .find_map(|l| l.strip_prefix("last_handshake_time_sec="))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(handshake.is_some_and(|t| t > 0), "{get:?}");

    // A bad request gets an errno and the connection stays usable.
    assert_eq!(a.uapi("set=1\nlisten_port=x\n\n"), vec!["errno=-22"]);

    let socket = a.socket.clone();
    drop(a);
    assert!(!socket.exists(), "the UAPI socket is removed on shutdown");
}

#[test]
fn a_taken_listen_port_is_refused_with_eaddrinuse() {
    let dir = tempfile::tempdir().expect("temp dir");
    let net = MemoryNetwork::new();
    let _squatter = net
        .bind("192.0.2.1:51820".parse().expect("addr"))
        .expect("bind");
    let a = Node::start(&net, [192, 0, 2, 1], dir.path(), "a");
    assert_eq!(a.uapi("set=1\nlisten_port=51820\n\n"), vec!["errno=-98"]);
    assert_eq!(a.uapi("set=1\nlisten_port=51821\n\n"), vec!["errno=0"]);
}
