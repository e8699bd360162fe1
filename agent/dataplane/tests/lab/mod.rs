//! The interop tests' lab: two network namespaces joined by a veth, plexd-wg on one side and a
//! reference WireGuard on the other, and the helpers that run commands and traffic inside them.
//! Everything it creates is removed on drop, even after a failed assertion.

use nix::sched::{CloneFlags, setns};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use plexd_dataplane::SecretKey;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const PLEXD_WG: &str = env!("CARGO_BIN_EXE_plexd-wg");
pub const UNDERLAY_A: &str = "10.200.0.1";
pub const UNDERLAY_B: &str = "10.200.0.2";
pub const MESH_A: &str = "10.201.0.1";
pub const MESH_B: &str = "10.201.0.2";

pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Everything the test created; removed on drop, even after a failed assertion.
pub struct Lab {
    pub pid: u32,
    pub ns: [String; 2],
    pub ifaces: [String; 2],
    pub children: Vec<Child>,
    pub dir: PathBuf,
    /// Extra environment for every program `start_args` starts (the references ignore
    /// plexd-wg's variables).
    pub env: Vec<(&'static str, String)>,
}

impl Lab {
    /// `tag` tells apart the labs of tests running at the same time in this process.
    pub fn new(tag: char) -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the interop test needs root (network namespaces, TUN devices); run it as root"
        );
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("plexd-wg-interop-{pid}-{tag}"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let lab = Lab {
            pid,
            ns: [format!("pxwg-{pid}-{tag}a"), format!("pxwg-{pid}-{tag}b")],
            // plexd-wg in a, the reference in b; at most 15 characters.
            ifaces: [
                format!("pxw{}{tag}a", pid % 1_000_000),
                format!("pxg{}{tag}b", pid % 1_000_000),
            ],
            children: Vec::new(),
            dir,
            env: Vec::new(),
        };
        let (va, vb) = (
            format!("pxv{}{tag}a", pid % 1_000_000),
            format!("pxv{}{tag}b", pid % 1_000_000),
        );
        for ns in &lab.ns {
            sh(&["ip", "netns", "add", ns]);
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        sh(&[
            "ip", "link", "add", &va, "netns", &lab.ns[0], "type", "veth", "peer", "name", &vb,
            "netns", &lab.ns[1],
        ]);
        for (ns, dev, ip) in [(&lab.ns[0], &va, UNDERLAY_A), (&lab.ns[1], &vb, UNDERLAY_B)] {
            sh(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                dev,
            ]);
            sh(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        lab
    }

    pub fn socket(&self, side: usize) -> PathBuf {
        Path::new("/var/run/wireguard").join(format!("{}.sock", self.ifaces[side]))
    }

    pub fn log(&self, side: usize) -> PathBuf {
        self.dir.join(format!("{}.log", self.ifaces[side]))
    }

    /// Starts `program -f <iface>` inside namespace `side` and waits for its UAPI socket.
    pub fn start(&mut self, side: usize, program: &str) -> u32 {
        self.start_args(side, program, &[])
    }

    /// Starts `program -f <extra...> <iface>` inside namespace `side`.
    pub fn start_args(&mut self, side: usize, program: &str, extra: &[&str]) -> u32 {
        let log = File::create(self.log(side)).expect("log file");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns[side], program, "-f"])
            .args(extra)
            .arg(&self.ifaces[side])
            .env("WG_PROCESS_FOREGROUND", "1")
            .env("LOG_LEVEL", "debug")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let pid = child.id();
        self.children.push(child);
        let socket = self.socket(side);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "{program} did not serve {} within 10 s; log:\n{}",
                socket.display(),
                std::fs::read_to_string(self.log(side)).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        pid
    }

    pub fn wg(&self, side: usize, args: &[&str]) -> String {
        let mut all = vec!["ip", "netns", "exec", &self.ns[side], "wg"];
        all.extend_from_slice(args);
        sh(&all)
    }

    /// `wg set` with the other side as the only peer, then the mesh address and link up.
    pub fn configure(&self, side: usize, key: &SecretKey, peer: &SecretKey) {
        let key_file = self.dir.join(format!("key{side}"));
        std::fs::write(&key_file, format!("{}\n", base64_key(key))).expect("key file");
        let (peer_underlay, peer_mesh, mesh) = if side == 0 {
            (UNDERLAY_B, MESH_B, MESH_A)
        } else {
            (UNDERLAY_A, MESH_A, MESH_B)
        };
        self.wg(
            side,
            &[
                "set",
                &self.ifaces[side],
                "listen-port",
                "51820",
                "private-key",
                key_file.to_str().expect("utf-8 path"),
                "peer",
                &peer.public_key().to_base64(),
                "endpoint",
                &format!("{peer_underlay}:51820"),
                "allowed-ips",
                &format!("{peer_mesh}/32"),
            ],
        );
        let ns = &self.ns[side];
        sh(&[
            "ip",
            "-n",
            ns,
            "addr",
            "add",
            &format!("{mesh}/24"),
            "dev",
            &self.ifaces[side],
        ]);
        sh(&["ip", "-n", ns, "link", "set", &self.ifaces[side], "up"]);
    }

    pub fn logs(&self) -> String {
        (0..2)
            .map(|s| std::fs::read_to_string(self.log(s)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n----\n")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            if let Ok(pid) = i32::try_from(c.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
        // Daemons started in the background are not our children: stop what runs in our
        // namespaces (only this test starts anything there), with a bound.
        for ns in &self.ns {
            let out = Command::new("ip").args(["netns", "pids", ns]).output();
            let pids: Vec<i32> = out
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
            for pid in &pids {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while pids
                .iter()
                .any(|p| Path::new(&format!("/proc/{p}")).exists())
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for ns in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        for side in 0..2 {
            let _ = std::fs::remove_file(self.socket(side));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = self.pid;
    }
}

pub fn base64_key(k: &SecretKey) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(k.bytes())
}

/// Runs `f` on a thread that has entered network namespace `ns`.
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
}

/// A TCP echo of `len` bytes from `client_ns` to `server` (listening in `server_ns`); the
/// client retries the connection while the handshake completes. Answers the bytes echoed.
pub fn tcp_echo(client_ns: &str, server_ns: &str, server: &str, len: usize) -> Vec<u8> {
    let addr: SocketAddr = format!("{server}:7000").parse().expect("addr");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = in_netns(server_ns, move || {
        let listener = TcpListener::bind(addr).expect("listen on the mesh address");
        ready_tx.send(()).expect("ready");
        let (mut conn, _) = listener.accept().expect("accept");
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut buf = vec![0u8; len];
        conn.read_exact(&mut buf).expect("server read");
        conn.write_all(&buf).expect("server write");
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("server listening");
    let client = in_netns(client_ns, move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut conn = loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
                Ok(c) => break c,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "no TCP connection to {addr}: {e}"
                ),
            }
        };
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        conn.write_all(&data).expect("client write");
        let mut back = vec![0u8; len];
        conn.read_exact(&mut back).expect("client read");
        back
    });
    let back = client.join().expect("client thread");
    server.join().expect("server thread");
    back
}

pub fn latest_handshake(lab: &Lab, side: usize) -> u64 {
    let out = lab.wg(side, &["show", &lab.ifaces[side], "latest-handshakes"]);
    out.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}
