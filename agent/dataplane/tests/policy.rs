//! The access policy's filter on the packet path (issue 25): in-memory devices exchanging
//! real WireGuard messages that carry real IPv4 TCP/UDP/ICMP packets, time stepped by the
//! test. Nodes web (10.64.0.1), db (.2) and ci (.3) under "web may open tcp/5432 on db".
//! A "hostile" node is one whose own filter is off (it rewrote its interface): what it
//! sends must stop at the receiver.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a failure is a test failure

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use plexd_dataplane::{
    Crypto, Device, DeviceUpdate, PacketBatch, PeerUpdate, PolicyFilter, PublicKey, SecretKey,
};
use plexsphere_policy::view::NodeView;
use plexsphere_policy::{Compiled, Inventory, NodeInfo, ProjectInfo, parse};
use uuid::Uuid;

const WEB_TO_DB: &str = "rules:\n  - {src: tag:web, dst: tag:db, proto: tcp, ports: 5432}\n";
const NOTHING: &str = "rules: []\n";

const NAMES: [&str; 3] = ["web", "db", "ci"];

fn inventory() -> Inventory {
    let project = Uuid::from_u128(100);
    Inventory {
        projects: vec![ProjectInfo {
            id: project,
            slug: "p".into(),
        }],
        nodes: NAMES
            .iter()
            .enumerate()
            .map(|(i, name)| NodeInfo {
                id: Uuid::from_u128(i as u128 + 1),
                name: (*name).into(),
                project_id: project,
                project_slug: "p".into(),
                tags: vec![(*name).into()],
                ipv4: Some(mesh(i as u8 + 1)),
                ipv6: None,
            })
            .collect(),
        tags: vec![],
    }
}

fn mesh(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 64, 0, last)
}

fn view(doc: &str, node: u8) -> NodeView {
    let c = Compiled::new(&parse(doc).unwrap(), &inventory());
    c.node_view(Uuid::from_u128(u128::from(node))).unwrap()
}

fn install(n: &Node, doc: &str, version: u64) {
    let (f, e) = PolicyFilter::from_view(version, &view(doc, n.last));
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

/// Makes `b` a peer of `a` with allowed IPs `allowed` (b's /32 when None).
fn link(a: &Node, b: &Node, allowed: Option<&str>) {
    let mut peer = PeerUpdate::new(b.key);
    let net = allowed.map_or_else(|| format!("{}/32", mesh(b.last)), str::to_owned);
    peer.allowed_ips.push(net.parse().unwrap());
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

/// An IPv4 packet of protocol `proto` with `l4` as its transport header and data.
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

fn ping(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    let mut t = vec![8u8, 0, 0, 0, 0, 7, 0, 1];
    t.extend_from_slice(b"ping");
    ipv4(src, dst, 1, &t)
}

/// `from` sends `packet` into its TUN; the wire carries what comes out.
fn send(from: &Node, now: Instant, packet: &[u8], wire: &mut Wire) {
    let mut net = PacketBatch::for_datagrams(4);
    from.device
        .handle_tun(now, [packet], Crypto::Inline(&mut net));
    for (d, to) in net.iter() {
        wire.push((from.addr, to, d.to_vec()));
    }
}

/// Sends `packet` from `a` to `b` and answers whether `b` handed it to its host.
fn reaches(a: &mut Node, b: &mut Node, now: Instant, packet: &[u8]) -> bool {
    let mut wire = Wire::new();
    b.tun.clear();
    send(a, now, packet, &mut wire);
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

/// web and db linked both ways, with a handshake done by a keepalive-free first packet
/// allowed under no filter.
fn pair() -> (Node, Node) {
    let (mut web, mut db) = (node(1), node(2));
    link(&web, &db, None);
    link(&db, &web, None);
    // A session first, with no filter anywhere.
    let now = Instant::now();
    assert!(reaches(
        &mut web,
        &mut db,
        now,
        &tcp(mesh(1), mesh(2), 1, 2)
    ));
    (web, db)
}

#[test]
fn allowed_tcp_passes_and_a_port_no_rule_allows_is_dropped_and_counted() {
    let (mut web, mut db) = pair();
    install(&web, WEB_TO_DB, 1);
    install(&db, WEB_TO_DB, 1);
    let now = Instant::now();
    assert!(reaches(
        &mut web,
        &mut db,
        now,
        &tcp(mesh(1), mesh(2), 40000, 5432)
    ));
    // web's own filter stops tcp/22 before encryption...
    assert!(!reaches(
        &mut web,
        &mut db,
        now,
        &tcp(mesh(1), mesh(2), 40000, 22)
    ));
    assert_eq!(drops(&web, false, "no_rule"), 1);
    // ...and a hostile web without its filter still gets nothing through db's.
    web.device.set_policy(None);
    assert!(!reaches(
        &mut web,
        &mut db,
        now,
        &tcp(mesh(1), mesh(2), 40000, 22)
    ));
    assert_eq!(drops(&db, true, "no_rule"), 1);
    assert!(!reaches(&mut web, &mut db, now, &ping(mesh(1), mesh(2))));
    assert_eq!(drops(&db, true, "no_rule"), 2, "no rule allows icmp");
    assert!(reaches(
        &mut web,
        &mut db,
        now,
        &tcp(mesh(1), mesh(2), 40000, 5432)
    ));
}

#[test]
fn a_reply_to_a_connection_this_node_opened_passes_and_the_other_way_does_not() {
    let (mut web, mut db) = pair();
    install(&web, WEB_TO_DB, 1);
    install(&db, WEB_TO_DB, 1);
    let now = Instant::now();
    assert!(reaches(
        &mut web,
        &mut db,
        now,
        &tcp(mesh(1), mesh(2), 40000, 5432)
    ));
    assert!(
        reaches(&mut db, &mut web, now, &tcp(mesh(2), mesh(1), 5432, 40000)),
        "db's reply to web's connection"
    );
    // db may not open a connection to web: its own filter stops it, and a hostile db's
    // packet stops at web.
    assert!(!reaches(
        &mut db,
        &mut web,
        now,
        &tcp(mesh(2), mesh(1), 40001, 80)
    ));
    assert_eq!(drops(&db, false, "no_rule"), 1);
    db.device.set_policy(None);
    assert!(!reaches(
        &mut db,
        &mut web,
        now,
        &tcp(mesh(2), mesh(1), 40001, 80)
    ));
    assert_eq!(drops(&web, true, "no_rule"), 1);
    // A "reply" to a flow web never opened is no reply.
    assert!(!reaches(
        &mut db,
        &mut web,
        now,
        &tcp(mesh(2), mesh(1), 5432, 40999)
    ));
}

#[test]
fn a_peer_using_another_nodes_source_address_is_dropped_even_with_wide_allowed_ips() {
    let (mut web, mut db) = (node(1), node(2));
    link(&web, &db, Some("10.64.0.0/24"));
    // db's WireGuard config lets web use all of 10.64.0.0/24 (a wider allowed IPs), so the
    // WireGuard source check passes; the policy knows web is 10.64.0.1 only.
    link(&db, &web, Some("10.64.0.0/24"));
    install(&db, WEB_TO_DB, 1);
    let now = Instant::now();
    assert!(reaches(
        &mut web,
        &mut db,
        now,
        &tcp(mesh(1), mesh(2), 40000, 5432)
    ));
    assert!(!reaches(
        &mut web,
        &mut db,
        now,
        &tcp(mesh(3), mesh(2), 40000, 5432)
    ));
    assert_eq!(drops(&db, true, "spoofed_source"), 1);
    // A destination that is not db is not delivered either.
    assert!(!reaches(
        &mut web,
        &mut db,
        now,
        &tcp(mesh(1), mesh(9), 40000, 5432)
    ));
    assert_eq!(drops(&db, true, "not_for_this_node"), 1);
}

#[test]
fn a_peer_outside_the_view_gets_nothing_through() {
    let (mut ci, mut db) = (node(3), node(2));
    link(&ci, &db, None);
    link(&db, &ci, None); // a stale or hostile WireGuard peer the policy does not name
    install(&db, WEB_TO_DB, 1);
    let now = Instant::now();
    assert!(!reaches(
        &mut ci,
        &mut db,
        now,
        &tcp(mesh(3), mesh(2), 40000, 5432)
    ));
    assert_eq!(drops(&db, true, "unknown_peer"), 1);
}

#[test]
fn a_peer_added_after_the_filter_is_filtered_from_its_first_packet() {
    let (mut web, mut db) = (node(1), node(2));
    install(&db, WEB_TO_DB, 1);
    link(&web, &db, None);
    link(&db, &web, None);
    let now = Instant::now();
    assert!(reaches(
        &mut web,
        &mut db,
        now,
        &tcp(mesh(1), mesh(2), 40000, 5432)
    ));
    assert!(!reaches(
        &mut web,
        &mut db,
        now,
        &tcp(mesh(1), mesh(2), 40000, 22)
    ));
    assert_eq!(drops(&db, true, "no_rule"), 1);
}

#[test]
fn a_revocation_stops_a_live_flow_in_both_directions_once_installed() {
    let (mut web, mut db) = pair();
    install(&web, WEB_TO_DB, 1);
    install(&db, WEB_TO_DB, 1);
    let now = Instant::now();
    let request = tcp(mesh(1), mesh(2), 40000, 5432);
    let reply = tcp(mesh(2), mesh(1), 5432, 40000);
    assert!(reaches(&mut web, &mut db, now, &request));
    assert!(reaches(&mut db, &mut web, now, &reply));
    assert_eq!(web.device.policy_flows(), 1, "web's flow to db");

    // The receiver's side: db takes the revocation; web (not yet, or hostile) keeps sending
    // on the established connection: db drops it from the next packet on.
    install(&db, NOTHING, 2);
    assert!(!reaches(&mut web, &mut db, now, &request));
    assert_eq!(
        drops(&db, true, "unknown_peer"),
        1,
        "web is no peer of db's any more"
    );

    // web takes it too: its flow is forgotten, so db's replies (db hostile: no filter) stop.
    db.device.set_policy(None);
    assert!(
        reaches(&mut db, &mut web, now, &reply),
        "before web's change"
    );
    install(&web, NOTHING, 2);
    assert_eq!(web.device.policy_flows(), 0, "the revoked flow was pruned");
    assert!(!reaches(&mut db, &mut web, now, &reply));
    assert!(!reaches(&mut web, &mut db, now, &request));

    // A new rule lets a new connection through at once.
    install(&web, WEB_TO_DB, 3);
    install(&db, WEB_TO_DB, 3);
    assert!(reaches(
        &mut web,
        &mut db,
        now,
        &tcp(mesh(1), mesh(2), 40002, 5432)
    ));
}

#[test]
fn a_closed_filter_lets_nothing_through_and_no_filter_everything() {
    let (mut web, mut db) = pair();
    let mut bad = view(WEB_TO_DB, 2);
    bad.peers[0].inbound = Some(99); // a grant the view does not have: corrupt
    let (f, e) = PolicyFilter::from_view(7, &bad);
    assert!(e.is_some());
    assert!(f.closed_reason().unwrap().contains("version 7"));
    db.device.set_policy(Some(f));
    let now = Instant::now();
    assert!(!reaches(
        &mut web,
        &mut db,
        now,
        &tcp(mesh(1), mesh(2), 40000, 5432)
    ));
    assert!(drops(&db, true, "unknown_peer") >= 1);
    let (version, why) = db.device.policy().unwrap();
    assert_eq!(version, Some(7));
    assert!(
        why.unwrap().contains("unusable"),
        "the device says why it is closed"
    );
    db.device.set_policy(None);
    assert!(reaches(
        &mut web,
        &mut db,
        now,
        &tcp(mesh(1), mesh(2), 40000, 22)
    ));
    assert_eq!(db.device.policy(), None);
}
