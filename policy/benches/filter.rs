//! The policy filter's cost per packet with 10, 1,000 and 10,000 rules (it must stay flat:
//! a compiled lookup, never a scan), next to the plain evaluator that does scan; and the
//! compile time for 10,000 nodes x 1,000 rules, plus one node's view from it.
//!
//! Run: `cargo bench -p plexsphere-policy --bench filter -- --quick`

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use plexsphere_policy::packet::L4;
use plexsphere_policy::{
    Compiled, FlowTable, Inventory, NodeFilter, NodeInfo, Packet, Policy, ProjectInfo, Proto, eval,
    inbound, inbound_bytes, parse,
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

criterion_group!(benches, per_packet, compile);
criterion_main!(benches);
