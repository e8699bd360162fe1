//! The document: what parses, what is refused, and that every refusal says where (line
//! and column) and what to do.
#![allow(clippy::unwrap_used)] // test helpers: a failure here is a test failure

mod common;

use plexsphere_policy::{
    DEFAULT_DOCUMENT, ErrorKind, Location, PolicyErrors, ProtoSet, default_document, parse,
    validate,
};

fn first(e: &PolicyErrors) -> (ErrorKind, Location, String) {
    let f = e.first().unwrap();
    (f.kind, f.location, f.message.clone())
}

#[test]
fn the_default_document_is_an_explicit_allow_all() {
    let p = parse(DEFAULT_DOCUMENT).unwrap();
    assert_eq!(p, default_document());
    assert_eq!(p.rules.len(), 1);
    assert_eq!(p.rules[0].protos, ProtoSet::ANY);
    assert!(p.rules[0].ports.is_all());
    assert_eq!(
        p.rules[0].to_string(),
        "line 5 (allow-all): * -> * tcp *; udp *; icmp; other IP protocols"
    );
}

#[test]
fn deny_by_default_is_one_line() {
    let p = parse("rules: []\n").unwrap();
    assert!(p.rules.is_empty());
}

#[test]
fn a_full_document_parses() {
    let doc = "\
tags: [web, db, ci, edge]
groups:
  frontends: [tag:web, tag:edge]
  apps: tag:prod - tag:db
rules:
  - name: web-to-db
    src: group:frontends
    dst: tag:db
    proto: tcp
    ports: [5432, 8000-8100]
  - src: [project:shop, 10.64.0.0/16]
    dst: '*'
    proto: icmp
  - src: group:apps
    dst: fd00::/64
    proto: [tcp, udp]
    ports: 53
tests:
  - {src: tag:web, dst: tag:db, port: 5432, proto: tcp, expect: accept}
  - {src: tag:ci, dst: tag:db, port: 5432, proto: tcp, expect: deny}
";
    let p = parse(doc).unwrap();
    assert_eq!(p.groups.len(), 2);
    assert_eq!(p.rules.len(), 3);
    assert_eq!(p.rules[0].at.line, 6);
    assert_eq!(p.rules[1].at.line, 11);
    assert_eq!(p.rules[0].ports.to_string(), "5432,8000-8100");
    assert_eq!(p.rules[2].protos, ProtoSet::TCP.union(ProtoSet::UDP));
    assert_eq!(p.tests.len(), 2);
    assert_eq!(p.tests[1].at.line, 20);
    // The selector's place: line 7, the column where `group:frontends` starts.
    assert_eq!(p.rules[0].src[0].at, Location::new(7, 10));
    assert_eq!(p.groups[1].members[0].to_string(), "tag:prod - tag:db");
    let inv = common::web_db_ci();
    let mut inv = inv;
    inv.tags.push("edge".into());
    validate(doc, &inv).unwrap();
}

/// (document, kind, line, column (0: any), words the message must hold)
const REFUSED: &[(&str, ErrorKind, u32, u32, &[&str])] = &[
    (
        "rules:\n  - src: tag:web\n    dst: tag:db\n    ports: 70000\n    proto: tcp\n",
        ErrorKind::Invalid,
        4,
        12,
        &["70000", "0 to 65535"],
    ),
    (
        "rules:\n  - src: tag:web\n    dst: tag:db\n    ports: 9000-8000\n    proto: tcp\n",
        ErrorKind::Invalid,
        4,
        12,
        &["backwards", "8000-9000"],
    ),
    (
        "rules:\n  - src: tag:web\n    dst: tag:db\n    proto: sctp\n",
        ErrorKind::Invalid,
        2,
        0,
        &["rule 1", "sctp", "tcp, udp, icmp or any"],
    ),
    (
        "rules:\n  - src: tag:web\n    dst: tag:db\n    proto: icmp\n    ports: 22\n",
        ErrorKind::Invalid,
        2,
        0,
        &["ports apply to tcp and udp"],
    ),
    (
        "rules:\n  - src: 10.1.2.3/16\n    dst: tag:db\n",
        ErrorKind::Invalid,
        2,
        10,
        &["10.1.0.0/16"],
    ),
    (
        "rules:\n  - src: 10.1.0.0/33\n    dst: tag:db\n",
        ErrorKind::Invalid,
        2,
        10,
        &["not a CIDR"],
    ),
    (
        "rules:\n  - src: tag:web -tag:db\n    dst: tag:db\n",
        ErrorKind::Invalid,
        2,
        18,
        &["spaces around the minus"],
    ),
    (
        "rules:\n  - src: tag:web tag:db\n    dst: tag:db\n",
        ErrorKind::Invalid,
        2,
        18,
        &["without an operator"],
    ),
    (
        "rules:\n  - src: tag:we$b\n    dst: tag:db\n",
        ErrorKind::Invalid,
        2,
        16,
        &["`$`"],
    ),
    (
        "rules:\n  - src: host:web\n    dst: tag:db\n",
        ErrorKind::Invalid,
        2,
        10,
        &["not a selector"],
    ),
    (
        "rules:\n  - src: group:front\n    dst: tag:db\n",
        ErrorKind::Invalid,
        2,
        10,
        &["unknown group `front`", "groups:"],
    ),
    (
        "groups:\n  a: group:b\n  b: [tag:x, group:a]\nrules: []\n",
        ErrorKind::Invalid,
        2,
        1,
        &["contains itself", "group:a -> group:b -> group:a"],
    ),
    (
        "rules:\n  - src: *\n    dst: tag:db\n",
        ErrorKind::Syntax,
        2,
        0,
        &["quote it"],
    ),
    (
        "rules:\n  - src: tag:web\n    dst: tag:db\n    port: 22\n",
        ErrorKind::Syntax,
        4,
        5,
        &["unknown field `port`"],
    ),
    (
        "rules:\n  - src: []\n    dst: tag:db\n",
        ErrorKind::Invalid,
        2,
        0,
        &["empty list"],
    ),
    (
        "# nothing\n",
        ErrorKind::Syntax,
        1,
        1,
        &["empty", "rules: []"],
    ),
    (
        "rules: []\ntests:\n  - {src: tag:a, dst: tag:b, proto: tcp, expect: accept}\n",
        ErrorKind::Invalid,
        3,
        0,
        &["test 1", "port: N"],
    ),
    (
        "rules: []\ntests:\n  - {src: tag:a, dst: tag:b, proto: tcp, port: 1-2, expect: accept}\n",
        ErrorKind::Invalid,
        3,
        0,
        &["one port"],
    ),
    (
        "rules: []\ntests:\n  - {src: tag:a, dst: tag:b, proto: tcp, port: 1, expect: allow}\n",
        ErrorKind::Invalid,
        3,
        0,
        &["accept or deny"],
    ),
];

#[test]
fn bad_documents_are_refused_with_line_column_and_a_fix() {
    for (doc, kind, line, column, words) in REFUSED {
        let e = parse(doc).expect_err(doc);
        let (k, at, msg) = first(&e);
        assert_eq!(k, *kind, "{doc}: {msg}");
        assert_eq!(at.line, *line, "{doc}: {msg}");
        if *column != 0 {
            assert_eq!(at.column, *column, "{doc}: {msg}");
        }
        for w in *words {
            assert!(msg.contains(w), "{doc}: `{msg}` lacks `{w}`");
        }
    }
}

#[test]
fn limits_are_enforced_with_clear_errors() {
    let big = format!(
        "rules: []\n#{}\n",
        "x".repeat(plexsphere_policy::limits::MAX_DOCUMENT_BYTES)
    );
    let (k, _, msg) = first(&parse(&big).unwrap_err());
    assert_eq!(k, ErrorKind::Limit);
    assert!(msg.contains("limit is 1048576"), "{msg}");

    let mut many = String::from("rules:\n");
    for _ in 0..=plexsphere_policy::limits::MAX_RULES {
        many.push_str("- {src: tag:a, dst: tag:b}\n");
    }
    let (k, at, msg) = first(&parse(&many).unwrap_err());
    assert_eq!((k, at.line), (ErrorKind::Limit, 1));
    assert!(msg.contains("10001 rules, the limit is 10000"), "{msg}");

    let long = format!("rules:\n  - src: tag:{}\n    dst: tag:b\n", "a".repeat(300));
    let (k, _, msg) = first(&parse(&long).unwrap_err());
    assert_eq!(k, ErrorKind::Limit);
    assert!(msg.contains("the limit is 256"), "{msg}");

    let mut deep = String::from("groups:\n");
    for i in 0..10 {
        deep.push_str(&format!("  g{i}: group:g{}\n", i + 1));
    }
    deep.push_str("  g10: tag:x\nrules: []\n");
    let (k, _, msg) = first(&parse(&deep).unwrap_err());
    assert_eq!(k, ErrorKind::Limit);
    assert!(msg.contains("the limit is 8"), "{msg}");
}

#[test]
fn names_the_domain_does_not_know_are_refused() {
    let inv = common::web_db_ci();
    let doc =
        "rules:\n  - src: project:shopp\n    dst: tag:dbb\n  - src: node:webb\n    dst: '*'\n";
    let e = validate(doc, &inv).unwrap_err();
    let msgs: Vec<_> =
        e.0.iter()
            .map(|e| (e.location, e.kind, e.message.clone()))
            .collect();
    assert_eq!(msgs.len(), 3, "{msgs:?}");
    assert_eq!(msgs[0].0, Location::new(2, 10));
    assert!(msgs[0].2.contains("unknown project `shopp`") && msgs[0].2.contains("build, shop"));
    assert_eq!(msgs[1].0, Location::new(3, 10));
    assert!(
        msgs[1].2.contains("unknown tag `dbb`") && msgs[1].2.contains("declare it under `tags:`")
    );
    assert!(msgs[2].2.contains("unknown node `webb`"));
    assert!(msgs.iter().all(|m| m.1 == ErrorKind::Unknown));
    // A declared tag is known before any node carries it.
    validate(
        "tags: [dbb]\nrules:\n  - {src: tag:web, dst: tag:dbb}\n",
        &inv,
    )
    .unwrap();
    // Render as a compiler would.
    assert!(
        e.render("policy.yaml")
            .starts_with("policy.yaml:2:10: rule 1 src: unknown project")
    );
}

#[test]
fn failing_tests_name_the_test_the_pair_the_decision_and_the_rule() {
    let inv = common::web_db_ci();
    let doc = "\
rules:
  - src: '*'
    dst: tag:db
    proto: tcp
    ports: 5432
tests:
  - {src: tag:web, dst: tag:db, port: 5432, proto: tcp, expect: accept}
  - name: ci-stays-out
    src: tag:ci
    dst: tag:db
    port: 5432
    proto: tcp
    expect: deny
  - {src: tag:db, dst: tag:web, port: 22, proto: tcp, expect: accept}
";
    let e = validate(doc, &inv).unwrap_err();
    assert_eq!(e.0.len(), 2, "{e}");
    let m = &e.0[0];
    assert_eq!((m.kind, m.location.line), (ErrorKind::TestFailed, 8));
    assert_eq!(
        m.message,
        "test 2 (ci-stays-out) at line 8 failed: expected deny for ci -> db tcp/5432, but line 2: * -> tag:db tcp 5432 allows it"
    );
    let m = &e.0[1];
    assert_eq!(m.location.line, 14);
    assert!(m.message.contains("expected accept for db -> web tcp/22, but no rule allows it; a rule that would: {src: 'tag:db', dst: 'tag:web', proto: tcp, ports: 22}"), "{}", m.message);
}

#[test]
fn tests_about_tags_no_node_carries_yet_use_a_stand_in() {
    let inv = common::web_db_ci();
    let doc = "\
tags: [cache]
rules:
  - {src: tag:web, dst: tag:cache, proto: tcp, ports: 6379}
tests:
  - {src: tag:web, dst: tag:cache, port: 6379, proto: tcp, expect: accept}
  - {src: tag:ci, dst: tag:cache, port: 6379, proto: tcp, expect: deny}
";
    validate(doc, &inv).unwrap();
    let bad = doc.replace(
        "port: 6379, proto: tcp, expect: accept",
        "port: 6380, proto: tcp, expect: accept",
    );
    let e = validate(&bad, &inv).unwrap_err();
    assert!(
        e.0[0].message.contains("web -> (a node in tag:cache only)"),
        "{e}"
    );
}

#[test]
fn alias_bombs_and_deep_nesting_are_refused_not_expanded() {
    let mut bomb = String::from(
        "groups:\n  g0: &a0 [tag:x, tag:x, tag:x, tag:x, tag:x, tag:x, tag:x, tag:x, tag:x, tag:x]\n",
    );
    for i in 1..9 {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        bomb.push_str(&format!("  g{i}: &a{i} [{refs}]\n"));
    }
    bomb.push_str("rules: []\n");
    let (k, _, msg) = first(&parse(&bomb).unwrap_err());
    assert_eq!(k, ErrorKind::Syntax);
    assert!(msg.contains("repetition limit"), "{msg}");
    let deep = format!("groups:\n  g: {}{}\n", "[".repeat(5000), "]".repeat(5000));
    let (k, _, msg) = first(&parse(&deep).unwrap_err());
    assert_eq!(k, ErrorKind::Syntax);
    assert!(msg.contains("recursion limit"), "{msg}");
}
