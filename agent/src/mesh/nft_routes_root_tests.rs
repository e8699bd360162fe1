//! The routed-traffic rules against real forwarded traffic (root): namespaces A (a client,
//! 10.99.0.1) and B (its router, 10.99.0.2) joined by the "mesh" veth, and H (10.1.0.50)
//! in B's LAN 10.1.0.0/24 behind a second veth, with no plexd. B forwards (no NAT; H routes
//! the mesh range back through B, as with `routes.snat: false`). The route grant: tcp 5432
//! and icmp.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;

use plexsphere_policy::view::{NodeView, RouteGrant};

use super::nft::{self, Installed};
use super::nft_root_tests::{A, B, DROPPED_AFTER, Lab, ip, sh};
use super::nft_tests::{grant, peer, view};

const H: &str = "10.1.0.50";

struct Lan {
    lab: Lab,
    h: String,
}

impl Drop for Lan {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.h]).status();
    }
}

fn lan(tag: &str) -> Lan {
    let lab = Lab::new(tag);
    let id = std::process::id() % 100_000;
    let h = format!("pk{tag}h{id}");
    sh(&["ip", "netns", "add", &h]);
    let link = format!("pkl{tag}{id}");
    ip(
        &lab.b,
        &format!("link add {link} type veth peer name {link}h netns {h}"),
    );
    ip(&lab.b, &format!("addr add 10.1.0.1/24 dev {link}"));
    ip(&h, &format!("addr add {H}/24 dev {link}h"));
    ip(&lab.b, &format!("link set {link} up"));
    ip(&h, &format!("link set {link}h up"));
    ip(&h, "link set lo up");
    ip(&h, "route add 10.99.0.0/24 via 10.1.0.1");
    ip(&lab.a, &format!("route add 10.1.0.0/24 via {B}"));
    sh(&[
        "ip",
        "netns",
        "exec",
        &lab.b,
        "sysctl",
        "-qw",
        "net.ipv4.ip_forward=1",
    ]);
    Lan { lab, h }
}

fn route(granted: bool) -> Vec<RouteGrant> {
    if granted {
        vec![RouteGrant {
            prefix: "10.1.0.0/24".parse().unwrap(),
            grant: 0,
        }]
    } else {
        Vec::new()
    }
}

/// The router's view: client A may open tcp 5432 and icmp in 10.1.0.0/24 (or nothing).
fn router_view(granted: bool) -> NodeView {
    let mut a = peer(1, &[A], None, None);
    a.routes_in = route(granted);
    view(
        &[B],
        vec![grant(&[(5432, 5432)], &[], true, false)],
        vec![a],
    )
}

/// The client's view: it may open tcp 5432 and icmp through B.
fn client_view() -> NodeView {
    let mut b = peer(2, &[B], None, None);
    b.routes_out = route(true);
    view(
        &[A],
        vec![grant(&[(5432, 5432)], &[], true, false)],
        vec![b],
    )
}

fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    Lab::run(ns, f)
}

fn connects_from(ns: &str, to: &str, port: u16) -> bool {
    let at = SocketAddr::new(to.parse().unwrap(), port);
    in_ns(ns, move || {
        TcpStream::connect_timeout(&at, DROPPED_AFTER).is_ok()
    })
}

fn pings_from(ns: &str, to: &str) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ping", "-c1", "-W1", to])
        .output()
        .unwrap()
        .status
        .success()
}

fn listeners(l: &Lan) -> Vec<TcpListener> {
    let bind = |ns: &str, at: &str| {
        let at: SocketAddr = at.parse().unwrap();
        in_ns(ns, move || TcpListener::bind(at).unwrap())
    };
    vec![
        bind(&l.h, "10.1.0.50:5432"),
        bind(&l.h, "10.1.0.50:22"),
        bind(&l.lab.a, "10.99.0.1:9000"),
    ]
}

#[test]
fn the_router_forwards_only_what_the_clients_route_grant_allows() {
    let l = lan("r");
    let _l = listeners(&l);
    assert!(
        connects_from(&l.lab.a, H, 22),
        "no table: everything routed"
    );
    assert_eq!(
        l.lab.install(Some(router_view(true))).unwrap(),
        Installed::Filter
    );
    assert!(
        connects_from(&l.lab.a, H, 5432),
        "granted: routed, replies back"
    );
    assert!(pings_from(&l.lab.a, H), "icmp granted");
    assert!(
        !connects_from(&l.lab.a, H, 22),
        "a port the grant does not hold"
    );
    assert!(
        !connects_from(&l.h, A, 9000),
        "a LAN host opening a flow into the mesh"
    );
    assert!(l.lab.dropped() > 0);
    // The grant withdrawn: nothing is routed any more.
    l.lab.install(Some(router_view(false))).unwrap();
    assert!(!connects_from(&l.lab.a, H, 5432));
    assert!(!pings_from(&l.lab.a, H));
}

#[test]
fn the_client_opens_only_granted_flows_into_the_route_and_takes_their_replies() {
    let l = lan("c");
    let _l = listeners(&l);
    // The client's table on its end of the mesh link; the router filters nothing.
    let mesh = format!("{}p", l.lab.mesh);
    let installed = in_ns(&l.lab.a, move || {
        nft::install(&mesh, Some(&client_view())).unwrap()
    });
    assert_eq!(installed, Installed::Filter);
    assert!(
        connects_from(&l.lab.a, H, 5432),
        "granted, and its replies pass"
    );
    assert!(pings_from(&l.lab.a, H));
    assert!(!connects_from(&l.lab.a, H, 22), "output: not granted");
    assert!(
        !connects_from(&l.h, A, 9000),
        "input: a flow from the LAN is no reply"
    );
}
