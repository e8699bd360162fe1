//! The header parser on real packet bytes, the flow table's bounds and timeouts, and the
//! byte-level decision (ping replies, ICMP errors, fragments, revocation).
#![allow(clippy::unwrap_used)] // test helpers: a failure here is a test failure

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use plexsphere_policy::decide::{Accept, Drop, inbound_bytes, outbound_bytes};
use plexsphere_policy::limits::{TCP_FLOW_IDLE, UDP_FLOW_IDLE};
use plexsphere_policy::packet::{Icmp, Inner, L4};
use plexsphere_policy::{
    Compiled, Decision, FlowKey, FlowTable, NodeFilter, PacketError, Proto, parse, parse_packet,
    prune_flows,
};

const A: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 2);

fn v4(proto: u8, src: Ipv4Addr, dst: Ipv4Addr, frag: u16, l4: &[u8]) -> Vec<u8> {
    let total = u16::try_from(20 + l4.len()).unwrap();
    let mut p = vec![0x45, 0];
    p.extend_from_slice(&total.to_be_bytes());
    p.extend_from_slice(&[0, 1]);
    p.extend_from_slice(&frag.to_be_bytes());
    p.extend_from_slice(&[64, proto, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(l4);
    p
}

fn tcp(sport: u16, dport: u16) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[12] = 0x50;
    t
}

fn udp(sport: u16, dport: u16) -> Vec<u8> {
    let mut t = vec![0u8; 8];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t
}

fn icmp(kind: u8, id: u16, rest: &[u8]) -> Vec<u8> {
    let mut t = vec![kind, 0, 0, 0];
    t.extend_from_slice(&id.to_be_bytes());
    t.extend_from_slice(&[0, 1]);
    t.extend_from_slice(rest);
    t
}

fn v6(next: u8, ext: &[u8], l4: &[u8]) -> Vec<u8> {
    let len = u16::try_from(ext.len() + l4.len()).unwrap();
    let mut p = vec![0x60, 0, 0, 0];
    p.extend_from_slice(&len.to_be_bytes());
    p.extend_from_slice(&[next, 64]);
    p.extend_from_slice(&Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).octets());
    p.extend_from_slice(&Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).octets());
    p.extend_from_slice(ext);
    p.extend_from_slice(l4);
    p
}

#[test]
fn parses_ipv4_transport_headers() {
    let p = parse_packet(&v4(6, A, B, 0, &tcp(40000, 5432))).unwrap();
    assert_eq!((p.src, p.dst), (IpAddr::V4(A), IpAddr::V4(B)));
    assert_eq!(
        p.l4,
        L4::Tcp {
            sport: 40000,
            dport: 5432
        }
    );
    assert_eq!(
        parse_packet(&v4(17, A, B, 0, &udp(1, 53))).unwrap().l4,
        L4::Udp {
            sport: 1,
            dport: 53
        }
    );
    assert_eq!(
        parse_packet(&v4(1, A, B, 0, &icmp(8, 77, &[]))).unwrap().l4,
        L4::Icmp(Icmp::EchoRequest { id: 77 })
    );
    assert_eq!(
        parse_packet(&v4(1, A, B, 0, &icmp(0, 77, &[]))).unwrap().l4,
        L4::Icmp(Icmp::EchoReply { id: 77 })
    );
    assert_eq!(
        parse_packet(&v4(47, A, B, 0, &[0; 4])).unwrap().l4,
        L4::Other(47)
    );
    // An ICMP error quoting B's packet to A (its header and 8 bytes).
    let quoted = v4(17, B, A, 0, &udp(5353, 53));
    let e = parse_packet(&v4(1, A, B, 0, &icmp(3, 0, &quoted[..28]))).unwrap();
    let inner = Inner {
        src: B.into(),
        dst: A.into(),
        proto: Proto::Udp,
        sport: 5353,
        dport: 53,
    };
    assert_eq!(e.l4, L4::Icmp(Icmp::Error(Some(inner))));
    // Trailing bytes past the total length (link padding) are ignored.
    let mut padded = v4(6, A, B, 0, &tcp(1, 2));
    padded.extend_from_slice(&[0; 6]);
    assert!(parse_packet(&padded).is_ok());
}

#[test]
fn parses_ipv6_with_extension_headers_and_fragments() {
    let p = parse_packet(&v6(6, &[], &tcp(1, 22))).unwrap();
    assert_eq!(
        p.l4,
        L4::Tcp {
            sport: 1,
            dport: 22
        }
    );
    // Hop-by-hop (8 bytes) then UDP.
    let hbh = [17, 0, 1, 4, 0, 0, 0, 0];
    assert_eq!(
        parse_packet(&v6(0, &hbh, &udp(5, 53))).unwrap().l4,
        L4::Udp {
            sport: 5,
            dport: 53
        }
    );
    // A first fragment carries the ports; a later one has none.
    let first = [6, 0, 0, 1, 0, 0, 0, 9];
    assert_eq!(
        parse_packet(&v6(44, &first, &tcp(3, 443))).unwrap().l4,
        L4::Tcp {
            sport: 3,
            dport: 443
        }
    );
    let later = [17, 0, 0x05, 0x00, 0, 0, 0, 9];
    assert_eq!(
        parse_packet(&v6(44, &later, &[0; 16])).unwrap().l4,
        L4::LaterFragment(17)
    );
    assert_eq!(
        parse_packet(&v6(58, &[], &icmp(128, 9, &[]))).unwrap().l4,
        L4::Icmp(Icmp::EchoRequest { id: 9 })
    );
    let mut chain = Vec::new();
    for _ in 0..9 {
        chain.extend_from_slice(&[60, 0, 0, 0, 0, 0, 0, 0]);
    }
    assert_eq!(
        parse_packet(&v6(60, &chain, &[])),
        Err(PacketError::TooManyExtensionHeaders)
    );
}

#[test]
fn refuses_what_is_malformed_or_a_fragment_attack() {
    assert_eq!(parse_packet(&[]), Err(PacketError::Empty));
    assert_eq!(parse_packet(&[0x55; 40]), Err(PacketError::Version(5)));
    let whole = v4(6, A, B, 0, &tcp(1, 2));
    assert_eq!(parse_packet(&whole[..30]), Err(PacketError::Truncated));
    // A later IPv4 fragment passes as such; one at offset 8 bytes over TCP is refused.
    assert_eq!(
        parse_packet(&v4(17, A, B, 185, &[0; 16])).unwrap().l4,
        L4::LaterFragment(17)
    );
    assert_eq!(
        parse_packet(&v4(6, A, B, 1, &[0; 16])),
        Err(PacketError::TinyFragment)
    );
    // A first fragment (more-fragments set) too short to hold the TCP header.
    assert_eq!(
        parse_packet(&v4(6, A, B, 0x2000, &[0; 8])),
        Err(PacketError::TinyFragment)
    );
}

fn key(proto: Proto, lp: u16, rp: u16) -> FlowKey {
    FlowKey {
        proto,
        local: A.into(),
        local_port: lp,
        remote: B.into(),
        remote_port: rp,
    }
}

#[test]
fn flows_expire_per_protocol_and_the_oldest_goes_when_full() {
    let t0 = Instant::now();
    let mut f = FlowTable::new(3);
    f.opened(key(Proto::Udp, 1, 53), t0);
    f.opened(key(Proto::Tcp, 2, 443), t0);
    assert!(f.reply(
        &key(Proto::Udp, 1, 53),
        t0 + UDP_FLOW_IDLE - Duration::from_secs(1)
    ));
    // Refreshed above: still alive one timeout after the first packet...
    assert!(f.reply(
        &key(Proto::Udp, 1, 53),
        t0 + UDP_FLOW_IDLE + Duration::from_secs(1)
    ));
    // ...and gone after a whole idle timeout.
    let later = t0 + 2 * UDP_FLOW_IDLE + Duration::from_secs(1);
    assert!(!f.reply(&key(Proto::Udp, 1, 53), later));
    assert!(f.reply(&key(Proto::Tcp, 2, 443), later), "tcp idles longer");
    assert!(!f.reply(&key(Proto::Tcp, 2, 443), later + TCP_FLOW_IDLE));
    // Full: the flow idle longest is evicted first.
    let mut f = FlowTable::new(2);
    f.opened(key(Proto::Tcp, 1, 1), t0);
    f.opened(key(Proto::Udp, 2, 2), t0 + Duration::from_secs(1));
    f.opened(key(Proto::Tcp, 1, 1), t0 + Duration::from_secs(2));
    f.opened(key(Proto::Icmp, 3, 0), t0 + Duration::from_secs(3));
    assert_eq!(f.len(), 2);
    assert!(!f.reply(&key(Proto::Udp, 2, 2), t0 + Duration::from_secs(4)));
    assert!(f.reply(&key(Proto::Tcp, 1, 1), t0 + Duration::from_secs(4)));
    assert_eq!(f.stats().evicted_when_full, 1);
}

const PING_AND_DB: &str = "rules:\n  - {src: tag:web, dst: tag:db, proto: tcp, ports: 5432}\n  - {src: tag:web, dst: tag:db, proto: icmp}\n";

fn filters(doc: &str) -> (NodeFilter, NodeFilter, uuid::Uuid, uuid::Uuid) {
    let inv = common::web_db_ci();
    let c = Compiled::new(&parse(doc).unwrap(), &inv);
    let (web, db) = (common::node(&inv, "web").id, common::node(&inv, "db").id);
    let f = |id| NodeFilter::new(&c.node_view(id).unwrap()).unwrap();
    (f(web), f(db), web, db)
}

#[test]
fn ping_replies_and_icmp_errors_pass_only_for_this_nodes_flows() {
    let (web, _, _, db) = filters(PING_AND_DB);
    let now = Instant::now();
    let mut flows = FlowTable::default();
    let peer = web.peer(&db);
    // web is 10.64.0.1, db 10.64.0.2 (A and B).
    let reply = v4(1, B, A, 0, &icmp(0, 42, &[]));
    assert!(!inbound_bytes(&web, peer, &reply, &mut flows, now).is_accept());
    assert!(
        outbound_bytes(
            &web,
            peer,
            &v4(1, A, B, 0, &icmp(8, 42, &[])),
            &mut flows,
            now
        )
        .is_accept()
    );
    assert_eq!(
        inbound_bytes(&web, peer, &reply, &mut flows, now),
        Decision::Accept(Accept::Reply)
    );
    assert!(
        !inbound_bytes(
            &web,
            peer,
            &v4(1, B, A, 0, &icmp(0, 43, &[])),
            &mut flows,
            now
        )
        .is_accept()
    );
    // "Port unreachable" about web's flow to db:5432 passes; about another flow, not.
    assert!(
        outbound_bytes(
            &web,
            peer,
            &v4(6, A, B, 0, &tcp(40000, 5432)),
            &mut flows,
            now
        )
        .is_accept()
    );
    let ours = v4(6, A, B, 0, &tcp(40000, 5432));
    let err = v4(1, B, A, 0, &icmp(3, 0, &ours[..28]));
    assert_eq!(
        inbound_bytes(&web, peer, &err, &mut flows, now),
        Decision::Accept(Accept::IcmpError)
    );
    let theirs = v4(6, A, B, 0, &tcp(40001, 22));
    let err = v4(1, B, A, 0, &icmp(3, 0, &theirs[..28]));
    assert!(!inbound_bytes(&web, peer, &err, &mut flows, now).is_accept());
    // Garbage is dropped, never a panic.
    assert_eq!(
        inbound_bytes(&web, peer, &[0x45, 0, 0], &mut flows, now),
        Decision::Drop(Drop::Malformed(PacketError::Truncated))
    );
}

#[test]
fn a_revocation_cuts_the_flows_this_node_opened() {
    let (web, db_filter, web_id, db) = filters(PING_AND_DB);
    let now = Instant::now();
    let mut flows = FlowTable::default();
    assert!(
        outbound_bytes(
            &web,
            web.peer(&db),
            &v4(6, A, B, 0, &tcp(40000, 5432)),
            &mut flows,
            now
        )
        .is_accept()
    );
    let ack = v4(6, B, A, 0, &tcp(5432, 40000));
    assert!(inbound_bytes(&web, web.peer(&db), &ack, &mut flows, now).is_accept());
    // db enforces web's packets against the rules on every packet: no state to outlive a change.
    let (_, db_after, _, _) = filters("rules: []\n");
    assert!(
        inbound_bytes(
            &db_filter,
            db_filter.peer(&web_id),
            &v4(6, A, B, 0, &tcp(40000, 5432)),
            &mut flows,
            now
        )
        .is_accept()
    );
    assert_eq!(
        inbound_bytes(
            &db_after,
            db_after.peer(&web_id),
            &v4(6, A, B, 0, &tcp(40000, 5432)),
            &mut flows,
            now
        ),
        Decision::Drop(Drop::UnknownPeer)
    );
    // web's table forgets the flow the new policy no longer allows; db's replies stop.
    let (web_after, _, _, _) = filters("rules:\n  - {src: tag:web, dst: tag:db, proto: icmp}\n");
    prune_flows(&web_after, &mut flows);
    assert!(flows.is_empty());
    assert!(!inbound_bytes(&web_after, web_after.peer(&db), &ack, &mut flows, now).is_accept());
    // A flow the new policy still allows survives the prune.
    assert!(
        outbound_bytes(
            &web,
            web.peer(&db),
            &v4(1, A, B, 0, &icmp(8, 5, &[])),
            &mut flows,
            now
        )
        .is_accept()
    );
    prune_flows(&web_after, &mut flows);
    assert_eq!(flows.len(), 1);
}
