//! Routed traffic through the userspace data plane (issue 27): in-memory devices exchanging
//! real WireGuard messages. Client A (10.64.0.1) reaches host H (10.1.0.50) in the LAN
//! 10.1.0.0/24 behind router R (10.64.0.2) under a route grant of tcp 5432 and icmp; C
//! (10.64.0.3) is a peer of R with no route. A's allowed IPs for R hold R's mesh address
//! and the route (as the control plane's state gives them); R's for A hold A's address. A
//! "hostile" node has its own filter off: what it sends must stop at the receiver.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a failure is a test failure

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Instant;

use plexd_dataplane::{
    Crypto, Device, DeviceUpdate, PacketBatch, PeerUpdate, PolicyFilter, PublicKey, SecretKey,
};
use plexsphere_policy::view::{NodeView, PeerView, RouteGrant};
use plexsphere_policy::{Access, Grant, PortRange, PortSet};
use uuid::Uuid;

const A: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 1);
const R: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 2);
const C: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 3);
const H: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 50);
const LAN: &str = "10.1.0.0/24";

fn db_grant() -> Grant {
    Grant {
        access: Access {
            tcp: PortSet::from_ranges([PortRange {
                first: 5432,
                last: 5432,
            }]),
            udp: PortSet::empty(),
            icmp: true,
            other: false,
        },
        lines: vec![1],
    }
}

fn peer_view(last: u8, out: Vec<RouteGrant>, inb: Vec<RouteGrant>) -> PeerView {
    PeerView {
        id: Uuid::from_u128(u128::from(last)),
        name: format!("n{last}"),
        addrs: vec![Ipv4Addr::new(10, 64, 0, last).into()],
        inbound: None,
        outbound: None,
        routes_out: out,
        routes_in: inb,
    }
}

fn lan(granted: bool) -> Vec<RouteGrant> {
    if granted {
        vec![RouteGrant {
            prefix: LAN.parse().unwrap(),
            grant: 0,
        }]
    } else {
        Vec::new()
    }
}

/// The view of node `last` (1 = A, 2 = R, 3 = C), with the route granted to A or not.
fn view(last: u8, granted: bool) -> NodeView {
    let peers = match last {
        1 => vec![peer_view(2, lan(granted), Vec::new())],
        2 => vec![
            peer_view(1, Vec::new(), lan(granted)),
            peer_view(3, Vec::new(), Vec::new()),
        ],
        _ => vec![peer_view(2, Vec::new(), Vec::new())],
    };
    NodeView {
        node: Uuid::from_u128(u128::from(last)),
        addrs: vec![Ipv4Addr::new(10, 64, 0, last).into()],
        grants: vec![db_grant()],
        peers,
    }
}

fn install(n: &Node, granted: bool, version: u64) {
    let (f, e) = PolicyFilter::from_view(version, &view(n.last, granted));
    assert!(e.is_none());
    n.device.set_policy(Some(f));
}

struct Node {
    last: u8,
    device: Device,
    key: PublicKey,
    addr: SocketAddr,
    tun: Vec<Vec<u8>>,
}

fn node(last: u8) -> Node {
    let sk = SecretKey::generate().expect("random");
    let device = Device::new(plexsphere_wire::clock::Now::system());
    device
        .apply(DeviceUpdate {
            private_key: Some(Some(sk.clone())),
            listen_port: Some(51820),
            ..Default::default()
        })
        .unwrap();
    Node {
        last,
        device,
        key: sk.public_key(),
        addr: SocketAddr::from(([192, 0, 2, last], 51820)),
        tun: Vec::new(),
    }
}

/// Makes `b` a peer of `a` with allowed IPs `allowed`.
fn link(a: &Node, b: &Node, allowed: &[&str]) {
    let mut peer = PeerUpdate::new(b.key);
    for net in allowed {
        peer.allowed_ips.push(net.parse().unwrap());
    }
    peer.endpoint = Some(b.addr);
    a.device
        .apply(DeviceUpdate {
            peers: vec![peer],
            ..Default::default()
        })
        .unwrap();
}

type Wire = Vec<(SocketAddr, SocketAddr, Vec<u8>)>;

fn pump(nodes: &mut [&mut Node], now: Instant, wire: &mut Wire) {
    for _ in 0..100 {
        if wire.is_empty() {
            return;
        }
        let (from, to, d) = wire.remove(0);
        let Some(n) = nodes.iter_mut().find(|n| n.addr == to) else {
            continue;
        };
        let mut net = PacketBatch::for_datagrams(4);
        let mut tun = PacketBatch::for_packets(4);
        n.device.handle_udp(
            now,
            [(&d[..], from, None)],
            &mut net,
            Crypto::Inline(&mut tun),
        );
        n.tun.extend(tun.iter().map(|(p, _)| p.to_vec()));
        for (d, to) in net.iter() {
            wire.push((n.addr, to, d.to_vec()));
        }
    }
    panic!("the wire never went quiet");
}

fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4: &[u8]) -> Vec<u8> {
    let total = 20 + l4.len();
    let mut p = vec![0u8; 20];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[8] = 64;
    p[9] = proto;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let mut sum: u32 = 0;
    for c in p.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    p[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    p.extend_from_slice(l4);
    p
}

fn tcp(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = 0x18;
    t.extend_from_slice(b"data");
    ipv4(src, dst, 6, &t)
}

fn icmp(src: Ipv4Addr, dst: Ipv4Addr, kind: u8) -> Vec<u8> {
    let mut t = vec![kind, 0, 0, 0, 0, 7, 0, 1];
    t.extend_from_slice(b"ping");
    ipv4(src, dst, 1, &t)
}

/// `a` sends `packet` into its TUN; answers whether `b` handed it to its host.
fn reaches(a: &mut Node, b: &mut Node, now: Instant, packet: &[u8]) -> bool {
    let mut wire = Wire::new();
    b.tun.clear();
    let mut net = PacketBatch::for_datagrams(4);
    a.device.handle_tun(now, [packet], Crypto::Inline(&mut net));
    for (d, to) in net.iter() {
        wire.push((a.addr, to, d.to_vec()));
    }
    pump(&mut [a, b], now, &mut wire);
    b.tun.iter().any(|p| p == packet)
}

fn drops(n: &Node, inbound: bool, reason: &str) -> u64 {
    n.device
        .counters()
        .policy
        .read()
        .into_iter()
        .find(|(r, _, _)| *r == reason)
        .map(|(_, i, o)| if inbound { i } else { o })
        .unwrap()
}

/// A and R linked (A's allowed IPs for R hold the route), sessions up with no filter.
fn client_and_router() -> (Node, Node) {
    let (mut a, mut r) = (node(1), node(2));
    link(&a, &r, &["10.64.0.2/32", LAN]);
    link(&r, &a, &["10.64.0.1/32"]);
    let now = Instant::now();
    assert!(reaches(&mut a, &mut r, now, &tcp(A, R, 1, 2)));
    assert!(reaches(&mut r, &mut a, now, &tcp(R, A, 2, 1)));
    (a, r)
}

#[test]
fn a_client_reaches_a_host_behind_its_router_only_where_granted_and_gets_its_replies() {
    let (mut a, mut r) = client_and_router();
    install(&a, true, 1);
    install(&r, true, 1);
    let now = Instant::now();
    // A's packet to H goes to R (cryptokey routing: the route is in R's allowed IPs), R's
    // filter forwards it to its host (the kernel routes it on into the LAN).
    assert!(reaches(&mut a, &mut r, now, &tcp(A, H, 40000, 5432)));
    assert!(reaches(&mut a, &mut r, now, &icmp(A, H, 8)));
    // H's replies, de-NATed by R's kernel, leave R's data plane towards A and pass both
    // filters (on A the source H passes the WireGuard check: it is in R's allowed IPs).
    assert!(reaches(&mut r, &mut a, now, &tcp(H, A, 5432, 40000)));
    assert!(reaches(&mut r, &mut a, now, &icmp(H, A, 0)));
    // A port the grant does not hold stops at A, and at R for a hostile A.
    assert!(!reaches(&mut a, &mut r, now, &tcp(A, H, 40001, 22)));
    assert_eq!(drops(&a, false, "route_denied"), 1);
    a.device.set_policy(None);
    assert!(!reaches(&mut a, &mut r, now, &tcp(A, H, 40001, 22)));
    assert_eq!(drops(&r, true, "route_denied"), 1);
    install(&a, true, 1);
    // A reply injected from the LAN with no flow stops at R, and at A for a hostile R.
    assert!(!reaches(&mut r, &mut a, now, &tcp(H, A, 5432, 40999)));
    assert_eq!(drops(&r, false, "route_denied"), 1);
    r.device.set_policy(None);
    assert!(!reaches(&mut r, &mut a, now, &tcp(H, A, 5432, 40999)));
    assert_eq!(drops(&a, true, "route_denied"), 1);
    // A LAN host opening a flow to A: dropped the same way.
    assert!(!reaches(&mut r, &mut a, now, &tcp(H, A, 40000, 22)));
    assert_eq!(drops(&a, true, "route_denied"), 2);
}

#[test]
fn a_peer_without_the_route_gets_nothing_forwarded_whatever_its_allowed_ips() {
    let (mut c, mut r) = (node(3), node(2));
    // A hostile C routes the LAN to R by itself; R's allowed IPs for C are its address.
    link(&c, &r, &["10.64.0.2/32", LAN]);
    link(&r, &c, &["10.64.0.3/32"]);
    let now = Instant::now();
    assert!(reaches(&mut c, &mut r, now, &tcp(C, R, 1, 2)));
    install(&r, true, 1);
    assert!(!reaches(&mut c, &mut r, now, &tcp(C, H, 40000, 5432)));
    assert_eq!(drops(&r, true, "not_for_this_node"), 1);
    // Nor with A's source address: spoofed (the WireGuard source check stops it first).
    assert!(!reaches(&mut c, &mut r, now, &tcp(A, H, 40000, 5432)));
    assert_eq!(r.device.counters().not_allowed.load(Ordering::Relaxed), 1);
}

#[test]
fn withdrawing_the_route_grant_stops_a_live_routed_flow_both_ways() {
    let (mut a, mut r) = client_and_router();
    install(&a, true, 1);
    install(&r, true, 1);
    let now = Instant::now();
    assert!(reaches(&mut a, &mut r, now, &tcp(A, H, 40000, 5432)));
    assert!(reaches(&mut r, &mut a, now, &tcp(H, A, 5432, 40000)));
    // R's new view no longer serves A the route (A's has not arrived yet, or A is hostile).
    install(&r, false, 2);
    a.device.set_policy(None);
    assert!(!reaches(&mut a, &mut r, now, &tcp(A, H, 40000, 5432)));
    assert_eq!(drops(&r, true, "not_for_this_node"), 1);
    // The flow was pruned at the change: H's replies stop at R.
    assert!(!reaches(&mut r, &mut a, now, &tcp(H, A, 5432, 40000)));
    assert_eq!(drops(&r, false, "not_from_this_node"), 1);
    // A's new view: its flow is pruned too, so a hostile R's replies stop at A.
    install(&a, false, 2);
    r.device.set_policy(None);
    assert!(!reaches(&mut r, &mut a, now, &tcp(H, A, 5432, 40000)));
    assert_eq!(drops(&a, true, "spoofed_source"), 1);
}
