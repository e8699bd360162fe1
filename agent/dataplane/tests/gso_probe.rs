//! Root: the segmentation probe between two namespaces joined by a veth. Namespace a runs the
//! data plane in this process (a real TUN, the switched UDP socket with GSO, the runner's
//! threads), namespace b runs plexd-wg; the peer's kernel answers the probe's echo requests.
//!
//! - a clean path: `ok`;
//! - nftables in b's prerouting chain drops UDP longer than 1600 bytes (only a GSO send makes
//!   one on this 1500-byte link, and the veth hands it over whole): `segmented_lost`, and a normal ping through the tunnel still
//!   gets its replies while a probe runs (the probe's matcher takes only its own);
//! - nftables in b's input chain drops ICMP echo requests: `inconclusive`.
//!
//! Needs root, `ip`, `wg`, `nft` and `ping`; fails (never skips) without them.

use std::net::IpAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use plexd_dataplane::linux::{LinuxTun, LinuxUdpBinder, SwitchedBinder};
use plexd_dataplane::probe::{PROBE_PACKETS, Prober, Verdict};
use plexd_dataplane::runner::{self, RunConfig, RunError, Shutdown};
use plexd_dataplane::{Device, RawSender, SecretKey, UdpOffloadSwitch};

mod lab;

use lab::*;

/// The inner packet size: the TUN's MTU (plexd-wg's default too).
const MTU: usize = 1420;

/// The data plane of namespace a, in this process; stops when dropped (before the lab goes).
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

fn start_plane(lab: &Lab) -> (Plane, Prober) {
    let device = Arc::new(Device::new(plexsphere_wire::clock::Now::system()));
    let raw = RawSender::new();
    let switch = Arc::new(UdpOffloadSwitch::new(true));
    let shutdown = Shutdown::new();
    let config = RunConfig {
        uapi_socket: Some(lab.socket(0)),
        raw: Some(raw.clone()),
        ..RunConfig::default()
    };
    let (iface, d, s, sw) = (
        lab.ifaces[0].clone(),
        device.clone(),
        shutdown.clone(),
        switch.clone(),
    );
    let thread = in_netns(&lab.ns[0], move || {
        let tun = LinuxTun::create(&iface, MTU as u32, true).expect("create the TUN");
        let binder = SwitchedBinder {
            inner: LinuxUdpBinder::default(),
            switch: sw,
        };
        runner::run(d, tun, binder, config, s)
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
    (plane, Prober::new(device, raw, Some(switch)))
}

fn nft(ns: &str, rules: &str) {
    let path = std::env::temp_dir().join(format!("gsoprobe-{}-{ns}.nft", std::process::id()));
    std::fs::write(&path, rules).expect("rules file");
    sh(&[
        "ip",
        "netns",
        "exec",
        ns,
        "nft",
        "-f",
        path.to_str().expect("utf-8 path"),
    ]);
    let _ = std::fs::remove_file(&path);
}

/// `ping -c count` from namespace a to b's mesh address; answers the replies received.
fn ping(lab: &Lab, count: u32) -> u32 {
    let out = std::process::Command::new("ip")
        .args([
            "netns", "exec", &lab.ns[0], "ping", "-n", "-i", "0.2", "-W", "2",
        ])
        .args(["-c", &count.to_string(), MESH_B])
        .output()
        .expect("run ping");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split(',')
        .find(|p| p.contains("received"))
        .and_then(|p| p.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no ping summary in: {text}"))
}

#[test]
fn the_probe_tells_a_clean_path_a_path_losing_segmented_datagrams_and_a_silent_peer_apart() {
    let mut lab = Lab::new('g');
    let (plane, prober) = start_plane(&lab);
    lab.start(1, PLEXD_WG);
    let (ka, kb) = (
        SecretKey::generate().expect("key"),
        SecretKey::generate().expect("key"),
    );
    lab.configure(0, &ka, &kb);
    lab.configure(1, &kb, &ka);
    let (src, dst): (IpAddr, IpAddr) = (MESH_A.parse().expect("ip"), MESH_B.parse().expect("ip"));
    let peer = kb.public_key();

    // No session yet: the probe says so and sends nothing.
    let early = prober.probe(&peer, src, dst, MTU);
    assert!(early.is_err(), "{early:?}");
    assert_eq!(tcp_echo(&lab.ns[0], &lab.ns[1], MESH_B, 1000).len(), 1000);
    assert!(latest_handshake(&lab, 1) > 0, "a session is up");
    assert_eq!(ping(&lab, 3), 3, "the tunnel carries pings");
    assert!(prober.gso_in_use(), "the socket sends with GSO");

    let clean = prober.probe(&peer, src, dst, MTU).expect("probe");
    assert_eq!(clean.verdict, Verdict::Ok, "{clean:?}\n{}", lab.logs());
    assert_eq!(clean.single_replies, PROBE_PACKETS, "{clean:?}");

    // The path loses every super-datagram, silently: the peer's namespace drops UDP above
    // 1600 bytes as it comes in (the veth hands a GSO send over whole). A drop in the
    // sender's own output chain would not do: the kernel answers that send with EPERM and
    // the socket sends the run again one datagram at a time, as it does for bulk traffic,
    // so nothing is lost there; a broken NIC or path says nothing.
    nft(
        &lab.ns[1],
        "table inet gsoprobe {\n chain pre {\n  type filter hook prerouting priority -300;\n  meta l4proto udp meta length > 1600 counter drop\n }\n}\n",
    );
    let pinger = {
        let ns = lab.ns[0].clone();
        std::thread::spawn(move || {
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", &ns, "ping", "-n", "-i", "0.2", "-W", "2"])
                .args(["-c", "10", MESH_B])
                .output()
                .expect("run ping");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
    };
    let lost = prober.probe(&peer, src, dst, MTU).expect("probe");
    let counted = sh(&[
        "ip", "netns", "exec", &lab.ns[1], "nft", "list", "table", "inet", "gsoprobe",
    ]);
    assert_eq!(lost.verdict, Verdict::SegmentedLost, "{lost:?}\n{counted}");
    assert_eq!(lost.segmented_replies, 0, "{lost:?}");
    let pings = pinger.join().expect("ping thread");
    assert!(
        pings.contains("10 received"),
        "a normal ping during a probe gets every reply: {pings}"
    );
    assert!(
        !counted.contains("packets 0 "),
        "the probe's segmented send was one super-datagram: {counted}"
    );
    sh(&[
        "ip", "netns", "exec", &lab.ns[1], "nft", "delete", "table", "inet", "gsoprobe",
    ]);
    let again = prober.probe(&peer, src, dst, MTU).expect("probe");
    assert_eq!(again.verdict, Verdict::Ok, "the rule is gone: {again:?}");

    // The peer drops echo requests: nothing can be said.
    nft(
        &lab.ns[1],
        "table inet gsoprobe {\n chain in {\n  type filter hook input priority 0;\n  icmp type echo-request drop\n }\n}\n",
    );
    let silent = prober.probe(&peer, src, dst, MTU).expect("probe");
    assert_eq!(silent.verdict, Verdict::Inconclusive, "{silent:?}");
    assert_eq!(silent.single_replies, 0, "{silent:?}");
    drop(plane);
}
