//! Subnet routes and exits in the compile (issue 27): grants cut to the rules' prefixes, `*`,
//! overlapping rules, exits only for the nodes that name them and without the mesh range,
//! routes a node may not use absent from its view, and `auto_approvers`.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::*;
use ipnet::IpNet;
use plexsphere_policy::{Compiled, RouteInfo, RouteInventory, auto_approves, parse, validate};
use uuid::Uuid;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// r routes for a lab: router r, clients a and b, untagged c.
fn lab() -> plexsphere_policy::Inventory {
    inventory(&[
        ("r", "shop", &["router"]),
        ("a", "shop", &["client"]),
        ("b", "shop", &["client", "ops"]),
        ("c", "shop", &[]),
    ])
}

fn id(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

fn routes(list: &[RouteInfo]) -> RouteInventory {
    RouteInventory {
        mesh: vec![net("10.64.0.0/16"), net("fd00::/64")],
        routes: list.to_vec(),
    }
}

fn route(router: u128, cidr: &str) -> RouteInfo {
    RouteInfo {
        router: id(router),
        cidr: net(cidr),
        exit: false,
        users: Vec::new(),
    }
}

/// The prefixes `me` may open through `router`, with each grant's text.
fn out(c: &Compiled, me: u128, router: u128) -> Option<Vec<(String, String)>> {
    let v = c.node_view(id(me)).unwrap();
    let p = v.peers.iter().find(|p| p.id == id(router))?;
    Some(
        p.routes_out
            .iter()
            .map(|g| {
                let grant = v.grant(Some(g.grant)).unwrap();
                (g.prefix.to_string(), grant.access.to_string())
            })
            .collect(),
    )
}

#[test]
fn grants_are_cut_to_the_rules_prefixes_and_nest() {
    let doc = "rules:\n  - {src: tag:client, dst: '10.1.0.0/25', proto: tcp, ports: 22}\n  - {src: tag:ops, dst: '10.0.0.0/8', proto: icmp}\n";
    let policy = parse(doc).unwrap();
    let c = Compiled::with_routes(&policy, &lab(), &routes(&[route(1, "10.1.0.0/24")]));
    assert_eq!(
        out(&c, 2, 1).unwrap(),
        vec![("10.1.0.0/25".into(), "tcp 22".into())]
    );
    // b: icmp in the whole route, and tcp 22 as well in the /25 inside it.
    let b = out(&c, 3, 1).unwrap();
    assert_eq!(b.len(), 2, "{b:?}");
    assert_eq!(b[0].0, "10.1.0.0/24");
    assert_eq!(b[1].0, "10.1.0.0/25");
    assert!(
        b[1].1.contains("tcp 22") && b[1].1.contains("icmp"),
        "{b:?}"
    );
    // c may not use the route: the router is not its peer at all.
    assert_eq!(out(&c, 4, 1), None);
    assert!(!c.connected(0, 3));
    // The router sees a and b with routes_in, and is connected to them.
    let rv = c.node_view(id(1)).unwrap();
    let a_in = rv.peers.iter().find(|p| p.id == id(2)).unwrap();
    assert_eq!(a_in.routes_in[0].prefix, net("10.1.0.0/25"));
    assert!(rv.peers.iter().all(|p| p.id != id(4)));
    assert!(c.connected(0, 1) && c.connected(1, 0));
}

#[test]
fn a_star_destination_holds_every_route_and_a_rule_elsewhere_holds_none() {
    let c = Compiled::with_routes(
        &plexsphere_policy::default_document(),
        &lab(),
        &routes(&[route(1, "10.1.0.0/24"), route(2, "192.168.7.0/24")]),
    );
    assert_eq!(
        out(&c, 4, 1).unwrap()[0].0,
        "10.1.0.0/24",
        "allow-all: everyone"
    );
    assert_eq!(
        out(&c, 1, 2).unwrap()[0].0,
        "192.168.7.0/24",
        "a router uses another's route"
    );
    let own: Vec<String> = out(&c, 2, 1).unwrap().into_iter().map(|g| g.0).collect();
    assert_eq!(
        own,
        vec!["10.1.0.0/24"],
        "a router never uses its own route through another"
    );
    let elsewhere = parse("rules:\n  - {src: '*', dst: '172.16.0.0/12'}\n").unwrap();
    let c = Compiled::with_routes(&elsewhere, &lab(), &routes(&[route(1, "10.1.0.0/24")]));
    assert_eq!(out(&c, 2, 1), None);
}

#[test]
fn an_exit_serves_only_the_nodes_that_name_it_without_the_mesh_ranges() {
    let exit = RouteInfo {
        router: id(1),
        cidr: net("0.0.0.0/0"),
        exit: true,
        users: vec![id(2)],
    };
    let c = Compiled::with_routes(
        &plexsphere_policy::default_document(),
        &lab(),
        &routes(std::slice::from_ref(&exit)),
    );
    let a = out(&c, 2, 1).unwrap();
    assert!(a.len() > 2, "{a:?}");
    for (p, _) in &a {
        let p = net(p);
        assert!(
            !p.contains(&net("10.64.0.1/32")) && !p.contains(&net("fd00::1/128")),
            "{p}"
        );
    }
    assert!(a.iter().any(|(p, _)| p == "0.0.0.0/5"), "{a:?}");
    assert!(a.iter().any(|(p, _)| p.contains(':')), "{a:?}");
    assert!(
        out(&c, 3, 1).unwrap().is_empty(),
        "b does not name the exit"
    );
    // A policy that does not let a reach 0.0.0.0/0 keeps it off even though it names it.
    let narrow = parse("rules:\n  - {src: tag:client, dst: tag:router}\n").unwrap();
    let c = Compiled::with_routes(&narrow, &lab(), &routes(&[exit]));
    assert!(out(&c, 2, 1).unwrap().is_empty());
}

#[test]
fn auto_approvers_parse_check_and_decide() {
    let inv = lab();
    let doc = "tags: [exit]\nauto_approvers:\n  routes: {\"10.1.0.0/16\": [tag:router]}\n  exit: [tag:exit]\nrules: []\n";
    let policy = validate(doc, &inv).unwrap();
    let r = node(&inv, "r");
    let a = node(&inv, "a");
    assert!(auto_approves(&policy, &inv, r, Some(net("10.1.2.0/24"))));
    assert!(auto_approves(&policy, &inv, r, Some(net("10.1.0.0/16"))));
    assert!(
        !auto_approves(&policy, &inv, r, Some(net("10.0.0.0/8"))),
        "wider than the key"
    );
    assert!(
        !auto_approves(&policy, &inv, a, Some(net("10.1.2.0/24"))),
        "not a router"
    );
    assert!(
        !auto_approves(&policy, &inv, r, None),
        "r is not tagged exit"
    );
    for (bad, want) in [
        (
            "auto_approvers:\n  routes: {\"10.1.0.7/16\": [tag:router]}\nrules: []\n",
            "not a network address",
        ),
        (
            "auto_approvers:\n  routes: {\"lan\": [tag:router]}\nrules: []\n",
            "network prefix",
        ),
        (
            "auto_approvers:\n  exit: [tag:nope]\nrules: []\n",
            "unknown tag",
        ),
        ("auto_approvers:\n  wrong: []\nrules: []\n", "unknown field"),
    ] {
        let errs = validate(bad, &inv).unwrap_err();
        let text = errs.to_string();
        assert!(text.contains(want), "{bad}: {text}");
    }
}

#[test]
fn explain_answers_for_an_address_behind_a_router() {
    let inv = lab();
    let policy =
        parse("rules:\n  - {src: tag:client, dst: '10.1.0.0/25', proto: tcp, ports: 22}\n")
            .unwrap();
    let a = node(&inv, "a");
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    let tcp22 = Some((plexsphere_policy::Proto::Tcp, 22));
    let e = plexsphere_policy::explain_address(&policy, a, ip("10.1.0.9"), tcp22);
    assert!(e.allowed, "{e}");
    assert!(e.lines[0].contains("line 2"), "{e}");
    assert!(!plexsphere_policy::explain_address(&policy, a, ip("10.1.0.200"), tcp22).allowed);
    let c = node(&inv, "c");
    let e = plexsphere_policy::explain_address(&policy, c, ip("10.1.0.9"), tcp22);
    assert!(!e.allowed && e.lines[1].contains("dst: '10.1.0.9'"), "{e}");
}
