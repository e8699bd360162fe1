//! The WireGuard kernel backend for real (root, qemu): this machine's kernel has no WireGuard
//! module, so the kernel side runs in a qemu guest booting Debian's kernel (tests/src/qemu.rs,
//! scripts/kernel-guest.sh), its NIC on a router's LAN of a NAT topology. These tests never
//! skip: without qemu or the kernel package they fail saying what is missing.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use plexsphere_e2e::nat::{NatMode, PUBLIC_GATEWAY, Topology, WgPeer, wg_keypair};
use plexsphere_e2e::qemu::{self, Guest};
use plexsphere_e2e::{bin, netns, wait_until};

/// One command in the guest (TCG is slow: a first `wg` or `ip` loads over 9p).
const CMD_BOUND: Duration = Duration::from_secs(30);
const BOUND: Duration = Duration::from_secs(60);
const WG_PORT: u16 = 51820;

/// Boots a guest on router `r`'s LAN with its address and default route set; `work` is shared.
fn guest_on(topo: &mut Topology, r: usize, work: &std::path::Path) -> Guest {
    let image = qemu::image().unwrap();
    let (tap, addr) = topo.add_tap(r).unwrap();
    let ns = topo.router_ns(r).unwrap().to_owned();
    let guest = Guest::boot(&image, &ns, &tap, "52:54:00:00:20:0a", work).unwrap();
    guest
        .run_ok(
            &format!(
                "ip addr add {addr}/24 dev eth0 && ip link set eth0 up && ip route add default via {}",
                topo.lan_gateway(r)
            ),
            CMD_BOUND,
        )
        .unwrap_or_else(|e| panic!("{e:#}\n--- console:\n{}", guest.console()));
    guest
}

/// The first packet the kernel backend ever carried here: the guest's kernel WireGuard
/// interface and plexd-wg on the public segment ping each other over their tunnel addresses,
/// through the guest's router (routing only), with a full 1420-byte tunnel packet (DF set)
/// inside the 1500-byte underlay.
#[test]
fn the_guest_kernel_wireguard_and_plexd_wg_ping_over_their_tunnel() {
    let dir = tempfile::tempdir().unwrap();
    let mut topo = Topology::new().unwrap();
    let r = topo.add_router(NatMode::None).unwrap();
    let host = WgPeer::start(
        &bin("plexd-wg").unwrap(),
        topo.public_ns(),
        &format!("{}h", topo.wg_iface(9, 9)),
        "10.99.0.1/24",
        WG_PORT,
        dir.path(),
    )
    .unwrap();
    let guest = guest_on(&mut topo, r, dir.path());

    let (key, public) = wg_keypair().unwrap();
    let key_file = dir.path().join("guest.key");
    std::fs::write(&key_file, key).unwrap();
    let endpoint = SocketAddr::from((PUBLIC_GATEWAY, WG_PORT));
    let setup = format!(
        "ip link add wg0 type wireguard && \
         wg set wg0 private-key {key} listen-port {WG_PORT} peer {peer} endpoint {endpoint} \
           allowed-ips 10.99.0.1/32 persistent-keepalive 1 && \
         ip addr add 10.99.0.2/24 dev wg0 && ip link set wg0 up && ip -d link show wg0",
        key = key_file.display(),
        peer = host.public_key,
    );
    let link = guest
        .run_ok(&setup, CMD_BOUND)
        .unwrap_or_else(|e| panic!("{e:#}\n--- console:\n{}", guest.console()));
    assert!(
        link.contains("wireguard"),
        "a kernel WireGuard link: {link}"
    );
    host.set_peer(&public, None, "10.99.0.2/32", None).unwrap();

    // The guest's pings over the tunnel (the first ones also complete the handshake).
    wait_until(BOUND, "the guest pings plexd-wg over the tunnel", || {
        Ok((guest.run("ping -c 1 -W 1 10.99.0.1", CMD_BOUND)?.rc == 0).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n--- plexd-wg:\n{}", host.proc.output()));
    let ping = |args: &[&str]| netns::exec(topo.public_ns(), "ping", args).unwrap();
    assert!(ping(&["-c", "2", "-W", "2", "10.99.0.2"]).status.success());
    // 1392 bytes of ICMP payload + 28 of headers = 1420, the tunnel MTU, with DF.
    let full = ping(&["-c", "2", "-W", "2", "-M", "do", "-s", "1392", "10.99.0.2"]);
    assert!(
        full.status.success(),
        "a full-MTU packet crosses: {}",
        String::from_utf8_lossy(&full.stdout)
    );
    let shown = guest
        .run_ok(
            "wg show wg0 latest-handshakes; wg show wg0 transfer",
            CMD_BOUND,
        )
        .unwrap();
    let received: u64 = shown
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .last()
        .unwrap_or(0);
    assert!(received > 0, "the kernel counted received bytes: {shown}");
    // plexd-wg roamed to the guest's address (routing only: no translation).
    let seen = host.endpoint().unwrap().unwrap();
    assert_eq!(
        seen.ip(),
        std::net::IpAddr::V4(topo.node_addr(r, 0)),
        "{seen}"
    );
}
