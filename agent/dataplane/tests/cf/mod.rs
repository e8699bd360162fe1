//! The conformance tests' network: two namespaces (`a`, `b`) joined by one veth, a WireGuard
//! daemon in each (`wg0`-style interface names with the `cf` prefix and the test's pid), and
//! the commands that run inside them. Everything is removed on drop, even after a failed
//! assertion. Scenarios after the kernel's tools/testing/selftests/wireguard/netns.sh.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use plexd_dataplane::SecretKey;

pub const PLEXD_WG: &str = env!("CARGO_BIN_EXE_plexd-wg");
/// The mesh addresses of the two sides.
pub const MESH: [&str; 2] = ["192.168.241.1", "192.168.241.2"];
/// The UDP ports the two sides listen on.
pub const PORT: [u16; 2] = [1, 2];

/// Runs a command; panics with its stderr when it fails.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub struct Net {
    pub ns: [String; 2],
    pub wg: [String; 2],
    /// The underlay veth ends, `veth[0]` in `ns[0]`.
    pub veth: [String; 2],
    pub keys: [SecretKey; 2],
    /// The router namespace between the two sides, when there is one (`behind_nat`).
    pub router: Option<String>,
    children: Vec<Child>,
    dir: PathBuf,
    /// Extra environment for every program `start` starts.
    pub env: Vec<(&'static str, String)>,
}

impl Net {
    /// Namespaces and the veth (no addresses yet); `tag` tells apart tests of one process.
    pub fn new(tag: &str) -> Self {
        let net = Self::empty(tag);
        sh(&[
            "ip",
            "link",
            "add",
            &net.veth[0],
            "netns",
            &net.ns[0],
            "type",
            "veth",
            "peer",
            "name",
            &net.veth[1],
            "netns",
            &net.ns[1],
        ]);
        for side in 0..2 {
            net.ip(side, &["link", "set", &net.veth[side], "up"]);
        }
        net
    }

    /// Side a (10.0.1.1) behind a router that masquerades it toward side b (10.0.2.2), with
    /// UDP conntrack entries that expire after `conntrack_timeout` seconds of silence.
    pub fn behind_nat(tag: &str, conntrack_timeout: u32) -> Self {
        let mut net = Self::empty(tag);
        let router = format!("{}-r", net.ns[0].trim_end_matches("-a"));
        sh(&["ip", "netns", "add", &router]);
        net.router = Some(router.clone());
        let r = |args: &[&str]| {
            let mut all = vec!["ip", "netns", "exec", &router];
            all.extend_from_slice(args);
            sh(&all)
        };
        for side in 0..2 {
            let inside = format!("cfr{}", &net.veth[side][3..]);
            sh(&[
                "ip",
                "link",
                "add",
                &net.veth[side],
                "netns",
                &net.ns[side],
                "type",
                "veth",
                "peer",
                "name",
                &inside,
                "netns",
                &router,
            ]);
            let subnet = side + 1;
            r(&[
                "ip",
                "addr",
                "add",
                &format!("10.0.{subnet}.254/24"),
                "dev",
                &inside,
            ]);
            r(&["ip", "link", "set", &inside, "up"]);
            net.ip(side, &["link", "set", &net.veth[side], "up"]);
        }
        net.add_addr(0, "10.0.1.1/24");
        net.add_addr(1, "10.0.2.2/24");
        net.ip(0, &["route", "add", "default", "via", "10.0.1.254"]);
        r(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        let toward_b = format!("cfr{}", &net.veth[1][3..]);
        r(&[
            "nft",
            &format!(
                "add table ip cfnat; add chain ip cfnat post {{ type nat hook postrouting priority srcnat; }}; add rule ip cfnat post oifname {toward_b} masquerade"
            ),
        ]);
        // The nat table loaded conntrack; both its UDP timeouts (one-way and seen-both-ways).
        let t = conntrack_timeout.to_string();
        r(&[
            "sysctl",
            "-qw",
            &format!("net.netfilter.nf_conntrack_udp_timeout={t}"),
        ]);
        r(&[
            "sysctl",
            "-qw",
            &format!("net.netfilter.nf_conntrack_udp_timeout_stream={t}"),
        ]);
        net
    }

    /// With `pool`, plexd-wg runs with its ordered crypto pool (two workers, plexd's own
    /// protocol implementation) instead of its defaults.
    pub fn with_pool(&mut self, pool: bool) {
        if pool {
            self.env.push(("PLEXD_WG_CRYPTO_WORKERS", "2".into()));
        }
    }

    fn empty(tag: &str) -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the conformance tests need root (network namespaces, TUN devices); run them as root"
        );
        let pid = std::process::id() % 100_000;
        let dir = std::env::temp_dir().join(format!("cf-{pid}-{tag}"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let net = Net {
            ns: [format!("cf-{pid}-{tag}-a"), format!("cf-{pid}-{tag}-b")],
            wg: [format!("cfw{pid}{tag}a"), format!("cfw{pid}{tag}b")],
            veth: [format!("cfv{pid}{tag}a"), format!("cfv{pid}{tag}b")],
            keys: [
                SecretKey::generate().expect("key"),
                SecretKey::generate().expect("key"),
            ],
            router: None,
            children: Vec::new(),
            dir,
            env: Vec::new(),
        };
        for ns in &net.ns {
            sh(&["ip", "netns", "add", ns]);
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        net
    }

    /// `ip -n <ns[side]> args...`
    pub fn ip(&self, side: usize, args: &[&str]) -> String {
        let mut all = vec!["ip", "-n", &self.ns[side]];
        all.extend_from_slice(args);
        sh(&all)
    }

    /// Adds `addr` (with its prefix) to the side's veth; IPv6 without duplicate detection.
    pub fn add_addr(&self, side: usize, addr: &str) {
        let mut args = vec!["addr", "add", addr, "dev", &self.veth[side]];
        if addr.contains(':') {
            args.push("nodad");
        }
        self.ip(side, &args);
    }

    pub fn del_addr(&self, side: usize, addr: &str) {
        self.ip(side, &["addr", "del", addr, "dev", &self.veth[side]]);
    }

    /// Runs `args` inside the side's namespace; answers its output and whether it succeeded.
    pub fn exec(&self, side: usize, args: &[&str]) -> (bool, String) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns[side]])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    pub fn wg_cmd(&self, side: usize, args: &[&str]) -> String {
        let mut all = vec!["wg"];
        all.extend_from_slice(args);
        let (ok, out) = self.exec(side, &all);
        assert!(ok, "wg {args:?} in {} failed: {out}", self.ns[side]);
        out
    }

    fn socket(&self, side: usize) -> PathBuf {
        Path::new("/var/run/wireguard").join(format!("{}.sock", self.wg[side]))
    }

    pub fn log(&self, side: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("{side}.log"))).unwrap_or_default()
    }

    /// Starts `program -f <iface>` (plexd-wg or wireguard-go) in the side's namespace, waits
    /// for its UAPI socket, then gives it its key, port, the other side as its only peer
    /// (allowed IPs: the other's mesh address) and its mesh address.
    pub fn start(&mut self, side: usize, program: &str, mtu: Option<u32>) {
        let log = File::create(self.dir.join(format!("{side}.log"))).expect("log file");
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns[side],
                program,
                "-f",
                &self.wg[side],
            ])
            .env("WG_PROCESS_FOREGROUND", "1")
            .env("LOG_LEVEL", "debug")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        self.children.push(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(self.socket(side)).is_err() {
            assert!(
                Instant::now() < deadline,
                "{program} did not serve its UAPI socket within 10 s; log:\n{}",
                self.log(side)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let key_file = self.dir.join(format!("key{side}"));
        std::fs::write(&key_file, format!("{}\n", base64(&self.keys[side]))).expect("key file");
        let other = 1 - side;
        self.wg_cmd(
            side,
            &[
                "set",
                &self.wg[side],
                "listen-port",
                &PORT[side].to_string(),
                "private-key",
                key_file.to_str().expect("utf-8 path"),
                "peer",
                &self.public(other),
                "allowed-ips",
                &format!("{}/32", MESH[other]),
            ],
        );
        self.ip(
            side,
            &[
                "addr",
                "add",
                &format!("{}/24", MESH[side]),
                "dev",
                &self.wg[side],
            ],
        );
        if let Some(mtu) = mtu {
            self.ip(
                side,
                &["link", "set", &self.wg[side], "mtu", &mtu.to_string()],
            );
        }
        self.ip(side, &["link", "set", &self.wg[side], "up"]);
    }

    /// The pid of the daemon started `n`-th (`ip netns exec` execs it: the same process).
    pub fn pid(&self, n: usize) -> u32 {
        self.children[n].id()
    }

    /// The temp dir the test may write files into.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The side's private key in base64.
    pub fn private(&self, side: usize) -> String {
        base64(&self.keys[side])
    }

    /// The side's public key in base64.
    pub fn public(&self, side: usize) -> String {
        self.keys[side].public_key().to_base64()
    }

    /// `wg set <iface> peer <other> <args...>` on `side`.
    pub fn set_peer(&self, side: usize, args: &[&str]) {
        let mut all = vec!["set", &self.wg[side], "peer"];
        let other = self.public(1 - side);
        all.push(&other);
        all.extend_from_slice(args);
        self.wg_cmd(side, &all);
    }

    /// The endpoint `side` has for the other side, as `wg show endpoints` prints it.
    pub fn endpoint(&self, side: usize) -> String {
        let out = self.wg_cmd(side, &["show", &self.wg[side], "endpoints"]);
        out.split_whitespace().nth(1).unwrap_or("").to_string()
    }

    /// One ping of `size` bytes from `side` to the other side's mesh address, up to `tries`
    /// times (the first may wait for a handshake); answers whether one was answered.
    pub fn ping(&self, side: usize, size: usize, tries: usize) -> bool {
        let size = size.to_string();
        (0..tries).any(|_| {
            self.exec(
                side,
                &[
                    "ping",
                    "-c",
                    "1",
                    "-W",
                    "1",
                    "-M",
                    "do",
                    "-s",
                    &size,
                    MESH[1 - side],
                ],
            )
            .0
        })
    }

    pub fn logs(&self) -> String {
        format!("---- a:\n{}\n---- b:\n{}", self.log(0), self.log(1))
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for c in &mut self.children {
            if let Ok(pid) = i32::try_from(c.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
        }
        // `ip netns exec` is our child; the daemon under it may outlive it: stop what runs
        // in our namespaces (only this test starts anything there), with a bound.
        for ns in &self.ns {
            let pids: Vec<i32> = Command::new("ip")
                .args(["netns", "pids", ns])
                .output()
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
        for c in &mut self.children {
            let _ = c.wait();
        }
        for ns in self.ns.iter().chain(&self.router) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        for side in 0..2 {
            let _ = std::fs::remove_file(self.socket(side));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn base64(k: &SecretKey) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(k.bytes())
}
