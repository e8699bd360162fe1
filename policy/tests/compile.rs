//! Table tests of the compiler: per node, the peer set and what the filter lets in, checked
//! against the plain evaluator on every row; explain and the reachability diff.
#![allow(clippy::unwrap_used)] // test helpers: a failure here is a test failure

mod common;

use std::time::Instant;

use plexsphere_policy::decide::{Accept, Drop};
use plexsphere_policy::eval::{self, Verdict};
use plexsphere_policy::packet::{Icmp, L4};
use plexsphere_policy::{
    Compiled, Decision, FlowTable, Inventory, NodeFilter, Packet, Proto, explain, inbound,
    outbound, parse, parse_what, reach_diff,
};

const WEB_TO_DB: &str = "rules:\n  - {src: tag:web, dst: tag:db, proto: tcp, ports: 5432}\n";

fn filter_of(c: &Compiled, inv: &Inventory, name: &str) -> NodeFilter {
    NodeFilter::new(&c.node_view(common::node(inv, name).id).unwrap()).unwrap()
}

fn packet(inv: &Inventory, src: &str, dst: &str, proto: Proto, sport: u16, dport: u16) -> Packet {
    let (s, d) = (common::node(inv, src), common::node(inv, dst));
    let l4 = match proto {
        Proto::Tcp => L4::Tcp { sport, dport },
        Proto::Udp => L4::Udp { sport, dport },
        Proto::Icmp => L4::Icmp(Icmp::EchoRequest { id: sport }),
        Proto::Other(p) => L4::Other(p),
    };
    Packet {
        src: s.ipv4.unwrap().into(),
        dst: d.ipv4.unwrap().into(),
        l4,
    }
}

/// What `dst`'s compiled filter says about a new flow from `src`, checked against the plain
/// evaluator.
fn admits(doc: &str, inv: &Inventory, src: &str, dst: &str, proto: Proto, port: u16) -> bool {
    let policy = parse(doc).unwrap();
    let c = Compiled::new(&policy, inv);
    let f = filter_of(&c, inv, dst);
    let p = packet(inv, src, dst, proto, 40000, port);
    let peer = f.peer(&common::node(inv, src).id);
    let got = inbound(&f, peer, &p, &mut FlowTable::default(), Instant::now()).is_accept();
    let plain = eval::decide(
        &policy,
        common::node(inv, src),
        common::node(inv, dst),
        proto,
        port,
    );
    assert_eq!(
        got,
        plain != Verdict::Deny,
        "{doc}: {src} -> {dst} {proto}/{port}"
    );
    got
}

const GROUPS: &str = "\
groups:
  apps: tag:prod - tag:db
  everyone: ['*']
rules:
  - {src: group:apps, dst: tag:db, proto: tcp, ports: [5432, 6000-6010]}
  - {src: project:build, dst: project:shop, proto: udp, ports: 53}
  - {src: 10.64.0.3/32, dst: node:web, proto: icmp}
  - {src: group:everyone - tag:ci, dst: tag:web, proto: any}
";

#[test]
fn table() {
    let inv = common::web_db_ci();
    let rows: &[(&str, &str, &str, Proto, u16, bool)] = &[
        (WEB_TO_DB, "web", "db", Proto::Tcp, 5432, true),
        (WEB_TO_DB, "web", "db", Proto::Tcp, 5433, false),
        (WEB_TO_DB, "web", "db", Proto::Udp, 5432, false),
        (WEB_TO_DB, "web", "db", Proto::Icmp, 0, false),
        (WEB_TO_DB, "ci", "db", Proto::Tcp, 5432, false),
        (WEB_TO_DB, "db", "web", Proto::Tcp, 5432, false),
        (GROUPS, "web", "db", Proto::Tcp, 6005, true),
        (GROUPS, "web", "db", Proto::Tcp, 6011, false),
        (GROUPS, "ci", "db", Proto::Tcp, 5432, false),
        (GROUPS, "ci", "db", Proto::Udp, 53, true),
        (GROUPS, "ci", "web", Proto::Udp, 53, true),
        (GROUPS, "ci", "web", Proto::Icmp, 0, true),
        (GROUPS, "ci", "web", Proto::Tcp, 80, false),
        (GROUPS, "db", "web", Proto::Tcp, 80, true),
        (GROUPS, "db", "web", Proto::Other(47), 0, true),
        (GROUPS, "ci", "web", Proto::Other(47), 0, false),
        (GROUPS, "web", "ci", Proto::Icmp, 0, false),
        ("rules: []\n", "web", "db", Proto::Tcp, 5432, false),
        (
            plexsphere_policy::DEFAULT_DOCUMENT,
            "ci",
            "db",
            Proto::Other(132),
            0,
            true,
        ),
    ];
    for &(doc, s, d, proto, port, want) in rows {
        assert_eq!(
            admits(doc, &inv, s, d, proto, port),
            want,
            "{doc}: {s} -> {d} {proto}/{port}"
        );
    }
}

#[test]
fn the_peer_set_holds_exactly_the_nodes_a_rule_connects_either_way() {
    let inv = common::web_db_ci();
    let c = Compiled::new(&parse(WEB_TO_DB).unwrap(), &inv);
    let peers = |n: &str| {
        let v = c.node_view(common::node(&inv, n).id).unwrap();
        v.peers.iter().map(|p| p.name.clone()).collect::<Vec<_>>()
    };
    assert_eq!(peers("db"), vec!["web"]);
    assert_eq!(peers("web"), vec!["db"]);
    assert!(peers("ci").is_empty(), "ci learns of no node");
    let v = c.node_view(common::node(&inv, "db").id).unwrap();
    let web = &v.peers[0];
    assert_eq!(v.grant(web.inbound).unwrap().access.to_string(), "tcp 5432");
    assert_eq!(v.grant(web.inbound).unwrap().lines, vec![2]);
    assert!(web.outbound.is_none());
    // The view survives a JSON round trip (it goes into the signed state).
    let json = serde_json_like(&v);
    assert!(json.contains("5432"));
}

#[test]
fn a_view_describes_itself_and_a_corrupt_view_yields_no_filter() {
    let inv = common::web_db_ci();
    let c = Compiled::new(&parse(WEB_TO_DB).unwrap(), &inv);
    let mut v = c.node_view(common::node(&inv, "db").id).unwrap();
    assert_eq!(
        v.describe(),
        vec!["from web (10.64.0.1, fd00::1): may open here tcp 5432 (rule lines 2)"]
    );
    let ci = c.node_view(common::node(&inv, "ci").id).unwrap();
    assert_eq!(
        ci.describe(),
        vec!["no peers: no rule connects this node to another"]
    );
    v.peers[0].inbound = Some(7);
    assert!(matches!(
        NodeFilter::new(&v),
        Err(plexsphere_policy::ViewError::BadGrant { index: 7, .. })
    ));
    v.peers[0].inbound = Some(0);
    v.peers.push(v.peers[0].clone());
    assert!(matches!(
        NodeFilter::new(&v),
        Err(plexsphere_policy::ViewError::DuplicatePeer(_))
    ));
    // A closed filter lets nothing in.
    let closed = NodeFilter::closed(v.node, v.addrs.clone());
    let syn = packet(&inv, "web", "db", Proto::Tcp, 1, 5432);
    let d = inbound(
        &closed,
        closed.peer(&common::node(&inv, "web").id),
        &syn,
        &mut FlowTable::default(),
        Instant::now(),
    );
    assert_eq!(d, Decision::Drop(Drop::UnknownPeer));
}

fn serde_json_like(v: &plexsphere_policy::NodeView) -> String {
    serde_yaml::to_string(v).unwrap()
}

#[test]
fn db_answers_web_but_cannot_open_to_it() {
    let inv = common::web_db_ci();
    let c = Compiled::new(&parse(WEB_TO_DB).unwrap(), &inv);
    let (web, db) = (filter_of(&c, &inv, "web"), filter_of(&c, &inv, "db"));
    let now = Instant::now();
    let (mut web_flows, mut db_flows) = (FlowTable::default(), FlowTable::default());
    let web_id = common::node(&inv, "web").id;
    let db_id = common::node(&inv, "db").id;
    // web opens to db:5432.
    let syn = packet(&inv, "web", "db", Proto::Tcp, 40000, 5432);
    assert_eq!(
        outbound(&web, web.peer(&db_id), &syn, &mut web_flows, now),
        Decision::Accept(Accept::Rule)
    );
    assert_eq!(
        inbound(&db, db.peer(&web_id), &syn, &mut db_flows, now),
        Decision::Accept(Accept::Rule)
    );
    // db's reply leaves db (a reply to what web may open) and enters web (the flow web opened).
    let ack = packet(&inv, "db", "web", Proto::Tcp, 5432, 40000);
    assert_eq!(
        outbound(&db, db.peer(&web_id), &ack, &mut db_flows, now),
        Decision::Accept(Accept::Reply)
    );
    assert_eq!(
        inbound(&web, web.peer(&db_id), &ack, &mut web_flows, now),
        Decision::Accept(Accept::Reply)
    );
    // db opening to web: refused at db and, were db hostile, at web.
    let no = Decision::Drop(Drop::NoRule {
        proto: Proto::Tcp,
        port: 22,
    });
    let open = packet(&inv, "db", "web", Proto::Tcp, 41000, 22);
    assert_eq!(
        outbound(&db, db.peer(&web_id), &open, &mut db_flows, now),
        no
    );
    assert_eq!(
        inbound(&web, web.peer(&db_id), &open, &mut web_flows, now),
        no
    );
    // From its service port db's sender side takes it for a reply; web, the boundary, does not.
    let open = packet(&inv, "db", "web", Proto::Tcp, 5432, 22);
    assert_eq!(
        inbound(&web, web.peer(&db_id), &open, &mut web_flows, now),
        no
    );
    // A hostile db that uses web's flow from another port gets nothing through.
    let other = packet(&inv, "db", "web", Proto::Tcp, 5433, 40000);
    assert!(!inbound(&web, web.peer(&db_id), &other, &mut web_flows, now).is_accept());
    // ci is no peer of db; a packet claiming web's address from db's tunnel is spoofed.
    assert_eq!(
        inbound(
            &db,
            db.peer(&common::node(&inv, "ci").id),
            &syn,
            &mut db_flows,
            now
        ),
        Decision::Drop(Drop::UnknownPeer)
    );
    let mut spoof = syn;
    spoof.src = common::node(&inv, "ci").ipv4.unwrap().into();
    assert_eq!(
        inbound(&db, db.peer(&web_id), &spoof, &mut db_flows, now),
        Decision::Drop(Drop::SpoofedSource)
    );
    let mut elsewhere = syn;
    elsewhere.dst = common::node(&inv, "ci").ipv4.unwrap().into();
    assert_eq!(
        inbound(&db, db.peer(&web_id), &elsewhere, &mut db_flows, now),
        Decision::Drop(Drop::NotForThisNode)
    );
    // Ping is refused where no rule allows icmp.
    let ping = packet(&inv, "web", "db", Proto::Icmp, 7, 0);
    assert_eq!(
        inbound(&db, db.peer(&web_id), &ping, &mut db_flows, now),
        Decision::Drop(Drop::NoRule {
            proto: Proto::Icmp,
            port: 0
        })
    );
}

#[test]
fn explain_names_the_rule_and_line_or_the_rule_that_would() {
    let inv = common::web_db_ci();
    let p = parse(GROUPS).unwrap();
    let (web, db, ci) = (
        common::node(&inv, "web"),
        common::node(&inv, "db"),
        common::node(&inv, "ci"),
    );
    let e = explain(&p, web, db, Some(parse_what("5432/tcp").unwrap()));
    assert!(e.allowed);
    assert_eq!(
        e.lines[0],
        "web -> db tcp/5432: allowed by line 5: group:apps -> tag:db tcp 5432,6000-6010"
    );
    let e = explain(&p, ci, db, Some(parse_what("tcp/5432").unwrap()));
    assert!(!e.allowed);
    assert_eq!(e.lines[0], "ci -> db tcp/5432: no rule allows it");
    assert!(e.lines[1].contains("{src: 'node:ci', dst: 'node:db', proto: tcp, ports: 5432}"));
    let e = explain(&p, web, ci, None);
    assert!(!e.allowed);
    assert_eq!(
        e.lines.last().unwrap(),
        "they are WireGuard peers because ci -> web is allowed by line 6"
    );
    let e = explain(&p, db, web, None);
    assert_eq!(
        e.lines[0],
        "db -> web: may open tcp *; udp *; icmp; other IP protocols"
    );
    assert!(parse_what("tcp").is_err() && parse_what("x/tcp").is_err());
}

#[test]
fn the_diff_says_which_pairs_gain_or_lose_what() {
    let inv = common::web_db_ci();
    let old = Compiled::new(&parse(WEB_TO_DB).unwrap(), &inv);
    let new_doc = "rules:\n  - {src: tag:web, dst: tag:db, proto: tcp, ports: [5432, 6379]}\n  - {src: tag:ci, dst: tag:prod, proto: icmp}\n";
    let new = Compiled::new(&parse(new_doc).unwrap(), &inv);
    let d = reach_diff(&old, &new);
    assert_eq!(
        d.to_string(),
        "web -> db: gains tcp 6379\nci -> web, db (2 pairs): gains icmp"
    );
    let back = reach_diff(&new, &old);
    assert_eq!(
        back.to_string(),
        "web -> db: loses tcp 6379\nci -> web, db (2 pairs): loses icmp"
    );
    assert!(reach_diff(&old, &old).is_empty());
    assert_eq!(
        reach_diff(&old, &old).to_string(),
        "no node pair gains or loses anything"
    );
}

#[test]
fn cidr_destinations_are_kept_for_routes() {
    let inv = common::web_db_ci();
    let p = parse(
        "rules:\n  - {src: tag:web, dst: '10.0.0.0/8 - 10.64.0.0/16', proto: tcp, ports: 443}\n",
    )
    .unwrap();
    let c = Compiled::new(&p, &inv);
    let r = &c.routes()[0];
    assert_eq!(r.line, 2);
    assert_eq!(r.src_nodes, vec![common::node(&inv, "web").id]);
    assert_eq!(r.dst_prefixes.len(), 8);
    assert!(
        r.dst_prefixes
            .iter()
            .all(|n| !n.contains(&"10.64.0.2".parse::<std::net::IpAddr>().unwrap()))
    );
    // No node is inside the destination, so no node peers with web for it.
    assert!(
        c.node_view(common::node(&inv, "web").id)
            .unwrap()
            .peers
            .is_empty()
    );
}
