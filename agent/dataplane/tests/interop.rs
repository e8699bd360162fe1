//! Root: plexd-wg and a reference implementation — Debian's wireguard-go, and boringtun-cli
//! (crates.io) — in two network namespaces joined by a veth, both configured with `wg set`,
//! carry TCP both ways, each side initiating the handshake once; plexd-wg runs once as it is
//! by default and once with its ordered crypto pool (`PLEXD_WG_CRYPTO_WORKERS`, on plexd's own
//! protocol implementation).
//!
//! Needs root, `ip` (iproute2), `wg` (wireguard-tools), `wireguard-go` and `boringtun-cli`
//! (on PATH or in /var/cache/plexsphere/cargo-bin/bin, where scripts/deps.sh installs it); it
//! fails (never skips) without them. Every name includes the test's pid; the namespaces, processes and
//! sockets are removed on drop. Traffic stays inside the namespaces.

use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use plexd_dataplane::SecretKey;

mod lab;

use lab::*;

#[test]
fn plexd_wg_and_wireguard_go_carry_tcp_each_side_initiating_once() {
    carries_tcp_each_side_initiating_once('i', "wireguard-go", &[], None);
}

#[test]
fn plexd_wg_and_boringtun_cli_carry_tcp_each_side_initiating_once() {
    carries_tcp_each_side_initiating_once(
        'b',
        boringtun_cli(),
        &["--disable-drop-privileges"],
        None,
    );
}

#[test]
fn plexd_wg_with_the_crypto_pool_and_wireguard_go_carry_tcp_each_side_initiating_once() {
    carries_tcp_each_side_initiating_once('j', "wireguard-go", &[], Some(2));
}

#[test]
fn plexd_wg_with_the_crypto_pool_and_boringtun_cli_carry_tcp_each_side_initiating_once() {
    carries_tcp_each_side_initiating_once(
        'd',
        boringtun_cli(),
        &["--disable-drop-privileges"],
        Some(2),
    );
}

fn boringtun_cli() -> &'static str {
    ["boringtun-cli", "/var/cache/plexsphere/cargo-bin/bin/boringtun-cli"]
        .into_iter()
        .find(|p| {
            Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect(
            "boringtun-cli is missing: cargo install --locked boringtun-cli --root /var/cache/plexsphere/cargo-bin (scripts/deps.sh does)",
        )
    // As root it would otherwise drop to nobody and lose the UAPI socket's directory: the
    // callers pass --disable-drop-privileges.
}

/// plexd-wg on side a, `reference` on side b: 1 MiB echoed over TCP with plexd-wg initiating
/// the handshake, then again after both forgot their sessions with the reference initiating.
/// `pool`: plexd-wg's crypto workers.
fn carries_tcp_each_side_initiating_once(
    tag: char,
    reference: &str,
    extra: &[&str],
    pool: Option<usize>,
) {
    let mut lab = Lab::new(tag);
    if let Some(n) = pool {
        lab.env.push(("PLEXD_WG_CRYPTO_WORKERS", n.to_string()));
    }
    let plexd = lab.start(0, PLEXD_WG);
    let log = std::fs::read_to_string(lab.log(0)).unwrap_or_default();
    assert!(
        log.contains("offloads=true"),
        "the TCP below runs through TSO/GRO: {log}"
    );
    if let Some(n) = pool {
        assert!(
            log.contains(&format!("ordered crypto pool started workers={n}")),
            "plexd-wg runs the pool: {log}"
        );
    }
    lab.start_args(1, reference, extra);
    let (ka, kb) = (
        SecretKey::generate().expect("key"),
        SecretKey::generate().expect("key"),
    );
    lab.configure(0, &ka, &kb);
    lab.configure(1, &kb, &ka);
    let len = 1 << 20;
    let expected: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();

    // plexd-wg initiates: the first packet is a connection from a.
    assert_eq!(latest_handshake(&lab, 0), 0, "no handshake before traffic");
    let back = tcp_echo(&lab.ns[0], &lab.ns[1], MESH_B, len);
    assert!(
        back == expected,
        "1 MiB echoed intact a -> b -> a; logs:\n{}",
        lab.logs()
    );
    assert!(
        latest_handshake(&lab, 0) > 0,
        "wg show reads plexd-wg's handshake time"
    );

    // Forget the sessions on both sides, then the reference initiates.
    for side in 0..2 {
        let peer = if side == 0 { &kb } else { &ka };
        let pk = peer.public_key().to_base64();
        lab.wg(side, &["set", &lab.ifaces[side], "peer", &pk, "remove"]);
        let (ep, mesh) = if side == 0 {
            (UNDERLAY_B, MESH_B)
        } else {
            (UNDERLAY_A, MESH_A)
        };
        lab.wg(
            side,
            &[
                "set",
                &lab.ifaces[side],
                "peer",
                &pk,
                "endpoint",
                &format!("{ep}:51820"),
                "allowed-ips",
                &format!("{mesh}/32"),
            ],
        );
    }
    assert_eq!(
        latest_handshake(&lab, 0),
        0,
        "the re-added peer has no session"
    );
    let back = tcp_echo(&lab.ns[1], &lab.ns[0], MESH_A, len);
    assert!(
        back == expected,
        "1 MiB echoed intact b -> a -> b; logs:\n{}",
        lab.logs()
    );
    assert!(latest_handshake(&lab, 0) > 0);

    let dump = lab.wg(0, &["show", &lab.ifaces[0], "dump"]);
    let peer_line = dump.lines().nth(1).expect("a peer line in wg show dump");
    let fields: Vec<&str> = peer_line.split('\t').collect();
    assert_eq!(fields[0], kb.public_key().to_base64());
    assert_eq!(fields[2], format!("{UNDERLAY_B}:51820"), "endpoint");
    assert!(
        fields[5].parse::<u64>().expect("rx") > len as u64,
        "rx bytes: {peer_line}"
    );
    assert!(
        fields[6].parse::<u64>().expect("tx") > len as u64,
        "tx bytes: {peer_line}"
    );

    // SIGTERM stops plexd-wg cleanly and removes its socket.
    kill(
        Pid::from_raw(i32::try_from(plexd).expect("pid")),
        Signal::SIGTERM,
    )
    .expect("kill");
    let child = lab.children.iter_mut().next().expect("plexd-wg child");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "plexd-wg did not stop within 10 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success(),
        "plexd-wg exit status {status}; log:\n{}",
        lab.logs()
    );
    assert!(
        !lab.socket(0).exists(),
        "the UAPI socket is removed on exit"
    );
}

#[test]
fn wireguard_control_drives_plexd_wg_started_in_the_background() {
    use wireguard_control::{
        Backend, Device, DeviceUpdate, InterfaceName, Key, KeyPair, PeerConfigBuilder,
    };
    let mut lab = Lab::new('c');
    // Started the way wireguard-control and wg-quick start a userspace implementation: the
    // command returns once the daemon serves its socket.
    let out = Command::new("ip")
        .args(["netns", "exec", &lab.ns[0], PLEXD_WG, &lab.ifaces[0]])
        .output()
        .expect("run plexd-wg");
    assert!(
        out.status.success(),
        "background start failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::os::unix::net::UnixStream::connect(lab.socket(0)).is_ok());
    lab.start(1, "wireguard-go");
    let (ka, kb) = (
        SecretKey::generate().expect("key"),
        SecretKey::generate().expect("key"),
    );
    lab.configure(1, &kb, &ka);

    let iface: InterfaceName = lab.ifaces[0].parse().expect("interface name");
    let peer = PeerConfigBuilder::new(&Key(kb.public_key().0))
        .set_endpoint(format!("{UNDERLAY_B}:51820").parse().expect("endpoint"))
        .add_allowed_ip(MESH_B.parse().expect("ip"), 32);
    DeviceUpdate::new()
        .set_keypair(KeyPair::from_private(Key(*ka.bytes())))
        .set_listen_port(51820)
        .replace_peers()
        .add_peer(peer)
        .apply(&iface, Backend::Userspace)
        .expect("wireguard-control applies the configuration");
    let ns = &lab.ns[0];
    sh(&[
        "ip",
        "-n",
        ns,
        "addr",
        "add",
        &format!("{MESH_A}/24"),
        "dev",
        &lab.ifaces[0],
    ]);
    sh(&["ip", "-n", ns, "link", "set", &lab.ifaces[0], "up"]);

    let len = 256 << 10;
    let back = tcp_echo(&lab.ns[0], &lab.ns[1], MESH_B, len);
    assert_eq!(back.len(), len);

    let device = Device::get(&iface, Backend::Userspace).expect("wireguard-control reads it back");
    assert_eq!(device.listen_port, Some(51820));
    assert_eq!(device.peers.len(), 1);
    let p = &device.peers[0];
    assert_eq!(p.config.public_key, Key(kb.public_key().0));
    assert_eq!(
        p.config.endpoint,
        format!("{UNDERLAY_B}:51820").parse().ok()
    );
    assert!(p.stats.last_handshake_time.is_some(), "{p:?}");
    assert!(
        p.stats.rx_bytes > len as u64 && p.stats.tx_bytes > len as u64,
        "{p:?}"
    );
}

/// A bad value of a performance switch is refused with exit status 1 and a message naming
/// the variable and what it takes, before the interface exists.
#[test]
fn bad_switch_values_are_refused_before_the_interface_is_created() {
    let lab = Lab::new('e');
    for (var, value, says) in [
        ("PLEXD_WG_CRYPTO_WORKERS", "65", "0 (no pool) to 64"),
        ("PLEXD_WG_CRYPTO_WORKERS", "two", "0 (no pool) to 64"),
        (
            "PLEXD_WG_PROTOCOL",
            "wireguard-go",
            "use \"boringtun\" or \"plexd\"",
        ),
        ("PLEXD_WG_QUANTUM", "100", "1500 to 4194304"),
    ] {
        let out = Command::new("ip")
            .args(["netns", "exec", &lab.ns[0], PLEXD_WG, "-f", &lab.ifaces[0]])
            .env(var, value)
            .output()
            .expect("run plexd-wg");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{var}={value}: {stderr}");
        assert!(
            stderr.contains(var) && stderr.contains(says),
            "{var}={value}: {stderr}"
        );
        assert!(
            !stderr.contains("TUN interface created"),
            "{var}={value}: refused only after creating the interface: {stderr}"
        );
        let link = Command::new("ip")
            .args(["-n", &lab.ns[0], "link", "show", &lab.ifaces[0]])
            .output()
            .expect("ip link");
        assert!(
            !link.status.success(),
            "{var}={value}: the interface exists"
        );
    }
}
