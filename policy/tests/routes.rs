//! Routed traffic (issue 27): a client A opening flows through its router R into R's LAN,
//! R forwarding them and letting only their replies back, on real packet bytes; the
//! longest prefix among one peer's prefixes; pruning after a change; the per-peer bound;
//! the flattening of nested prefixes against a brute-force longest-prefix match.
#![allow(clippy::unwrap_used)] // test helpers: a failure here is a test failure

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use ipnet::IpNet;
use plexsphere_policy::decide::{Accept, Drop, inbound_bytes, outbound_bytes, prune_peer_flows};
use plexsphere_policy::filter::{MAX_ROUTE_PREFIXES_PER_PEER, disjoint};
use plexsphere_policy::view::{NodeView, PeerView, RouteGrant};
use plexsphere_policy::{
    Access, Decision, FlowTable, Grant, NodeFilter, PortRange, PortSet, Proto, ViewError,
    prune_flows,
};
use proptest::prelude::*;
use uuid::Uuid;

const A: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 1); // the client
const R: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 2); // the router
const C: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 3); // a peer of R with no route
/// In R's LAN 10.1.0.0/24 (db: tcp 5432 and icmp).
const H: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 50);
/// In 10.1.0.0/28, nested in the /24 with its own grant (ssh: tcp 22 only).
const H2: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 9);
/// Outside every route.
const OUT: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 1);

fn id(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

fn grant(tcp: &[u16], icmp: bool) -> Grant {
    Grant {
        access: Access {
            tcp: PortSet::from_ranges(tcp.iter().map(|&p| PortRange { first: p, last: p })),
            udp: PortSet::empty(),
            icmp,
            other: false,
        },
        lines: vec![1],
    }
}

fn routes() -> Vec<RouteGrant> {
    vec![
        RouteGrant {
            prefix: "10.1.0.0/24".parse().unwrap(),
            grant: 0,
        },
        RouteGrant {
            prefix: "10.1.0.0/28".parse().unwrap(),
            grant: 1,
        },
    ]
}

fn peer(n: u128, addr: Ipv4Addr, out: Vec<RouteGrant>, inb: Vec<RouteGrant>) -> PeerView {
    PeerView {
        id: id(n),
        name: format!("n{n}"),
        addrs: vec![addr.into()],
        inbound: None,
        outbound: None,
        routes_out: out,
        routes_in: inb,
    }
}

/// A's view (R its router) and R's (A a client, C a peer with no route).
fn views(routes_of_a: Vec<RouteGrant>) -> (NodeView, NodeView) {
    let grants = vec![grant(&[5432], true), grant(&[22], false)];
    let a = NodeView {
        node: id(1),
        addrs: vec![A.into()],
        grants: grants.clone(),
        peers: vec![peer(2, R, routes_of_a.clone(), Vec::new())],
    };
    let r = NodeView {
        node: id(2),
        addrs: vec![R.into()],
        grants,
        peers: vec![
            peer(1, A, Vec::new(), routes_of_a),
            peer(3, C, Vec::new(), Vec::new()),
        ],
    };
    (a, r)
}

fn filters() -> (NodeFilter, NodeFilter) {
    let (a, r) = views(routes());
    (NodeFilter::new(&a).unwrap(), NodeFilter::new(&r).unwrap())
}

fn v4(proto: u8, src: Ipv4Addr, dst: Ipv4Addr, l4: &[u8]) -> Vec<u8> {
    let total = u16::try_from(20 + l4.len()).unwrap();
    let mut p = vec![0x45, 0];
    p.extend_from_slice(&total.to_be_bytes());
    p.extend_from_slice(&[0, 1, 0, 0, 64, proto, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(l4);
    p
}

fn tcp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[12] = 0x50;
    v4(6, src, dst, &t)
}

fn icmp(src: Ipv4Addr, dst: Ipv4Addr, kind: u8, id: u16, quoted: &[u8]) -> Vec<u8> {
    let mut t = vec![kind, 0, 0, 0];
    t.extend_from_slice(&id.to_be_bytes());
    t.extend_from_slice(&[0, 1]);
    t.extend_from_slice(quoted);
    v4(1, src, dst, &t)
}

/// An ICMP port unreachable from `src` to `dst` quoting `about`'s first 28 bytes.
fn unreachable(src: Ipv4Addr, dst: Ipv4Addr, about: &[u8]) -> Vec<u8> {
    let mut t = vec![3, 3, 0, 0, 0, 0, 0, 0];
    t.extend_from_slice(&about[..28]);
    v4(1, src, dst, &t)
}

fn denied(proto: Proto, port: u16) -> Decision {
    Decision::Drop(Drop::RouteDenied { proto, port })
}

const RULE: Decision = Decision::Accept(Accept::Rule);
const REPLY: Decision = Decision::Accept(Accept::Reply);
const ICMP_ERROR: Decision = Decision::Accept(Accept::IcmpError);

#[test]
fn a_client_opens_only_granted_flows_through_its_router_and_gets_only_their_replies() {
    let (a, _) = filters();
    let r = a.peer(&id(2));
    let now = Instant::now();
    let mut flows = FlowTable::default();
    let out = |p: &[u8], f: &mut FlowTable| outbound_bytes(&a, r, p, f, now);
    // The /24's grant: tcp 5432 and icmp.
    assert_eq!(out(&tcp(A, 40000, H, 5432), &mut flows), RULE);
    assert_eq!(
        out(&tcp(A, 40001, H, 22), &mut flows),
        denied(Proto::Tcp, 22)
    );
    // The longest prefix decides: the /28 inside it grants tcp 22 and nothing else.
    assert_eq!(out(&tcp(A, 40002, H2, 22), &mut flows), RULE);
    assert_eq!(
        out(&tcp(A, 40003, H2, 5432), &mut flows),
        denied(Proto::Tcp, 5432)
    );
    // Neither the router's address nor one of its routes.
    assert_eq!(
        out(&tcp(A, 40004, OUT, 5432), &mut flows),
        denied(Proto::Tcp, 5432)
    );
    assert_eq!(out(&icmp(A, H, 8, 7, &[]), &mut flows), RULE);

    let inb = |p: &[u8], f: &mut FlowTable| inbound_bytes(&a, r, p, f, now);
    assert_eq!(inb(&tcp(H, 5432, A, 40000), &mut flows), REPLY);
    assert_eq!(inb(&tcp(H2, 22, A, 40002), &mut flows), REPLY);
    assert_eq!(inb(&icmp(H, A, 0, 7, &[]), &mut flows), REPLY);
    // A reply injected from the LAN without a flow, and a LAN host opening a flow here.
    assert_eq!(
        inb(&tcp(H, 5432, A, 40009), &mut flows),
        denied(Proto::Tcp, 40009)
    );
    assert_eq!(
        inb(&tcp(H, 5555, A, 22), &mut flows),
        denied(Proto::Tcp, 22)
    );
    assert_eq!(
        inb(&icmp(H, A, 0, 8, &[]), &mut flows),
        denied(Proto::Icmp, 0)
    );
    // A source outside the router's routes is spoofed.
    assert_eq!(
        inb(&tcp(OUT, 5432, A, 40000), &mut flows),
        Decision::Drop(Drop::SpoofedSource)
    );
    // ICMP errors about this node's flow through the router: from the router itself or
    // from the LAN; about a flow it never opened: dropped.
    let ours = tcp(A, 40000, H, 5432);
    assert_eq!(inb(&unreachable(R, A, &ours), &mut flows), ICMP_ERROR);
    assert_eq!(inb(&unreachable(H, A, &ours), &mut flows), ICMP_ERROR);
    let never = tcp(A, 41000, H, 5432);
    assert_eq!(
        inb(&unreachable(R, A, &never), &mut flows),
        denied(Proto::Icmp, 0)
    );
}

#[test]
fn a_router_forwards_only_granted_flows_of_its_clients_and_only_their_replies_back() {
    let (_, r) = filters();
    let (pa, pc) = (r.peer(&id(1)), r.peer(&id(3)));
    let now = Instant::now();
    let mut flows = FlowTable::default();
    let from_a = |p: &[u8], f: &mut FlowTable| inbound_bytes(&r, pa, p, f, now);
    assert_eq!(from_a(&tcp(A, 40000, H, 5432), &mut flows), RULE);
    assert_eq!(from_a(&icmp(A, H, 8, 7, &[]), &mut flows), RULE);
    assert_eq!(
        from_a(&tcp(A, 40001, H, 22), &mut flows),
        denied(Proto::Tcp, 22)
    );
    assert_eq!(from_a(&tcp(A, 40002, H2, 22), &mut flows), RULE);
    // A prefix the client was not granted, and a spoofed (another node's) source.
    assert_eq!(
        from_a(&tcp(A, 40003, OUT, 5432), &mut flows),
        Decision::Drop(Drop::NotForThisNode)
    );
    assert_eq!(
        from_a(&tcp(C, 40000, H, 5432), &mut flows),
        Decision::Drop(Drop::SpoofedSource)
    );
    // A peer with no route through this node gets nothing forwarded.
    let mut none = FlowTable::default();
    assert_eq!(
        inbound_bytes(&r, pc, &tcp(C, 40000, H, 5432), &mut none, now),
        Decision::Drop(Drop::NotForThisNode)
    );

    let to_a = |p: &[u8], f: &mut FlowTable| outbound_bytes(&r, pa, p, f, now);
    assert_eq!(to_a(&tcp(H, 5432, A, 40000), &mut flows), REPLY);
    assert_eq!(to_a(&tcp(H2, 22, A, 40002), &mut flows), REPLY);
    assert_eq!(to_a(&icmp(H, A, 0, 7, &[]), &mut flows), REPLY);
    // Injected from the LAN without a flow; a LAN host opening a flow to the client.
    assert_eq!(
        to_a(&tcp(H, 5432, A, 40099), &mut flows),
        denied(Proto::Tcp, 40099)
    );
    assert_eq!(
        to_a(&tcp(H, 999, A, 22), &mut flows),
        denied(Proto::Tcp, 22)
    );
    // The refused flow above was not recorded.
    assert_eq!(
        to_a(&tcp(H, 22, A, 40001), &mut flows),
        denied(Proto::Tcp, 40001)
    );
    // From outside the client's routes: not this node's to send.
    assert_eq!(
        to_a(&tcp(OUT, 5432, A, 40000), &mut flows),
        Decision::Drop(Drop::NotFromThisNode)
    );
    // The LAN's ICMP error about the client's flow goes back to it; one about no flow not.
    assert_eq!(
        to_a(&unreachable(H, A, &tcp(A, 40000, H, 5432)), &mut flows),
        ICMP_ERROR
    );
    assert_eq!(
        to_a(&unreachable(H, A, &tcp(A, 41000, H, 5432)), &mut flows),
        denied(Proto::Icmp, 0)
    );
    // The client's error about a reply of its flow reaches the LAN host.
    assert_eq!(
        inbound_bytes(
            &r,
            pa,
            &unreachable(A, H2, &tcp(H2, 22, A, 40002)),
            &mut flows,
            now
        ),
        ICMP_ERROR
    );
}

#[test]
fn a_change_prunes_the_route_flows_it_no_longer_grants_on_both_sides() {
    let (a, r) = filters();
    let now = Instant::now();
    let (mut fa, mut fr) = (FlowTable::default(), FlowTable::default());
    let (pr, pa) = (a.peer(&id(2)), r.peer(&id(1)));
    for (src, sport, dst, dport) in [(A, 40000, H, 5432), (A, 40002, H2, 22)] {
        assert!(outbound_bytes(&a, pr, &tcp(src, sport, dst, dport), &mut fa, now).is_accept());
        assert!(inbound_bytes(&r, pa, &tcp(src, sport, dst, dport), &mut fr, now).is_accept());
    }
    // The same grants: everything stays (prune_flows keeps the router's flows too).
    prune_peer_flows(&a, pr, &mut fa);
    prune_peer_flows(&r, pa, &mut fr);
    assert_eq!((fa.len(), fr.len()), (2, 2));
    prune_flows(&r, &mut fr);
    assert_eq!(fr.len(), 2);
    // The /28 is withdrawn: its flows go; the /24 (which now holds H2, without tcp 22) stays.
    let (a2, r2) = views(routes()[..1].to_vec());
    let (a2, r2) = (NodeFilter::new(&a2).unwrap(), NodeFilter::new(&r2).unwrap());
    prune_peer_flows(&a2, a2.peer(&id(2)), &mut fa);
    prune_peer_flows(&r2, r2.peer(&id(1)), &mut fr);
    assert_eq!((fa.len(), fr.len()), (1, 1));
    assert_eq!(
        outbound_bytes(&r2, r2.peer(&id(1)), &tcp(H2, 22, A, 40002), &mut fr, now),
        denied(Proto::Tcp, 40002)
    );
    assert_eq!(
        inbound_bytes(&a2, a2.peer(&id(2)), &tcp(H, 5432, A, 40000), &mut fa, now),
        REPLY
    );
    // No route at all any more: nothing is left, on either side.
    let (a3, r3) = views(Vec::new());
    let (a3, r3) = (NodeFilter::new(&a3).unwrap(), NodeFilter::new(&r3).unwrap());
    prune_peer_flows(&a3, a3.peer(&id(2)), &mut fa);
    prune_peer_flows(&r3, r3.peer(&id(1)), &mut fr);
    assert_eq!((fa.len(), fr.len()), (0, 0));
}

#[test]
fn a_view_with_too_many_route_prefixes_or_a_bad_route_grant_is_refused() {
    let many: Vec<RouteGrant> = (0..=MAX_ROUTE_PREFIXES_PER_PEER)
        .map(|i| RouteGrant {
            prefix: IpNet::new(
                IpAddr::V4(Ipv4Addr::from(0x0a01_0000 + (i as u32) * 256)),
                24,
            )
            .unwrap(),
            grant: 0,
        })
        .collect();
    let (a, r) = views(many.clone());
    assert!(matches!(
        NodeFilter::new(&a),
        Err(ViewError::TooManyRoutePrefixes { count, .. }) if count == MAX_ROUTE_PREFIXES_PER_PEER + 1
    ));
    assert!(matches!(
        NodeFilter::new(&r),
        Err(ViewError::TooManyRoutePrefixes { .. })
    ));
    let (a, _) = views(many[..MAX_ROUTE_PREFIXES_PER_PEER].to_vec());
    assert!(NodeFilter::new(&a).is_ok(), "the limit itself is allowed");
    let (a, _) = views(vec![RouteGrant {
        prefix: "10.1.0.0/24".parse().unwrap(),
        grant: 9,
    }]);
    assert!(matches!(
        NodeFilter::new(&a),
        Err(ViewError::BadGrant { index: 9, .. })
    ));
}

#[test]
fn an_exit_covers_the_whole_address_space_up_to_its_last_address() {
    let exit = vec![
        RouteGrant {
            prefix: "0.0.0.0/0".parse().unwrap(),
            grant: 0,
        },
        RouteGrant {
            prefix: "::/0".parse().unwrap(),
            grant: 0,
        },
    ];
    let (a, _) = views(exit);
    let a = NodeFilter::new(&a).unwrap();
    let r = a.peer(&id(2)).unwrap();
    for addr in [
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V4(Ipv4Addr::BROADCAST),
        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        IpAddr::V6(Ipv6Addr::from(u128::MAX)),
    ] {
        assert_eq!(a.route_out_allows(r, &addr, Proto::Tcp, 5432), Some(true));
        assert_eq!(a.route_out_allows(r, &addr, Proto::Tcp, 22), Some(false));
        assert_eq!(a.route_in_allows(r, &addr, Proto::Tcp, 5432), None);
    }
}

/// The brute-force longest-prefix match (first of equal prefixes).
fn longest(prefixes: &[(IpNet, u32)], a: IpAddr) -> Option<u32> {
    let mut best: Option<(u8, u32)> = None;
    for (p, v) in prefixes {
        if p.contains(&a) && best.is_none_or(|(l, _)| p.prefix_len() > l) {
            best = Some((p.prefix_len(), *v));
        }
    }
    best.map(|(_, v)| v)
}

fn found(ranges: &[(IpAddr, IpAddr, u32)], a: IpAddr) -> Option<u32> {
    let hits: Vec<u32> = ranges
        .iter()
        .filter(|(s, e, _)| s.is_ipv4() == a.is_ipv4() && *s <= a && a <= *e)
        .map(|r| r.2)
        .collect();
    assert!(hits.len() <= 1, "ranges overlap at {a}: {ranges:?}");
    hits.first().copied()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Nested, equal and disjoint prefixes of both families flatten into disjoint ranges
    /// that answer every address like the longest-prefix match (in a small space, so the
    /// prefixes meet often), and the filter's lookup answers the same.
    #[test]
    fn flattened_prefixes_match_the_longest_prefix(
        v4s in prop::collection::vec((0u32..64, 26u8..=32, 0u32..4), 0..24),
        v6s in prop::collection::vec((0u128..64, 122u8..=128, 0u32..4), 0..8),
        probes in prop::collection::vec(0u32..72, 16),
    ) {
        let mut prefixes: Vec<(IpNet, u32)> = Vec::new();
        for (x, len, v) in v4s {
            let a = IpAddr::V4(Ipv4Addr::from(0x0a01_0000 + x));
            prefixes.push((IpNet::new(a, len).unwrap().trunc(), v));
        }
        for (x, len, v) in v6s {
            let a = IpAddr::V6(Ipv6Addr::from((0xfd01_u128 << 112) + x));
            prefixes.push((IpNet::new(a, len).unwrap().trunc(), v));
        }
        let ranges = disjoint(&prefixes);
        let grants = vec![grant(&[1], false), grant(&[2], false), grant(&[3], false), grant(&[4], false)];
        let routes: Vec<RouteGrant> = prefixes.iter().map(|(p, g)| RouteGrant { prefix: *p, grant: *g }).collect();
        let view = NodeView {
            node: id(1),
            addrs: vec![A.into()],
            grants,
            peers: vec![peer(2, R, routes, Vec::new())],
        };
        let f = NodeFilter::new(&view).unwrap();
        let r = f.peer(&id(2)).unwrap();
        for x in probes {
            for a in [
                IpAddr::V4(Ipv4Addr::from(0x0a01_0000 + x)),
                IpAddr::V6(Ipv6Addr::from((0xfd01_u128 << 112) + u128::from(x))),
            ] {
                let want = longest(&prefixes, a);
                prop_assert_eq!(found(&ranges, a), want, "ranges at {}", a);
                let port = want.map_or(1, |g| u16::try_from(g + 1).unwrap());
                prop_assert_eq!(f.route_out_allows(r, &a, Proto::Tcp, port), want.map(|_| true));
            }
        }
    }
}
