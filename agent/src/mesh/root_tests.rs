//! Backends against the real kernel, each in a fresh network namespace of its own thread
//! (root; `unshare(CLONE_NEWNET)` acts on the calling thread, and the threads the backends
//! start inherit it). Interface names carry the pid, because UAPI sockets in
//! /var/run/wireguard are shared by every namespace.

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use nix::sched::{CloneFlags, unshare};
use plexsphere_wire::node::PeerSpec;

use super::link::setup_link;
use super::*;
use crate::config::WireguardConfig;

fn in_fresh_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET) needs root");
        f()
    })
    .join()
    .expect("the namespace thread panicked")
}

fn cfg(backend: Backend, tag: &str) -> WireguardConfig {
    WireguardConfig {
        backend,
        interface: format!("pxt{tag}{}", std::process::id() % 100_000),
        listen_port: 0,
        ..WireguardConfig::default()
    }
}

/// The IPv4 addresses of a link (the kernel adds an IPv6 link-local one by itself).
fn v4(index: u32) -> Vec<(std::net::IpAddr, u8)> {
    let mut a = netlink::addresses(index).unwrap();
    a.retain(|(ip, _)| ip.is_ipv4());
    a
}

fn node() -> NodeSetup {
    NodeSetup::new([0x41; 32], "10.77.0.2".parse().unwrap(), 16)
}

fn peer(n: u8) -> PeerSpec {
    PeerSpec {
        node_id: uuid::Uuid::from_u128(u128::from(n)),
        hostname: format!("peer-{n}"),
        public_key: STANDARD.encode([n; 32]),
        mesh_ip: format!("10.77.0.{n}").parse().unwrap(),
        allowed_ips: vec![format!("10.77.0.{n}/32").parse().unwrap()],
        endpoints: vec![format!("192.0.2.{n}:51820").parse().unwrap()],
        persistent_keepalive_secs: Some(25),
        home_relay: None,
        dns_name: None,
    }
}

#[test]
fn kernel_backend_names_a_missing_module_and_auto_falls_back() {
    let module = std::path::Path::new("/sys/module/wireguard").exists();
    let (kernel, auto_backend, link_after_auto) = in_fresh_netns(|| {
        let c = cfg(Backend::Kernel, "k");
        let kernel = open(&c, &node()).map(|m| m.backend());
        let auto = cfg(Backend::Auto, "k");
        let mut m = open(&auto, &node()).unwrap();
        let backend = m.backend();
        let link = netlink::link(&auto.interface).unwrap();
        m.teardown().unwrap();
        (kernel, backend, link)
    });
    let link = link_after_auto.expect("auto set up an interface");
    assert_eq!(link.mtu, Some(1420));
    assert!(link.up);
    if module {
        assert_eq!(kernel, Ok("kernel"));
        assert_eq!(auto_backend, "kernel");
        assert_eq!(link.kind.as_deref(), Some("wireguard"));
    } else {
        let e = kernel.unwrap_err();
        assert!(e.is_config(), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("the wireguard kernel module is missing")
                && text.contains("RTM_NEWLINK kind wireguard")
                && text.contains("wireguard.backend: auto"),
            "{text}"
        );
        assert_eq!(auto_backend, "userspace");
        assert_eq!(link.kind.as_deref(), Some("tun"));
    }
}

#[test]
fn userspace_backend_configures_peers_and_the_interface_and_tears_down() {
    let c = cfg(Backend::Userspace, "u");
    let iface = c.interface.clone();
    let (first, second, live, addrs, link_before, link_after, socket_left) =
        in_fresh_netns(move || {
            let mut m = open(&c, &node()).unwrap();
            let first = m
                .apply(std::sync::Arc::new(vec![peer(3), peer(4)]))
                .unwrap();
            let mut moved = peer(4);
            moved.allowed_ips.push("10.99.0.0/16".parse().unwrap());
            let second = m.apply(std::sync::Arc::new(vec![moved])).unwrap();
            let live = m.live_peers().unwrap();
            let link = netlink::link(&c.interface).unwrap().unwrap();
            let addrs = v4(link.index);
            m.teardown().unwrap();
            let after = netlink::link(&c.interface).unwrap();
            let socket = plexd_dataplane::uapi_server::socket_path(&c.interface);
            // The socket file goes with the listener; bounded wait for the runner's cleanup.
            let deadline = Instant::now() + Duration::from_secs(5);
            while socket.exists() && Instant::now() < deadline {
                std::thread::yield_now();
            }
            (
                first,
                second,
                live,
                addrs,
                Some(link),
                after,
                socket.exists(),
            )
        });
    assert_eq!(first.len(), 2);
    assert_eq!(second.len(), 2, "one removed, one updated: {second:?}");
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].public_key, peer(4).public_key);
    assert_eq!(live[0].endpoint, peer(4).endpoints.first().copied());
    assert_eq!(addrs, vec![("10.77.0.2".parse().unwrap(), 16)]);
    let l = link_before.unwrap();
    assert_eq!(
        (l.mtu, l.up, l.kind.as_deref()),
        (Some(1420), true, Some("tun"))
    );
    assert_eq!(link_after, None, "{iface} removed by teardown");
    assert!(!socket_left, "the UAPI socket of {iface} is removed");
}

#[test]
fn adopting_an_interface_replaces_an_old_mesh_address() {
    let (before, after) = in_fresh_netns(|| {
        let c = cfg(Backend::Userspace, "a");
        let mut m = open(&c, &node()).unwrap();
        let idx = netlink::link(&c.interface).unwrap().unwrap().index;
        netlink::set_address(idx, "10.88.0.9".parse().unwrap(), 24).unwrap();
        let before = v4(idx);
        setup_link(&c, &node()).unwrap();
        let after = v4(idx);
        m.teardown().unwrap();
        (before, after)
    });
    // set_address keeps one address per family: the old mesh IP replaced ours here.
    assert_eq!(before, vec![("10.88.0.9".parse().unwrap(), 24)]);
    assert_eq!(after, vec![("10.77.0.2".parse().unwrap(), 16)]);
}
