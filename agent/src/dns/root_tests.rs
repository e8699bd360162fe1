//! The resolver's listeners against the real kernel and a real client (`dig`), in a fresh
//! network namespace (root): bound before the address exists, UDP and TCP, only this host's
//! sources, the TCP connection limit.

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, unshare};
use plexsphere_wire::node::PeerSpec;
use plexsphere_wire::routes::DnsState;

use super::limit::Discard;
use super::server::{self, Shared};
use super::zone::{Zone, ZoneInput};

fn in_fresh_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET) needs root");
        f()
    })
    .join()
    .expect("the namespace thread panicked")
}

fn ip(args: &str) {
    let out = Command::new("ip")
        .args(args.split(' '))
        .output()
        .expect("ip runs");
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn dig(args: &[&str]) -> String {
    let out = Command::new("dig")
        .args(["+time=2", "+tries=1"])
        .args(args)
        .output()
        .expect("dig runs (Debian dnsutils)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn zone() -> Zone {
    let peer = |n: u8, name: &str| PeerSpec {
        node_id: uuid::Uuid::from_u128(u128::from(n)),
        hostname: name.to_owned(),
        public_key: String::new(),
        mesh_ip: format!("10.64.0.{n}").parse().expect("ip"),
        allowed_ips: vec![],
        endpoints: vec![],
        persistent_keepalive_secs: None,
        home_relay: None,
        dns_name: Some(name.to_owned()),
    };
    let dns = DnsState {
        suffix: "mesh.internal".to_owned(),
        name: "self".to_owned(),
    };
    Zone::build(ZoneInput {
        dns: Some(&dns),
        own_addrs: &["10.64.0.1".parse().expect("ip")],
        mesh: "10.64.0.0/16".parse().expect("net"),
        peers: &[peer(2, "web"), peer(3, "db")],
        view: None,
    })
    .expect("zone")
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < until, "{what} within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn dig_gets_answers_over_udp_and_tcp_and_strangers_get_nothing() {
    in_fresh_netns(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        ip("link set lo up");
        // Bound before the interface has its address (IP_FREEBIND), as at plexd's start.
        let mesh: IpAddr = "10.64.0.1".parse().expect("ip");
        let shared = Shared::new(vec![mesh]);
        let _tasks = rt.block_on(async {
            let (udp, tcp) = server::bind(SocketAddr::new(mesh, 53)).expect("bind");
            server::spawn(shared.clone(), udp, tcp)
        });
        shared.set_zone(Some(Arc::new(zone())));
        ip("link add pxdns0 type veth peer name pxdns1");
        ip("link set pxdns1 up");
        ip("addr add 10.64.0.1/16 dev pxdns0");
        ip("addr add 192.0.2.9/24 dev pxdns0");
        ip("link set pxdns0 up");

        let a = dig(&["@10.64.0.1", "web.mesh.internal", "A", "+short"]);
        assert_eq!(a.trim(), "10.64.0.2");
        let a = dig(&["@10.64.0.1", "+tcp", "DB.Mesh.Internal", "A", "+short"]);
        assert_eq!(a.trim(), "10.64.0.3", "over TCP");
        let ptr = dig(&["@10.64.0.1", "-x", "10.64.0.2", "+short"]);
        assert_eq!(ptr.trim(), "web.mesh.internal.");
        let nx = dig(&["@10.64.0.1", "nobody.mesh.internal", "A"]);
        assert!(nx.contains("status: NXDOMAIN"), "{nx}");
        let refused = dig(&["@10.64.0.1", "example.com", "A"]);
        assert!(refused.contains("status: REFUSED"), "{refused}");
        assert!(
            !refused.contains(" ra"),
            "never recursion available: {refused}"
        );
        let tcp_refused = dig(&["@10.64.0.1", "+tcp", "example.com", "A"]);
        assert!(tcp_refused.contains("status: REFUSED"), "{tcp_refused}");

        // A source that is not this node's mesh address or loopback gets no answer at all.
        let before = shared.dropped(Discard::Foreign);
        let stranger = dig(&["@10.64.0.1", "-b", "192.0.2.9", "web.mesh.internal", "A"]);
        assert!(!stranger.contains("status:"), "{stranger}");
        wait_for("the stranger's query counted", || {
            shared.dropped(Discard::Foreign) > before
        });
        let stranger = dig(&["@10.64.0.1", "-b", "192.0.2.9", "+tcp", "web.mesh.internal"]);
        assert!(!stranger.contains("status:"), "{stranger}");

        // The TCP connection limit: the connections past it are closed at once, counted.
        let held: Vec<std::net::TcpStream> = (0..super::MAX_TCP_CONNECTIONS)
            .map(|_| std::net::TcpStream::connect("10.64.0.1:53").expect("connect"))
            .collect();
        wait_for("the held connections accepted", || {
            let extra = std::net::TcpStream::connect("10.64.0.1:53").expect("connect");
            drop(extra);
            shared.dropped(Discard::Connections) > 0
        });
        drop(held);
        // With the held ones gone, TCP answers again.
        wait_for("TCP answers again", || {
            dig(&["@10.64.0.1", "+tcp", "web.mesh.internal", "+short"]).trim() == "10.64.0.2"
        });
        rt.shutdown_background();
    });
}
