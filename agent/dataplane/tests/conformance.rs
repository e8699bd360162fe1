//! Root: plexd-wg behaves like WireGuard where WireGuard specifies it, tried against Debian's
//! `wireguard-go` in two network namespaces (scenarios after the kernel's netns.sh): replies
//! from the address the peer sent to (sticky source, IPv4 and IPv6), falling over to a new
//! source address when one is removed, roaming, the allowed-IPs source filter, a 34 KB MTU,
//! and a `wg setconf` of 130k allowed IPs answered whole over UAPI; each traffic scenario also
//! with plexd-wg's crypto pool.
//!
//! Needs root, `ip`, `wg`, `ping` and `wireguard-go`; fails (never skips) without them. Names
//! carry the prefix `cf` and the test's pid; everything is removed on drop.

mod cf;

use cf::*;

/// The scenarios that carry traffic run twice: plexd-wg as it is by default, and with its
/// ordered crypto pool (`_with_the_crypto_pool`), whose packets take another path.
fn tag(base: &str, pool: bool) -> String {
    if pool {
        format!("{base}p")
    } else {
        base.to_string()
    }
}

#[test]
fn replies_leave_from_the_address_the_peer_sent_to() {
    replies_leave_from_the_address_the_peer_sent_to_case(false);
}

#[test]
fn replies_leave_from_the_address_the_peer_sent_to_with_the_crypto_pool() {
    replies_leave_from_the_address_the_peer_sent_to_case(true);
}

#[test]
fn the_source_falls_over_to_a_new_address_when_the_old_one_is_removed() {
    the_source_falls_over_to_a_new_address_when_the_old_one_is_removed_case(false);
}

#[test]
fn the_source_falls_over_to_a_new_address_when_the_old_one_is_removed_with_the_crypto_pool() {
    the_source_falls_over_to_a_new_address_when_the_old_one_is_removed_case(true);
}

#[test]
fn the_endpoint_roams_to_where_an_authenticated_packet_came_from() {
    the_endpoint_roams_to_where_an_authenticated_packet_came_from_case(false);
}

#[test]
fn the_endpoint_roams_to_where_an_authenticated_packet_came_from_with_the_crypto_pool() {
    the_endpoint_roams_to_where_an_authenticated_packet_came_from_case(true);
}

#[test]
fn a_source_outside_the_peers_allowed_ips_is_dropped() {
    a_source_outside_the_peers_allowed_ips_is_dropped_case(false);
}

#[test]
fn a_source_outside_the_peers_allowed_ips_is_dropped_with_the_crypto_pool() {
    a_source_outside_the_peers_allowed_ips_is_dropped_case(true);
}

#[test]
fn a_34_kb_mtu_carries_a_large_ping() {
    a_34_kb_mtu_carries_a_large_ping_case(false);
}

#[test]
fn a_34_kb_mtu_carries_a_large_ping_with_the_crypto_pool() {
    a_34_kb_mtu_carries_a_large_ping_case(true);
}

#[test]
fn persistent_keepalive_keeps_a_nat_mapping_alive() {
    persistent_keepalive_keeps_a_nat_mapping_alive_case(false);
}

#[test]
fn persistent_keepalive_keeps_a_nat_mapping_alive_with_the_crypto_pool() {
    persistent_keepalive_keeps_a_nat_mapping_alive_case(true);
}

/// A peer's interface with two addresses of each family; the other side sets its endpoint
/// to each in turn and pings: plexd-wg must answer from the address it was sent to, or the
/// peer roams to an address it never chose (its `wg show endpoints` changes).
fn replies_leave_from_the_address_the_peer_sent_to_case(pool: bool) {
    let mut net = Net::new(&tag("rs", pool));
    net.with_pool(pool);
    for addr in [
        "10.0.0.1/24",
        "10.0.0.2/24",
        "fd00:aa::1/64",
        "fd00:aa::2/64",
    ] {
        net.add_addr(0, addr);
    }
    net.add_addr(1, "10.0.0.3/24");
    net.add_addr(1, "fd00:aa::3/64");
    net.start(0, PLEXD_WG, None);
    net.start(1, "wireguard-go", None);
    for endpoint in [
        "10.0.0.1:1",
        "[fd00:aa::1]:1",
        "10.0.0.2:1",
        "[fd00:aa::2]:1",
        "10.0.0.1:1",
        "[fd00:aa::1]:1",
    ] {
        net.set_peer(1, &["endpoint", endpoint]);
        assert!(
            net.ping(1, 56, 5),
            "no ping answer through {endpoint}; logs:\n{}",
            net.logs()
        );
        assert_eq!(
            net.endpoint(1),
            endpoint,
            "the reply came from another address than the one the peer sent to"
        );
    }
}

/// plexd-wg's source address for the peer is removed (another one on the link stays): its
/// next packets leave from the remaining address instead of failing, IPv4 and IPv6.
fn the_source_falls_over_to_a_new_address_when_the_old_one_is_removed_case(pool: bool) {
    let mut net = Net::new(&tag("fo", pool));
    net.with_pool(pool);
    net.exec(
        0,
        &[
            "sysctl",
            "-qw",
            &format!("net.ipv4.conf.{}.promote_secondaries=1", net.veth[0]),
        ],
    );
    for addr in ["10.0.0.1/24", "fd00:aa::1/64"] {
        net.add_addr(0, addr);
    }
    net.add_addr(1, "10.0.0.2/24");
    net.add_addr(1, "fd00:aa::2/64");
    net.start(0, PLEXD_WG, None);
    net.start(1, "wireguard-go", None);
    for (endpoint, old, new, seen) in [
        ("10.0.0.2:2", "10.0.0.1/24", "10.0.0.10/24", "10.0.0.10:1"),
        (
            "[fd00:aa::2]:2",
            "fd00:aa::1/64",
            "fd00:aa::10/64",
            "[fd00:aa::10]:1",
        ),
    ] {
        net.set_peer(0, &["endpoint", endpoint]);
        assert!(
            net.ping(0, 56, 5),
            "first ping to {endpoint}; {}",
            net.logs()
        );
        net.add_addr(0, new);
        net.del_addr(0, old);
        assert!(
            net.ping(0, 56, 5),
            "no ping answer after {old} was replaced by {new}; logs:\n{}",
            net.logs()
        );
        assert_eq!(
            net.endpoint(1),
            seen,
            "the peer sees the new source address"
        );
    }
}

/// An authenticated packet from a new address moves the endpoint there (the peer changed
/// its port); the reply follows it.
fn the_endpoint_roams_to_where_an_authenticated_packet_came_from_case(pool: bool) {
    let mut net = Net::new(&tag("ro", pool));
    net.with_pool(pool);
    net.add_addr(0, "10.0.0.1/24");
    net.add_addr(1, "10.0.0.2/24");
    net.start(0, PLEXD_WG, None);
    net.start(1, "wireguard-go", None);
    net.set_peer(0, &["endpoint", "10.0.0.2:2"]);
    net.set_peer(1, &["endpoint", "10.0.0.1:1"]);
    assert!(net.ping(0, 56, 5), "first ping; {}", net.logs());
    assert_eq!(net.endpoint(0), "10.0.0.2:2");
    let iface = net.wg[1].clone();
    net.wg_cmd(1, &["set", &iface, "listen-port", "3"]);
    assert!(net.ping(1, 56, 5), "ping from the new port; {}", net.logs());
    assert_eq!(net.endpoint(0), "10.0.0.2:3", "plexd-wg followed the peer");
    assert!(
        net.ping(0, 56, 5),
        "ping to the roamed endpoint; {}",
        net.logs()
    );
}

/// A packet whose inner source is outside the sending peer's allowed IPs is dropped; once
/// the address is allowed, the same ping passes.
fn a_source_outside_the_peers_allowed_ips_is_dropped_case(pool: bool) {
    let mut net = Net::new(&tag("ai", pool));
    net.with_pool(pool);
    net.add_addr(0, "10.0.0.1/24");
    net.add_addr(1, "10.0.0.2/24");
    net.start(0, PLEXD_WG, None);
    net.start(1, "wireguard-go", None);
    net.set_peer(1, &["endpoint", "10.0.0.1:1"]);
    assert!(
        net.ping(1, 56, 5),
        "the allowed source passes; {}",
        net.logs()
    );
    let iface = net.wg[1].clone();
    net.ip(1, &["addr", "add", "192.168.241.9/24", "dev", &iface]);
    let from_other = |net: &Net| {
        net.exec(
            1,
            &["ping", "-c", "2", "-W", "1", "-I", "192.168.241.9", MESH[0]],
        )
        .0
    };
    assert!(
        !from_other(&net),
        "plexd-wg delivered a packet from 192.168.241.9, outside the peer's allowed IPs"
    );
    net.set_peer(
        0,
        &["allowed-ips", &format!("{}/32,192.168.241.9/32", MESH[1])],
    );
    assert!(from_other(&net), "once allowed, the source passes");
}

/// A 34 KB tunnel MTU over a 64 KiB veth: a ping of 33 000 bytes crosses unfragmented both
/// ways.
fn a_34_kb_mtu_carries_a_large_ping_case(pool: bool) {
    let mut net = Net::new(&tag("mt", pool));
    net.with_pool(pool);
    for side in 0..2 {
        let veth = net.veth[side].clone();
        net.ip(side, &["link", "set", &veth, "mtu", "65535"]);
    }
    net.add_addr(0, "10.0.0.1/24");
    net.add_addr(1, "10.0.0.2/24");
    net.start(0, PLEXD_WG, Some(34_000));
    net.start(1, "wireguard-go", Some(34_000));
    net.set_peer(0, &["endpoint", "10.0.0.2:2"]);
    assert!(
        net.ping(0, 33_000, 5),
        "a 33 000-byte ping from plexd-wg; {}",
        net.logs()
    );
    assert!(
        net.ping(1, 33_000, 5),
        "a 33 000-byte ping to plexd-wg; {}",
        net.logs()
    );
}

/// How many allowed IPs the large `wg setconf` gives one peer (the kernel's netns.sh goes
/// to about this many).
const LARGE_ALLOWED_IPS: usize = 130_000;
/// plexd-wg's peak resident memory after taking and answering them stays under this.
const LARGE_SETCONF_MAX_RSS_KIB: u64 = 256 << 10;

/// `wg setconf` with 130k allowed IPs on one peer (IPv4 and IPv6): `wg show` answers every
/// one of them, a smaller replacement shrinks the list exactly, within a memory bound.
#[test]
fn a_setconf_of_130k_allowed_ips_is_answered_whole_over_uapi() {
    let mut net = Net::new("la");
    net.start(0, PLEXD_WG, None);
    let nets: Vec<String> = (0..LARGE_ALLOWED_IPS)
        .map(|i| {
            if i % 4 == 3 {
                format!("fd00:{:x}:{:x}::/64", i >> 16, i & 0xffff)
            } else {
                format!("10.{}.{}.{}/32", i >> 16, (i >> 8) & 255, i & 255)
            }
        })
        .collect();
    let setconf = |nets: &[String]| {
        let mut conf = format!(
            "[Interface]\nPrivateKey = {}\nListenPort = 1\n\n[Peer]\nPublicKey = {}\n",
            net.private(0),
            net.public(1)
        );
        for chunk in nets.chunks(1000) {
            conf.push_str(&format!("AllowedIPs = {}\n", chunk.join(",")));
        }
        let file = net.dir().join("large.conf");
        std::fs::write(&file, conf).expect("write the config");
        let iface = net.wg[0].clone();
        net.wg_cmd(0, &["setconf", &iface, file.to_str().expect("utf-8 path")]);
    };
    let shown = || {
        let iface = net.wg[0].clone();
        let out = net.wg_cmd(0, &["show", &iface, "allowed-ips"]);
        let mut got: Vec<String> = out.split_whitespace().skip(1).map(str::to_owned).collect();
        got.sort();
        got
    };
    setconf(&nets);
    let mut want = nets.clone();
    want.sort();
    let got = shown();
    assert_eq!(
        got.len(),
        LARGE_ALLOWED_IPS,
        "wg show lists every allowed IP"
    );
    assert!(got == want, "wg show lists exactly the allowed IPs set");

    let half = &nets[..LARGE_ALLOWED_IPS / 2];
    setconf(half);
    let mut want = half.to_vec();
    want.sort();
    assert!(
        shown() == want,
        "setconf replaced the list with the smaller one"
    );

    let status = std::fs::read_to_string(format!("/proc/{}/status", net.pid(0))).expect("status");
    let hwm: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    eprintln!("plexd-wg peak RSS with {LARGE_ALLOWED_IPS} allowed IPs: {hwm} KiB");
    assert!(
        hwm < LARGE_SETCONF_MAX_RSS_KIB,
        "plexd-wg peaked at {hwm} KiB for {LARGE_ALLOWED_IPS} allowed IPs"
    );
}

/// UDP conntrack entries of the NAT in front of side a expire after this many seconds.
const NAT_TIMEOUT_SECS: u32 = 2;

/// plexd-wg behind a NAT whose UDP mappings expire after 2 s: without persistent keepalive
/// the peer cannot reach it once the mapping expired; with a 1 s keepalive it still can.
fn persistent_keepalive_keeps_a_nat_mapping_alive_case(pool: bool) {
    let mut net = Net::behind_nat(&tag("nt", pool), NAT_TIMEOUT_SECS);
    net.with_pool(pool);
    net.start(0, PLEXD_WG, None);
    net.start(1, "wireguard-go", None);
    net.set_peer(0, &["endpoint", "10.0.2.2:2"]);
    // Longer than the mapping lives, with nothing sent meanwhile (waiting is the scenario).
    let expire = || {
        std::thread::sleep(std::time::Duration::from_secs(
            u64::from(NAT_TIMEOUT_SECS) * 2,
        ))
    };

    assert!(
        net.ping(0, 56, 5),
        "a reaches b through the NAT; {}",
        net.logs()
    );
    assert_eq!(
        net.endpoint(1),
        "10.0.2.254:1",
        "b sees a as the router's address"
    );
    expire();
    assert!(
        !net.ping(1, 56, 1),
        "without keepalive the mapping should have expired (the NAT timeout did not apply)"
    );

    net.set_peer(0, &["persistent-keepalive", "1"]);
    assert!(net.ping(0, 56, 5), "a reaches b again; {}", net.logs());
    expire();
    assert!(
        net.ping(1, 56, 1),
        "the keepalives kept the mapping: b reaches a after {} s; {}",
        NAT_TIMEOUT_SECS * 2,
        net.logs()
    );
}
