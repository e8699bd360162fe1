//! The host side against the real kernel (root), in a fresh network namespace of its own
//! thread: routes, the exit's rules, forwarding and the nat table go in as planned and come
//! out byte for byte (`ip rule`, `ip route show table all`, `nft list ruleset`, the sysctls).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;

use ipnet::IpNet;
use nix::sched::{CloneFlags, unshare};
use plexsphere_wire::node::PeerSpec;
use plexsphere_wire::routes::{RouterRole, ServedRoute};

use super::host::Host;
use super::plan::{self, EXIT_TABLE};
use super::router::FORWARDING;
use crate::config::routes::RoutesConfig;

fn in_fresh_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET) needs root");
        f()
    })
    .join()
    .expect("the namespace thread panicked")
}

fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Everything routes may touch, as text.
fn snapshot() -> String {
    let mut s = String::new();
    for args in [
        &["ip", "rule", "show"][..],
        &["ip", "-6", "rule", "show"],
        &["ip", "route", "show", "table", "all"],
        &["ip", "-6", "route", "show", "table", "all"],
        &["nft", "list", "ruleset"],
    ] {
        s.push_str(&sh(args));
    }
    for f in FORWARDING.iter().chain([&super::router::SRC_VALID_MARK]) {
        s.push_str(&std::fs::read_to_string(f).unwrap_or_default());
    }
    s
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn peer(n: u8, name: &str, allowed: &[&str]) -> PeerSpec {
    PeerSpec {
        node_id: uuid::Uuid::from_u128(u128::from(n)),
        hostname: name.into(),
        public_key: String::new(),
        mesh_ip: format!("10.77.0.{n}").parse().unwrap(),
        allowed_ips: allowed.iter().map(|s| net(s)).collect(),
        endpoints: vec![],
        persistent_keepalive_secs: None,
        home_relay: None,
        dns_name: Some(name.into()),
    }
}

fn lab() {
    for cmd in [
        "ip link set lo up",
        "ip link add pxr0 type veth peer name pxr0p",
        "ip addr add 10.77.0.2/16 dev pxr0",
        "ip link set pxr0 up",
        "ip link set pxr0p up",
        "ip link add eth0 type veth peer name eth0p",
        "ip addr add 192.0.2.2/24 dev eth0",
        "ip link set eth0 up",
        "ip link set eth0p up",
        "ip route add default via 192.0.2.1",
    ] {
        sh(&cmd.split(' ').collect::<Vec<_>>());
    }
}

#[test]
fn routes_the_exit_and_the_router_come_out_byte_for_byte() {
    in_fresh_netns(|| {
        lab();
        let before = snapshot();
        // The sysctls as this namespace started with them (a new namespace copies the host's
        // forwarding setting, which a host that routes for its guests has on).
        let sysctls_before: Vec<String> = FORWARDING
            .iter()
            .chain([&super::router::SRC_VALID_MARK])
            .map(|f| std::fs::read_to_string(f).unwrap())
            .collect();
        let mesh = net("10.77.0.0/16");
        let peers = [
            peer(3, "r", &["10.77.0.3/32", "10.1.0.0/24", "fd12:3456::/48"]),
            peer(
                4,
                "e",
                &[
                    "10.77.0.4/32",
                    "0.0.0.0/5",
                    "11.0.0.0/8",
                    "128.0.0.0/1",
                    "::/1",
                ],
            ),
        ];
        let served = [ServedRoute {
            cidr: net("10.9.0.0/24"),
            role: RouterRole::Primary,
        }];
        // The control plane, reached through the default route (not on the LAN).
        let exempt: BTreeSet<IpAddr> = ["203.0.113.9".parse().unwrap()].into();
        let mut host = Host::start("pxr0", mesh, vec![51820]);
        assert_eq!(snapshot(), before, "starting changes nothing");

        let with_exit = plan::plan(&peers, mesh, &uses("e"), &served);
        assert_eq!(host.apply(&with_exit, &exempt), Vec::<String>::new());
        let main = sh(&["ip", "route", "show"]);
        assert!(
            main.contains("10.1.0.0/24 dev pxr0 proto 112 scope link"),
            "{main}"
        );
        let v6 = sh(&["ip", "-6", "route", "show"]);
        assert!(v6.contains("fd12:3456::/48 dev pxr0 proto 112"), "{v6}");
        let t = sh(&["ip", "route", "show", "table", &EXIT_TABLE.to_string()]);
        assert!(t.contains("0.0.0.0/5 dev pxr0 proto 112"), "{t}");
        assert!(t.contains("11.0.0.0/8 dev pxr0 proto 112"), "{t}");
        let rules = sh(&["ip", "rule", "show"]);
        for want in [
            "5200:\tfrom all to 203.0.113.9 lookup main",
            "5210:\tfrom all lookup main suppress_prefixlength 0",
            "5220:\tnot from all fwmark 0x706c lookup 28780",
        ] {
            assert!(rules.contains(want), "{want:?} in\n{rules}");
        }
        assert!(
            sh(&["ip", "-6", "rule", "show"]).contains("not from all fwmark 0x706c lookup 28780")
        );
        assert_eq!(std::fs::read_to_string(FORWARDING[0]).unwrap().trim(), "1");
        let nat = sh(&["nft", "list", "table", "inet", "plexd_pxr0_nat"]);
        assert!(nat.contains("oifname != \"pxr0\" masquerade"), "{nat}");
        assert!(
            nat.contains("udp sport 51820 meta mark set 0x0000706c"),
            "{nat}"
        );
        // The kernel takes the exit's path for the internet, not for the LAN or the mesh.
        let get = |dst: &str| sh(&["ip", "route", "get", dst]);
        assert!(get("1.1.1.1").contains("dev pxr0"), "{}", get("1.1.1.1"));
        let cp = get("203.0.113.9");
        assert!(
            cp.contains("via 192.0.2.1 dev eth0"),
            "the control plane stays off: {cp}"
        );
        assert!(
            get("203.0.113.10").contains("dev pxr0"),
            "its neighbour does not"
        );
        assert!(get("192.0.2.77").contains("dev eth0"));
        assert!(get("10.77.0.4").contains("dev pxr0"));
        let marked = sh(&["ip", "route", "get", "1.1.1.1", "mark", "0x706c"]);
        assert!(marked.contains("via 192.0.2.1 dev eth0"), "{marked}");

        // The exit turned off: its rules and table go, the subnet routes stay.
        let no_exit = plan::plan(&peers, mesh, &RoutesConfig::default(), &served);
        assert_eq!(host.apply(&no_exit, &exempt), Vec::<String>::new());
        assert!(!sh(&["ip", "rule", "show"]).contains("28780"));
        assert_eq!(
            sh(&["ip", "route", "show", "table", &EXIT_TABLE.to_string()]),
            ""
        );
        assert!(sh(&["ip", "route", "show"]).contains("10.1.0.0/24 dev pxr0"));

        // A crash leaves everything; the next start removes what plexd had added.
        let mut again = plan::plan(&peers, mesh, &uses("e"), &served);
        again.snat = false;
        assert_eq!(host.apply(&again, &exempt), Vec::<String>::new());
        std::mem::forget(host);
        // (forwarding stays on after a crash: the values found are only in memory.)
        for (f, v) in FORWARDING
            .iter()
            .chain([&super::router::SRC_VALID_MARK])
            .zip(&sysctls_before)
        {
            std::fs::write(f, v).unwrap();
        }
        let mut host = Host::start("pxr0", mesh, vec![51820]);
        assert_eq!(
            snapshot(),
            before,
            "a start removes a crashed run's leftovers"
        );

        // And a clean stop removes everything and puts the sysctls back.
        assert_eq!(host.apply(&with_exit, &exempt), Vec::<String>::new());
        assert_ne!(snapshot(), before);
        assert_eq!(host.clear(), Vec::<String>::new());
        assert_eq!(snapshot(), before, "stop: byte for byte");
    });
}

/// `routes:` with `use_exit: <exit>`.
fn uses(exit: &str) -> RoutesConfig {
    RoutesConfig {
        use_exit: Some(exit.to_owned()),
        ..RoutesConfig::default()
    }
}
