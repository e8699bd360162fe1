//! The answer table of [`super::answer`], row by row, on a table built from a state.

use std::net::IpAddr;
use std::str::FromStr;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use plexsphere_policy::view::{NodeView, PeerView};
use plexsphere_wire::node::PeerSpec;
use plexsphere_wire::routes::DnsState;
use proptest::prelude::*;
use uuid::Uuid;

use super::answer::{Transport, answer};
use super::zone::{Zone, ZoneInput};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn peer(n: u128, name: Option<&str>, mesh_ip: &str) -> PeerSpec {
    PeerSpec {
        node_id: Uuid::from_u128(n),
        hostname: format!("host-{n}"),
        public_key: String::new(),
        mesh_ip: ip(mesh_ip),
        allowed_ips: vec![],
        endpoints: vec![],
        persistent_keepalive_secs: None,
        home_relay: None,
        dns_name: name.map(str::to_owned),
    }
}

fn dns() -> DnsState {
    DnsState {
        suffix: "mesh.internal".to_owned(),
        name: "self".to_owned(),
    }
}

/// This node `self` 10.64.0.1; peers web 10.64.0.2, db 10.64.0.3 (and fd00::3, outside the
/// mesh range), `denied`
/// 10.64.0.4 (no outbound grant), `noname` 10.64.0.5.
fn zone() -> Zone {
    let peers = vec![
        peer(2, Some("web"), "10.64.0.2"),
        peer(3, Some("db"), "10.64.0.3"),
        peer(4, Some("denied"), "10.64.0.4"),
        peer(5, None, "10.64.0.5"),
    ];
    let pv = |n: u128, outbound: Option<u32>, addrs: Vec<IpAddr>| PeerView {
        id: Uuid::from_u128(n),
        name: format!("host-{n}"),
        addrs,
        inbound: Some(0),
        outbound,
        routes_out: vec![],
        routes_in: vec![],
    };
    let view = NodeView {
        node: Uuid::from_u128(1),
        addrs: vec![ip("10.64.0.1")],
        grants: vec![],
        peers: vec![
            pv(2, Some(0), vec![ip("10.64.0.2")]),
            pv(3, Some(0), vec![ip("10.64.0.3"), ip("fd00::3")]),
            pv(4, None, vec![ip("10.64.0.4")]),
            pv(5, Some(0), vec![ip("10.64.0.5")]),
        ],
    };
    let dns = dns();
    let z = Zone::build(ZoneInput {
        dns: Some(&dns),
        own_addrs: &[ip("10.64.0.1")],
        mesh: "10.64.0.0/16".parse().expect("net"),
        peers: &peers,
        view: Some(&view),
    });
    z.expect("zone")
}

fn query(name: &str, qtype: RecordType) -> Message {
    let mut m = Message::new(0x1234, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).expect("name"), qtype));
    m
}

fn ask_with(zone: Option<&Zone>, m: &Message, t: Transport) -> Message {
    let bytes = m.to_vec().expect("encode");
    let out = answer(zone, &bytes, t).expect("an answer");
    Message::from_vec(&out).expect("decode")
}

fn ask(name: &str, qtype: RecordType) -> Message {
    ask_with(Some(&zone()), &query(name, qtype), Transport::Udp)
}

fn addrs(m: &Message) -> Vec<IpAddr> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

fn soa_owner(m: &Message) -> Option<String> {
    m.authorities
        .iter()
        .find(|r| r.record_type() == RecordType::SOA)
        .map(|r| r.name.to_ascii())
}

#[test]
fn names_of_the_node_and_its_allowed_peers_answer_a_and_aaaa() {
    let m = ask("web.mesh.internal.", RecordType::A);
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addrs(&m), vec![ip("10.64.0.2")]);
    assert!(m.metadata.authoritative);
    assert!(
        !m.metadata.recursion_available,
        "never a recursive resolver"
    );
    assert!(m.metadata.recursion_desired, "RD is copied");
    assert_eq!(m.metadata.id, 0x1234);
    assert!(m.answers.iter().all(|r| r.ttl == super::NAME_TTL));
    assert_eq!(
        addrs(&ask("self.mesh.internal.", RecordType::A)),
        vec![ip("10.64.0.1")]
    );
    // fd00::3 lies outside the mesh range: not answered (AAAA is NODATA).
    assert_eq!(
        addrs(&ask("db.mesh.internal.", RecordType::AAAA)),
        Vec::<IpAddr>::new()
    );
    assert_eq!(
        addrs(&ask("db.mesh.internal.", RecordType::A)),
        vec![ip("10.64.0.3")]
    );
}

#[test]
fn the_question_is_echoed_in_its_case_and_matched_without_it() {
    let m = ask("WeB.MeSh.InTeRnAl.", RecordType::A);
    assert_eq!(addrs(&m), vec![ip("10.64.0.2")]);
    assert_eq!(m.queries[0].name().to_ascii(), "WeB.MeSh.InTeRnAl.");
    assert_eq!(m.answers[0].name.to_ascii(), "WeB.MeSh.InTeRnAl.");
}

#[test]
fn a_name_without_the_type_is_nodata_with_the_soa() {
    let m = ask("web.mesh.internal.", RecordType::AAAA);
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.answers.is_empty());
    assert_eq!(soa_owner(&m).as_deref(), Some("mesh.internal."));
    let m = ask("web.mesh.internal.", RecordType::MX);
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.answers.is_empty());
    let m = ask("mesh.internal.", RecordType::A);
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.answers.is_empty());
    let m = ask("mesh.internal.", RecordType::SOA);
    assert_eq!(m.answers.len(), 1);
    assert_eq!(m.answers[0].record_type(), RecordType::SOA);
}

#[test]
fn other_names_under_the_suffix_are_nxdomain_with_the_soa() {
    for name in [
        "denied.mesh.internal.",
        "nobody.mesh.internal.",
        "x.web.mesh.internal.",
        "host-5.mesh.internal.",
    ] {
        let m = ask(name, RecordType::A);
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{name}");
        assert!(m.answers.is_empty(), "{name}");
        assert!(m.metadata.authoritative, "{name}");
        let soa = m.authorities.first().expect("an SOA");
        assert_eq!(soa.name.to_ascii(), "mesh.internal.");
        match &soa.data {
            RData::SOA(s) => assert_eq!(s.minimum, super::NAME_TTL),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn everything_else_is_refused_and_never_forwarded() {
    for (name, t) in [
        ("example.com.", RecordType::A),
        ("internal.", RecordType::A),
        ("mesh.internal.example.com.", RecordType::A),
        (".", RecordType::NS),
        ("web.", RecordType::A),
        ("1.1.168.192.in-addr.arpa.", RecordType::PTR),
        ("10.in-addr.arpa.", RecordType::SOA),
    ] {
        let m = ask(name, t);
        assert_eq!(m.metadata.response_code, ResponseCode::Refused, "{name}");
        assert!(m.answers.is_empty() && m.authorities.is_empty(), "{name}");
        assert!(!m.metadata.recursion_available, "{name}");
    }
    let mut chaos = query("version.bind.", RecordType::TXT);
    chaos.queries[0].query_class = DNSClass::CH;
    let m = ask_with(Some(&zone()), &chaos, Transport::Udp);
    assert_eq!(m.metadata.response_code, ResponseCode::Refused);
    // A state without names (an older server): everything refused.
    let m = ask_with(
        None,
        &query("web.mesh.internal.", RecordType::A),
        Transport::Udp,
    );
    assert_eq!(m.metadata.response_code, ResponseCode::Refused);
}

#[test]
fn ptr_of_named_mesh_addresses_and_nxdomain_for_the_rest_of_the_range() {
    let m = ask("2.0.64.10.in-addr.arpa.", RecordType::PTR);
    let names: Vec<String> = m
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::PTR(p) => Some(p.0.to_ascii()),
            _ => None,
        })
        .collect();
    assert_eq!(names, vec!["web.mesh.internal."]);
    let m = ask(
        "3.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.",
        RecordType::PTR,
    );
    // fd00::3 is outside the IPv4 mesh range: not ours.
    assert_eq!(m.metadata.response_code, ResponseCode::Refused);
    for denied in ["4.0.64.10.in-addr.arpa.", "9.9.64.10.in-addr.arpa."] {
        let m = ask(denied, RecordType::PTR);
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{denied}");
        assert_eq!(soa_owner(&m).as_deref(), Some("64.10.in-addr.arpa."));
    }
    let m = ask("64.10.in-addr.arpa.", RecordType::SOA);
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(m.answers.len(), 1);
    let m = ask("0.64.10.in-addr.arpa.", RecordType::PTR);
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.answers.is_empty());
}

#[test]
fn answers_are_never_answered_and_broken_queries_are_formerr() {
    let mut m = query("web.mesh.internal.", RecordType::A);
    m.metadata.message_type = MessageType::Response;
    let bytes = m.to_vec().expect("encode");
    assert_eq!(
        answer(Some(&zone()), &bytes, Transport::Udp),
        None,
        "no loops"
    );
    assert_eq!(
        answer(Some(&zone()), &[0x12, 0x34, 0x01], Transport::Udp),
        None
    );
    let garbage = [
        0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0xff, 0xff,
    ];
    let out = answer(Some(&zone()), &garbage, Transport::Udp).expect("FORMERR");
    let m = Message::from_vec(&out).expect("decode");
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    assert_eq!(m.metadata.id, 0x1234);
    let mut two = query("web.mesh.internal.", RecordType::A);
    two.add_query(Query::query(
        Name::from_str("db.mesh.internal.").expect("n"),
        RecordType::A,
    ));
    let m = ask_with(Some(&zone()), &two, Transport::Udp);
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    let mut update = query("web.mesh.internal.", RecordType::A);
    update.metadata.op_code = OpCode::Update;
    let m = ask_with(Some(&zone()), &update, Transport::Udp);
    assert_eq!(m.metadata.response_code, ResponseCode::NotImp);
}

#[test]
fn edns_is_answered_with_our_size_and_bad_versions_with_badvers() {
    let mut m = query("web.mesh.internal.", RecordType::A);
    let mut e = Edns::new();
    e.set_max_payload(4096);
    m.set_edns(e.clone());
    let out = ask_with(Some(&zone()), &m, Transport::Udp);
    assert_eq!(
        out.edns.as_ref().map(|e| e.max_payload()),
        Some(super::UDP_PAYLOAD)
    );
    e.set_version(1);
    m.set_edns(e);
    let out = ask_with(Some(&zone()), &m, Transport::Udp);
    // BADVERS and BADSIG share the value 16 (RFC 6891); the decoder names it BADSIG.
    assert_eq!(u16::from(out.metadata.response_code), 16);
}

/// A zone where one name has more addresses than fit in 512 bytes.
fn big_zone() -> Zone {
    let dns = dns();
    let own: Vec<IpAddr> = (1..=60u16)
        .map(|i| IpAddr::V4(std::net::Ipv4Addr::new(10, 64, 1, i as u8)))
        .collect();
    let view = NodeView {
        node: Uuid::from_u128(1),
        addrs: own.clone(),
        grants: vec![],
        peers: vec![],
    };
    Zone::build(ZoneInput {
        dns: Some(&dns),
        own_addrs: &own,
        mesh: "10.64.0.0/16".parse().expect("net"),
        peers: &[],
        view: Some(&view),
    })
    .expect("zone")
}

#[test]
fn udp_answers_over_the_size_are_truncated_and_tcp_carries_them_whole() {
    let z = big_zone();
    let q = query("self.mesh.internal.", RecordType::A);
    let udp = ask_with(Some(&z), &q, Transport::Udp);
    assert!(udp.metadata.truncation, "TC over UDP without EDNS");
    assert!(udp.answers.is_empty());
    assert_eq!(udp.queries.len(), 1);
    let tcp = ask_with(Some(&z), &q, Transport::Tcp);
    assert!(!tcp.metadata.truncation);
    assert_eq!(tcp.answers.len(), 60);
    let mut big = q.clone();
    let mut e = Edns::new();
    e.set_max_payload(1232);
    big.set_edns(e);
    let udp = ask_with(Some(&z), &big, Transport::Udp);
    assert!(!udp.metadata.truncation, "60 A records fit 1232 bytes");
    assert_eq!(udp.answers.len(), 60);
}

#[test]
fn without_a_policy_every_named_peer_answers_and_odd_names_are_left_out() {
    let dns = dns();
    let peers = vec![
        peer(2, Some("web"), "10.64.0.2"),
        peer(3, Some("Bad_Name"), "10.64.0.3"),
        peer(4, Some("self"), "10.64.0.4"),
        peer(5, Some("web"), "10.64.0.5"),
        peer(6, Some("evil.example.com"), "10.64.0.6"),
    ];
    let z = Zone::build(ZoneInput {
        dns: Some(&dns),
        own_addrs: &[ip("10.64.0.1")],
        mesh: "10.64.0.0/16".parse().expect("net"),
        peers: &peers,
        view: None,
    })
    .expect("zone");
    assert_eq!(z.len(), 2);
    assert_eq!(
        z.lookup(b"web"),
        Some(&[ip("10.64.0.2")][..]),
        "the smaller id keeps a duplicate name"
    );
    assert_eq!(
        z.lookup(b"self"),
        Some(&[ip("10.64.0.1")][..]),
        "this node keeps its own name"
    );
    assert_eq!(z.skipped().len(), 4, "{:?}", z.skipped());
    let bad_suffix = DnsState {
        suffix: "Mesh..internal".to_owned(),
        name: "self".to_owned(),
    };
    let none = Zone::build(ZoneInput {
        dns: Some(&bad_suffix),
        own_addrs: &[],
        mesh: "10.64.0.0/16".parse().expect("net"),
        peers: &peers,
        view: None,
    });
    assert!(none.is_none());
}

proptest! {
    #[test]
    fn no_input_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let z = zone();
        for t in [Transport::Udp, Transport::Tcp] {
            if let Some(out) = answer(Some(&z), &bytes, t) {
                let m = Message::from_vec(&out).expect("our answers parse");
                prop_assert_eq!(m.metadata.message_type, MessageType::Response);
                prop_assert!(!m.metadata.recursion_available);
                if t == Transport::Udp {
                    prop_assert!(out.len() <= usize::from(super::UDP_PAYLOAD));
                }
            }
        }
    }

    #[test]
    fn mutated_queries_never_panic(name in "[a-zA-Z0-9.-]{0,80}", qtype in any::<u16>(), flip in any::<(usize, u8)>()) {
        let Ok(n) = Name::from_str(&name) else { return Ok(()) };
        let mut m = Message::new(7, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(n, RecordType::from(qtype)));
        let Ok(mut bytes) = m.to_vec() else { return Ok(()) };
        let i = flip.0 % bytes.len();
        bytes[i] ^= flip.1;
        let _ = answer(Some(&zone()), &bytes, Transport::Udp);
    }
}
