//! Property tests: over random small policies (tags, projects, nodes, CIDRs, groups,
//! subtraction, ports, protocols) and inventories, every node's compiled filter agrees
//! with the plain evaluator on every pair and packet kind, and so does the peer set. And
//! no input makes the parsers panic.
#![allow(clippy::unwrap_used)] // test helpers: a failure here is a test failure

mod common;

use std::time::Instant;

use plexsphere_policy::eval::{self, Verdict};
use plexsphere_policy::packet::{Icmp, L4};
use plexsphere_policy::{
    Compiled, FlowKey, FlowTable, Inventory, NodeFilter, Packet, Proto, inbound, parse,
    parse_packet, reach_diff,
};
use proptest::prelude::*;

const TAGS: [&str; 4] = ["a", "b", "c", "d"];
const PROJECTS: [&str; 2] = ["p1", "p2"];

fn inventory_strategy() -> impl Strategy<Value = Vec<(usize, Vec<bool>)>> {
    prop::collection::vec((0..2usize, prop::collection::vec(any::<bool>(), 4)), 2..8)
}

fn build_inventory(spec: &[(usize, Vec<bool>)]) -> Inventory {
    let names: Vec<String> = (0..spec.len()).map(|i| format!("n{i}")).collect();
    let tags: Vec<Vec<&str>> = spec
        .iter()
        .map(|(_, t)| {
            TAGS.iter()
                .zip(t)
                .filter(|(_, on)| **on)
                .map(|(n, _)| *n)
                .collect()
        })
        .collect();
    let rows: Vec<(&str, &str, &[&str])> = spec
        .iter()
        .enumerate()
        .map(|(i, (p, _))| (names[i].as_str(), PROJECTS[*p], tags[i].as_slice()))
        .collect();
    common::inventory(&rows)
}

/// An atom; `groups` is how many groups it may name (g0..).
fn atom(groups: usize) -> BoxedStrategy<String> {
    let mut choices: Vec<BoxedStrategy<String>> = vec![
        Just("'*'".to_string()).boxed(),
        prop::sample::select(TAGS.to_vec())
            .prop_map(|t| format!("tag:{t}"))
            .boxed(),
        prop::sample::select(PROJECTS.to_vec())
            .prop_map(|p| format!("project:{p}"))
            .boxed(),
        (0..8u8).prop_map(|n| format!("node:n{n}")).boxed(),
        (1..9u8).prop_map(|n| format!("10.64.0.{n}/32")).boxed(),
        (0..3u8)
            .prop_map(|n| format!("10.64.0.{}/30", n * 4))
            .boxed(),
    ];
    if groups > 0 {
        choices.push((0..groups).prop_map(|g| format!("group:g{g}")).boxed());
    }
    prop::strategy::Union::new(choices).boxed()
}

fn selector(groups: usize) -> BoxedStrategy<String> {
    (atom(groups), prop::collection::vec(atom(groups), 0..3))
        .prop_map(|(first, rest)| {
            let mut s = first.trim_matches('\'').to_string();
            for r in rest {
                s.push_str(" - ");
                s.push_str(r.trim_matches('\''));
            }
            format!("'{s}'")
        })
        .boxed()
}

fn list(groups: usize) -> BoxedStrategy<String> {
    prop::collection::vec(selector(groups), 1..3)
        .prop_map(|v| format!("[{}]", v.join(", ")))
        .boxed()
}

fn ports() -> impl Strategy<Value = String> {
    let one = prop_oneof![
        prop::sample::select(vec![22u16, 53, 80, 443, 5432]).prop_map(|p| p.to_string()),
        (0..6u16).prop_map(|p| format!("{}-{}", 5000 + p * 10, 5015 + p * 10)),
        Just("'*'".to_string()),
    ];
    prop::collection::vec(one, 1..3).prop_map(|v| format!("[{}]", v.join(", ")))
}

fn rule() -> impl Strategy<Value = String> {
    let proto = prop::sample::select(vec!["tcp", "udp", "[tcp, udp]", "icmp", "any"]);
    (list(3), list(3), proto, ports()).prop_map(|(src, dst, proto, ports)| {
        let ports = if proto == "icmp" || proto == "any" {
            String::new()
        } else {
            format!(", ports: {ports}")
        };
        format!("  - {{src: {src}, dst: {dst}, proto: {proto}{ports}}}\n")
    })
}

fn document() -> impl Strategy<Value = String> {
    let groups = (list(0), list(1), list(2));
    (groups, prop::collection::vec(rule(), 0..7)).prop_map(|((g0, g1, g2), rules)| {
        let mut doc = format!("groups:\n  g0: {g0}\n  g1: {g1}\n  g2: {g2}\nrules:\n");
        if rules.is_empty() {
            doc = doc.replace("rules:\n", "rules: []\n");
        }
        for r in rules {
            doc.push_str(&r);
        }
        doc
    })
}

/// Packet kinds to try between every pair: ports at the generator's range edges.
const PROBES: &[(Proto, u16)] = &[
    (Proto::Tcp, 22),
    (Proto::Tcp, 443),
    (Proto::Tcp, 5000),
    (Proto::Tcp, 5015),
    (Proto::Tcp, 5016),
    (Proto::Tcp, 5432),
    (Proto::Tcp, 9),
    (Proto::Udp, 53),
    (Proto::Udp, 5020),
    (Proto::Udp, 65535),
    (Proto::Icmp, 0),
    (Proto::Other(47), 0),
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn compiled_filters_agree_with_the_plain_evaluator(doc in document(), spec in inventory_strategy()) {
        let policy = parse(&doc).map_err(|e| TestCaseError::fail(format!("{doc}\n{e}")))?;
        let inv = build_inventory(&spec);
        let c = Compiled::new(&policy, &inv);
        let untabulated = c.clone().untabulated();
        let now = Instant::now();
        for dst in &inv.nodes {
            let view = c.node_view(dst.id).unwrap();
            let on_demand = untabulated.node_view(dst.id);
            prop_assert_eq!(Some(&view), on_demand.as_ref());
            let filter = NodeFilter::new(&view).unwrap();
            for src in &inv.nodes {
                if src.id == dst.id {
                    continue;
                }
                let peer = filter.peer(&src.id);
                prop_assert_eq!(peer.is_some(), eval::connected(&policy, src, dst), "peer set of {} for {}\n{}", dst.name, src.name, doc);
                for &(proto, port) in PROBES {
                    let l4 = match proto {
                        Proto::Tcp => L4::Tcp { sport: 40000, dport: port },
                        Proto::Udp => L4::Udp { sport: 40000, dport: port },
                        Proto::Icmp => L4::Icmp(Icmp::EchoRequest { id: 1 }),
                        Proto::Other(p) => L4::Other(p),
                    };
                    let pkt = Packet { src: src.ipv4.unwrap().into(), dst: dst.ipv4.unwrap().into(), l4 };
                    let got = inbound(&filter, peer, &pkt, &mut FlowTable::new(4), now).is_accept();
                    let want = eval::decide(&policy, src, dst, proto, port) != Verdict::Deny;
                    prop_assert_eq!(got, want, "{} -> {} {}/{}\n{}", src.name, dst.name, proto, port, doc);
                    // The sender's view says the same about opening it.
                    if let Some(back) = c.node_view(src.id).map(|v| NodeFilter::new(&v).unwrap()) {
                        let out = back.peer(&dst.id).is_some_and(|p| back.outbound_allows(p, proto, port));
                        prop_assert_eq!(out, want);
                    }
                }
            }
        }
    }

    #[test]
    fn the_diff_agrees_with_pairwise_access(old in document(), new in document(), spec in inventory_strategy()) {
        let (po, pn) = (parse(&old).unwrap(), parse(&new).unwrap());
        let inv = build_inventory(&spec);
        let diff = reach_diff(&Compiled::new(&po, &inv), &Compiled::new(&pn, &inv));
        let mut seen = std::collections::HashMap::new();
        for e in &diff.entries {
            for s in &e.srcs {
                for d in &e.dsts {
                    if s != d {
                        prop_assert!(seen.insert((s.clone(), d.clone()), (e.gained.clone(), e.lost.clone())).is_none());
                    }
                }
            }
        }
        for s in &inv.nodes {
            for d in &inv.nodes {
                if s.id == d.id {
                    continue;
                }
                let (a, b) = (eval::access(&po, s, d).0, eval::access(&pn, s, d).0);
                let want = (b.minus(&a), a.minus(&b));
                let got = seen.remove(&(s.name.clone(), d.name.clone()));
                if want.0.is_empty() && want.1.is_empty() {
                    prop_assert!(got.is_none(), "{} -> {} listed without a change", s.name, d.name);
                } else {
                    prop_assert_eq!(got, Some(want), "{} -> {}", s.name, d.name);
                }
            }
        }
    }

    #[test]
    fn document_tests_agree_with_every_pair(
        doc in document(),
        spec in inventory_strategy(),
        sides in (atom(3), atom(3)),
        probe in prop::sample::select(PROBES.to_vec()),
        accept in any::<bool>(),
    ) {
        let inv = build_inventory(&spec);
        let (proto, port) = probe;
        prop_assume!(!matches!(proto, Proto::Other(_)));
        let expect = if accept { "accept" } else { "deny" };
        let port_field = if proto.has_ports() { format!(", port: {port}") } else { String::new() };
        let full = format!(
            "{doc}tests:\n  - {{src: {}, dst: {}, proto: {proto}{port_field}, expect: {expect}}}\n",
            sides.0, sides.1
        );
        let policy = parse(&full).map_err(|e| TestCaseError::fail(format!("{full}\n{e}")))?;
        let t = &policy.tests[0];
        let srcs: Vec<_> = inv.nodes.iter().filter(|n| eval::selects(&policy, &t.src, n)).collect();
        let dsts: Vec<_> = inv.nodes.iter().filter(|n| eval::selects(&policy, &t.dst, n)).collect();
        let pairs: Vec<_> = srcs.iter().flat_map(|s| dsts.iter().map(move |d| (*s, *d))).filter(|(s, d)| s.id != d.id).collect();
        prop_assume!(!srcs.is_empty() && !dsts.is_empty() && !pairs.is_empty());
        let all_hold = pairs.iter().all(|(s, d)| {
            (eval::decide(&policy, s, d, proto, port) != Verdict::Deny) == accept
        });
        let ran = plexsphere_policy::run_tests(&policy, &inv);
        prop_assert_eq!(ran.is_ok(), all_hold, "{}\n{:?}", full, ran);
    }

    #[test]
    fn the_flow_table_stays_bounded_and_answers_only_for_opened_flows(
        ops in prop::collection::vec((any::<bool>(), 0..4u8, 0..6u16, 0..400u64), 0..200),
        cap in 1..8usize,
    ) {
        let t0 = Instant::now();
        let mut table = FlowTable::new(cap);
        let mut opened = std::collections::HashSet::new();
        let mut now = t0;
        for (open, proto, port, step) in ops {
            now += std::time::Duration::from_secs(step);
            let proto = [Proto::Tcp, Proto::Udp, Proto::Icmp, Proto::Other(47)][usize::from(proto)];
            let key = FlowKey { proto, local: "10.64.0.1".parse().unwrap(), local_port: port, remote: "10.64.0.2".parse().unwrap(), remote_port: 9 };
            if open {
                table.opened(key, now);
                opened.insert(key);
            } else if table.reply(&key, now) {
                prop_assert!(opened.contains(&key));
            }
            prop_assert!(table.len() <= cap);
        }
    }

    #[test]
    fn the_document_parser_never_panics(text in ".{0,400}") {
        let _ = parse(&text);
    }

    #[test]
    fn yaml_shaped_garbage_never_panics(text in "[-a-z:*/ \\[\\]{},.0-9'\"\n]{0,300}") {
        let _ = parse(&text);
        let _ = parse(&format!("rules:\n  - {text}"));
    }

    #[test]
    fn the_packet_parser_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..120), v in 0..3u8) {
        let mut b = bytes;
        if let Some(first) = b.first_mut() {
            *first = match v { 0 => 0x45, 1 => 0x60, _ => *first };
        }
        let _ = parse_packet(&b);
    }
}
