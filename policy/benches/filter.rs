//! The policy filter's cost per packet with 10, 1,000 and 10,000 rules (it must stay flat:
//! a compiled lookup, never a scan), next to the plain evaluator that does scan; and the
//! compile time for 10,000 nodes x 1,000 rules, plus one node's view from it.
//!
//! Routed traffic (issue 27): the router's decision on a client's packet into a served
//! prefix and the client's on its packet into a route, with 1 and 256 prefixes a peer (the
//! longest-prefix lookup is a binary search in the peer's ranges), beside the direct
//! decision of the same hand-made view.
//!
//! Run: `cargo bench -p plexsphere-policy --bench filter -- --quick`

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use plexsphere_policy::packet::L4;
use plexsphere_policy::view::{NodeView, PeerView, RouteGrant};
use plexsphere_policy::{
    Access, Compiled, FlowTable, Grant, Inventory, NodeFilter, NodeInfo, Packet, Policy, PortRange,
    PortSet, ProjectInfo, Proto, eval, inbound, inbound_bytes, outbound, parse,
};
use uuid::Uuid;

const ROLES: usize = 40;
const PROJECTS: usize = 20;

/// `n` nodes: node i has role tag `r{i % ROLES}`, an env tag, a Project.
fn inventory(n: usize) -> Inventory {
    let projects: Vec<ProjectInfo> = (0..PROJECTS)
        .map(|p| ProjectInfo {
            id: Uuid::from_u128(0x10_0000 + p as u128),
            slug: format!("p{p}"),
        })
        .collect();
    let nodes = (0..n)
        .map(|i| {
            let p = &projects[(i / 7) % PROJECTS];
            let env = ["prod", "staging", "dev"][i % 3];
            NodeInfo {
                id: Uuid::from_u128(i as u128 + 1),
                name: format!("n{i}"),
                project_id: p.id,
                project_slug: p.slug.clone(),
                tags: vec![format!("r{}", i % ROLES), env.to_string()],
                ipv4: Some(Ipv4Addr::from(0x0a40_0000u32 + i as u32 + 1)),
                ipv6: Some(Ipv6Addr::from(0xfd00_u128 << 112 | (i as u128 + 1))),
            }
        })
        .collect();
    Inventory {
        projects,
        nodes,
        tags: Vec::new(),
    }
}

/// `rules` rules between roles, with subtraction, projects, node names and port ranges;
/// the one the packet matches (r1 -> r0 tcp 5432) is in the middle.
fn document(rules: usize, nodes: usize) -> String {
    let mut doc = String::from("groups:\n  apps: [tag:r1, tag:r2, tag:r3]\nrules:\n");
    for i in 0..rules {
        if i == rules / 2 {
            doc.push_str("  - {src: tag:r1, dst: tag:r0, proto: tcp, ports: 5432}\n");
            continue;
        }
        let (s, d) = ((i * 7 + 3) % ROLES, (i * 13 + 5) % ROLES);
        let port = 1000 + (i % 50_000) as u16;
        let line = match i % 5 {
            0 => format!(
                "  - {{src: 'tag:r{s} - tag:dev', dst: tag:r{d}, proto: tcp, ports: {port}}}\n"
            ),
            1 => format!(
                "  - {{src: project:p{}, dst: tag:r{d}, proto: udp, ports: {port}-{}}}\n",
                i % PROJECTS,
                port + 10
            ),
            2 => format!(
                "  - {{src: group:apps, dst: tag:r{d}, proto: [tcp, udp], ports: [{port}, 443]}}\n"
            ),
            3 => format!(
                "  - {{src: node:n{}, dst: tag:r{d}, proto: tcp, ports: {port}}}\n",
                i % nodes
            ),
            _ => format!("  - {{src: tag:r{s}, dst: tag:r{d}, proto: icmp}}\n"),
        };
        doc.push_str(&line);
    }
    doc
}

fn policy(rules: usize, nodes: usize) -> Policy {
    match parse(&document(rules, nodes)) {
        Ok(p) => p,
        Err(e) => panic!("bench document: {e}"),
    }
}

fn tcp_packet(src: &NodeInfo, dst: &NodeInfo) -> Vec<u8> {
    let mut p = vec![0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0];
    p.extend_from_slice(&src.ipv4.map(|a| a.octets()).unwrap_or_default());
    p.extend_from_slice(&dst.ipv4.map(|a| a.octets()).unwrap_or_default());
    p.extend_from_slice(&40000u16.to_be_bytes());
    p.extend_from_slice(&5432u16.to_be_bytes());
    p.extend_from_slice(&[0; 8]);
    p.extend_from_slice(&[0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    p
}

fn per_packet(c: &mut Criterion) {
    let inv = inventory(1_000);
    // Node 0 has role r0 (the destination), node 1 role r1 (the source).
    let (dst, src) = (&inv.nodes[0], &inv.nodes[1]);
    let mut g = c.benchmark_group("policy_per_packet");
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    for rules in [10usize, 1_000, 10_000] {
        let p = policy(rules, inv.nodes.len());
        let compiled = Compiled::new(&p, &inv);
        let Some(view) = compiled.node_view(dst.id) else {
            return;
        };
        let Ok(filter) = NodeFilter::new(&view) else {
            return;
        };
        let peer = filter.peer(&src.id);
        let bytes = tcp_packet(src, dst);
        let pkt = Packet {
            src: src.ipv4.unwrap_or(Ipv4Addr::UNSPECIFIED).into(),
            dst: dst.ipv4.unwrap_or(Ipv4Addr::UNSPECIFIED).into(),
            l4: L4::Tcp {
                sport: 40000,
                dport: 5432,
            },
        };
        let mut flows = FlowTable::default();
        let now = Instant::now();
        assert!(inbound(&filter, peer, &pkt, &mut flows, now).is_accept());
        g.bench_with_input(BenchmarkId::new("decide_parsed", rules), &rules, |b, _| {
            b.iter(|| inbound(&filter, black_box(peer), black_box(&pkt), &mut flows, now))
        });
        g.bench_with_input(
            BenchmarkId::new("parse_and_decide", rules),
            &rules,
            |b, _| {
                b.iter(|| {
                    inbound_bytes(&filter, black_box(peer), black_box(&bytes), &mut flows, now)
                })
            },
        );
        if rules <= 1_000 {
            g.bench_with_input(
                BenchmarkId::new("plain_evaluator_scan", rules),
                &rules,
                |b, _| {
                    b.iter(|| eval::decide(&p, black_box(src), black_box(dst), Proto::Tcp, 5432))
                },
            );
        }
    }
    g.finish();
}

fn compile(c: &mut Criterion) {
    let inv = inventory(10_000);
    let p = policy(1_000, inv.nodes.len());
    let mut g = c.benchmark_group("policy_compile");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(1));
    g.bench_function("10000_nodes_1000_rules", |b| {
        b.iter(|| Compiled::new(black_box(&p), &inv))
    });
    let compiled = Compiled::new(&p, &inv);
    let (s, d) = compiled.class_counts();
    eprintln!("10,000 nodes x 1,000 rules: {s} source classes, {d} destination classes");
    let id = inv.nodes[0].id;
    g.bench_function("one_node_view_of_10000", |b| {
        b.iter(|| compiled.node_view(black_box(id)))
    });
    let on_demand = compiled.clone().untabulated();
    g.bench_function("one_node_view_of_10000_untabulated", |b| {
        b.iter(|| on_demand.node_view(black_box(id)))
    });
    g.bench_function("all_10000_views", |b| {
        b.iter(|| {
            inv.nodes
                .iter()
                .filter_map(|n| compiled.node_view(n.id))
                .map(|v| v.peers.len())
                .sum::<usize>()
        })
    });
    g.finish();
}

/// A router (10.64.0.2) serving client 10.64.0.1 `prefixes` /24s of 10.128.0.0/9 with four
/// grants in turn (one of them tcp 5432), and the client's view of it; the client may also
/// open tcp 5432 on the router itself (the direct case).
fn routed_views(prefixes: usize) -> (NodeView, NodeView) {
    let grants: Vec<Grant> = (0..4u16)
        .map(|i| Grant {
            access: Access {
                tcp: PortSet::from_ranges([PortRange {
                    first: 5432 + i * 10,
                    last: 5432 + i * 10,
                }]),
                udp: PortSet::empty(),
                icmp: i == 0,
                other: false,
            },
            lines: vec![u32::from(i) + 1],
        })
        .collect();
    let routes: Vec<RouteGrant> = (0..prefixes)
        .map(|i| RouteGrant {
            prefix: ipnet::IpNet::new(Ipv4Addr::from(0x0a80_0000 + (i as u32) * 256).into(), 24)
                .unwrap_or_default(),
            grant: if i + 1 == prefixes {
                0
            } else {
                (i % 3) as u32 + 1
            },
        })
        .collect();
    let peer = |n: u8, out: Vec<RouteGrant>, inb: Vec<RouteGrant>| PeerView {
        id: Uuid::from_u128(u128::from(n)),
        name: format!("n{n}"),
        addrs: vec![Ipv4Addr::new(10, 64, 0, n).into()],
        inbound: (n == 1).then_some(0),
        outbound: (n == 2).then_some(0),
        routes_out: out,
        routes_in: inb,
    };
    let view = |n: u8, p: PeerView| NodeView {
        node: Uuid::from_u128(u128::from(n)),
        addrs: vec![Ipv4Addr::new(10, 64, 0, n).into()],
        grants: grants.clone(),
        peers: vec![p],
    };
    (
        view(2, peer(1, Vec::new(), routes.clone())),
        view(1, peer(2, routes, Vec::new())),
    )
}

fn routed(c: &mut Criterion) {
    let mut g = c.benchmark_group("policy_routed");
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    let tcp = |src: Ipv4Addr, dst: Ipv4Addr| Packet {
        src: src.into(),
        dst: dst.into(),
        l4: L4::Tcp {
            sport: 40000,
            dport: 5432,
        },
    };
    let (client, router) = (Ipv4Addr::new(10, 64, 0, 1), Ipv4Addr::new(10, 64, 0, 2));
    for prefixes in [1usize, 256] {
        let (rv, cv) = routed_views(prefixes);
        let (Ok(rf), Ok(cf)) = (NodeFilter::new(&rv), NodeFilter::new(&cv)) else {
            return;
        };
        let (rp, cp) = (rf.peer(&Uuid::from_u128(1)), cf.peer(&Uuid::from_u128(2)));
        // The last prefix: the one with the tcp 5432 grant.
        let host = Ipv4Addr::from(0x0a80_0000 + (prefixes as u32 - 1) * 256 + 50);
        let now = Instant::now();
        let mut flows = FlowTable::default();
        let (fwd, open, direct) = (tcp(client, host), tcp(client, host), tcp(client, router));
        assert!(inbound(&rf, rp, &fwd, &mut flows, now).is_accept());
        assert!(outbound(&cf, cp, &open, &mut flows, now).is_accept());
        assert!(inbound(&rf, rp, &direct, &mut flows, now).is_accept());
        g.bench_with_input(
            BenchmarkId::new("router_forward_decide", prefixes),
            &prefixes,
            |b, _| b.iter(|| inbound(&rf, black_box(rp), black_box(&fwd), &mut flows, now)),
        );
        g.bench_with_input(
            BenchmarkId::new("client_open_decide", prefixes),
            &prefixes,
            |b, _| b.iter(|| outbound(&cf, black_box(cp), black_box(&open), &mut flows, now)),
        );
        g.bench_with_input(
            BenchmarkId::new("direct_decide_same_view", prefixes),
            &prefixes,
            |b, _| b.iter(|| inbound(&rf, black_box(rp), black_box(&direct), &mut flows, now)),
        );
    }
    g.finish();
}

criterion_group!(benches, per_packet, compile, routed);
criterion_main!(benches);
