//! The access policy admin API (issue 25) over real TLS: get, validate, set (dry run and
//! applied), history, rollback, explain; node tags and tagged bootstrap tokens; conflicts,
//! refused documents (the old version stays in force), scopes, and the one `resync` event a
//! change appends. SQLite, and Postgres when `PLEXSPHERE_TEST_POSTGRES_URL` is set.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::operators::{call, fresh};
use common::*;
use plexsphere::api::Verb;
use plexsphere::store::events;
use plexsphere_policy::DEFAULT_DOCUMENT;
use plexsphere_wire::admin::OperatorScope;
use plexsphere_wire::domain_event::is_recipient;
use plexsphere_wire::node::EventKind;
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

const POLICY: &str = "/v1/domains/lab/policy";

const WEB_TO_DB: &str = "\
tags: [web, db, ci]
rules:
  - name: web-to-db
    src: tag:web
    dst: tag:db
    proto: tcp
    ports: 5432
tests:
  - {src: tag:web, dst: tag:db, port: 5432, proto: tcp, expect: accept}
  - {src: tag:ci, dst: tag:db, port: 5432, proto: tcp, expect: deny}
";

async fn put(
    srv: &TestServer,
    document: &str,
    expected: u64,
    dry_run: bool,
) -> (StatusCode, Value) {
    let (s, b) = call(
        srv,
        Verb::Put,
        POLICY,
        &srv.operator_token,
        Some(json!({"document": document, "expected_version": expected, "dry_run": dry_run})),
    )
    .await;
    (s, b)
}

async fn current(srv: &TestServer) -> Value {
    let (s, b) = srv.op_get(POLICY).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    b
}

async fn tag(srv: &TestServer, node: Uuid, tags: &[&str]) -> (StatusCode, Value) {
    call(
        srv,
        Verb::Put,
        &format!("/v1/nodes/{node}/tags"),
        &srv.operator_token,
        Some(json!({ "tags": tags })),
    )
    .await
}

/// The Domain's events after `after`.
async fn events_after(srv: &TestServer, domain: Uuid, after: u64) -> Vec<events::DomainEventRow> {
    let mut c = srv.store.acquire().await.unwrap();
    events::for_domain(&mut c, domain, after, 100)
        .await
        .unwrap()
}

async fn head(srv: &TestServer, domain: Uuid) -> u64 {
    let mut c = srv.store.acquire().await.unwrap();
    events::head(&mut c, domain).await.unwrap().seq
}

/// Exactly one new event, a Domain-wide resync every node receives, with `reason`.
async fn one_resync(srv: &TestServer, domain: Uuid, after: u64, reason: &str, nodes: &[Uuid]) {
    let new = events_after(srv, domain, after).await;
    assert_eq!(new.len(), 1, "{new:?}");
    let e = &new[0];
    assert_eq!(
        e.kind,
        EventKind::Resync {
            reason: reason.to_owned()
        }
    );
    assert_eq!((e.target, e.subject), (None, Uuid::nil()));
    for n in nodes {
        assert!(is_recipient(e.target, e.subject, *n), "{n} would miss it");
    }
}

async fn round_trip(srv: &TestServer) {
    let first = current(srv).await;
    assert_eq!(first["version"], 1);
    assert_eq!(first["document"], DEFAULT_DOCUMENT);
    assert_eq!(first["author"], "plexsphere");
    let (web, db) = srv.enrol_pair().await;
    let domain = web.domain_id;
    let ids = [web.node_id, db.node_id];
    let before = head(srv, domain).await;
    let (s, b) = tag(srv, web.node_id, &["tag:web"]).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["tags"], json!(["web"]));
    one_resync(
        srv,
        domain,
        before,
        &format!("the tags of node {} changed", web.node_id),
        &ids,
    )
    .await;
    // The same set again changes nothing and tells nobody.
    let before = head(srv, domain).await;
    assert_eq!(tag(srv, web.node_id, &["web"]).await.0, StatusCode::OK);
    assert_eq!(head(srv, domain).await, before);
    assert_eq!(tag(srv, db.node_id, &["db"]).await.0, StatusCode::OK);
    assert_eq!(srv.node_view(db.node_id).await["tags"], json!(["db"]));

    // A dry run: the diff, nothing stored, no event.
    let before = head(srv, domain).await;
    let (s, dry) = put(srv, WEB_TO_DB, 1, true).await;
    assert_eq!(s, StatusCode::OK, "{dry}");
    assert_eq!(
        (&dry["applied"], &dry["previous_version"], &dry["version"]),
        (&json!(false), &json!(1), &json!(2))
    );
    let diff: Vec<String> = serde_json::from_value(dry["diff"].clone()).unwrap();
    assert!(diff.iter().any(|l| l.contains("loses")), "{diff:?}");
    assert_eq!(current(srv).await["version"], 1);
    assert_eq!(head(srv, domain).await, before);

    // Applied: version 2 with its author and diff, one resync event for every node.
    let (s, set) = put(srv, WEB_TO_DB, 1, false).await;
    assert_eq!(s, StatusCode::OK, "{set}");
    assert_eq!(
        (&set["applied"], &set["version"]),
        (&json!(true), &json!(2))
    );
    assert_eq!(set["diff"], dry["diff"]);
    one_resync(srv, domain, before, "policy version 2", &ids).await;
    let now = current(srv).await;
    assert_eq!(
        (&now["version"], now["document"].as_str()),
        (&json!(2), Some(WEB_TO_DB))
    );
    assert!(
        now["author"].as_str().unwrap().starts_with("test ("),
        "{now}"
    );
    assert_eq!(now["summary"], diff.join("\n"));

    // Explain by node id, with and without a port.
    let explain = |src: Uuid, dst: Uuid, what: &'static str| {
        let path = format!("{POLICY}/explain?src={src}&dst={dst}&what={what}");
        async move { srv.op_get(&path).await }
    };
    let (s, e) = explain(web.node_id, db.node_id, "5432/tcp").await;
    assert_eq!(s, StatusCode::OK, "{e}");
    assert_eq!((&e["allowed"], &e["version"]), (&json!(true), &json!(2)));
    assert!(
        e["lines"][0]
            .as_str()
            .unwrap()
            .contains("line 3 (web-to-db)"),
        "{e}"
    );
    let (_, e) = explain(db.node_id, web.node_id, "5432/tcp").await;
    assert_eq!(e["allowed"], false);
    assert!(
        e["lines"][0]
            .as_str()
            .unwrap()
            .contains("no rule allows it"),
        "{e}"
    );
    assert!(
        e["lines"][1]
            .as_str()
            .unwrap()
            .contains("a rule that would allow it"),
        "{e}"
    );
    let (s, e) = explain(web.node_id, Uuid::nil(), "").await;
    assert_code(s, &e, 404, "not_found");
    let (s, e) = explain(web.node_id, db.node_id, "5432/sctp").await;
    assert_code(s, &e, 400, "invalid_request");

    // Rollback: the old document as a new version, append-only.
    let before = head(srv, domain).await;
    let (s, r) = call(
        srv,
        Verb::Post,
        &format!("{POLICY}/rollback"),
        &srv.operator_token,
        Some(json!({"version": 1, "expected_version": 2})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!((&r["applied"], &r["version"]), (&json!(true), &json!(3)));
    one_resync(srv, domain, before, "policy version 3", &ids).await;
    assert_eq!(current(srv).await["document"], DEFAULT_DOCUMENT);
    let (s, h) = srv.op_get(&format!("{POLICY}/history")).await;
    assert_eq!(s, StatusCode::OK, "{h}");
    let versions: Vec<u64> = h["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, vec![3, 2, 1]);
    assert!(
        h["items"][0]["summary"]
            .as_str()
            .unwrap()
            .starts_with("rollback to version 1\n"),
        "{h}"
    );
    let (_, page) = srv
        .op_get(&format!("{POLICY}/history?limit=1&before=3"))
        .await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    assert_eq!(page["items"][0]["version"], 2);
    let (s, b) = srv.op_get(&format!("{POLICY}/history?limit=101")).await;
    assert_code(s, &b, 400, "invalid_request");
    let (s, b) = call(
        srv,
        Verb::Post,
        &format!("{POLICY}/rollback"),
        &srv.operator_token,
        Some(json!({"version": 9, "expected_version": 3})),
    )
    .await;
    assert_code(s, &b, 404, "not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_get_explain_history_and_rollback_round_trip() {
    let srv = TestServer::start().await;
    round_trip(&srv).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_get_explain_history_and_rollback_round_trip_on_postgres() {
    let Some(srv) = postgres::server().await else {
        return;
    };
    round_trip(&srv).await;
    srv.stop().await;
}

async fn concurrent_sets(srv: &TestServer) {
    // Eight writers that all read version 1: exactly one wins, the others learn version 2.
    let docs: Vec<String> = (0..8)
        .map(|i| {
            format!(
                "rules:\n  - {{src: '*', dst: '*', proto: tcp, ports: {}}}\n",
                1000 + i
            )
        })
        .collect();
    let answers = futures_util::future::join_all(docs.iter().map(|d| put(srv, d, 1, false))).await;
    let won: Vec<_> = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::OK)
        .collect();
    assert_eq!(won.len(), 1, "{answers:?}");
    for (s, b) in answers.iter().filter(|(s, _)| *s != StatusCode::OK) {
        assert_code(*s, b, 409, "conflict");
        assert_eq!(
            b["message"], "policy changed meanwhile (now version 2); re-run",
            "{b}"
        );
    }
    assert_eq!(current(srv).await["version"], 2);
    // A stale writer later loses too, and a writer ahead of the server as well.
    let (s, b) = put(srv, DEFAULT_DOCUMENT, 1, false).await;
    assert_code(s, &b, 409, "conflict");
    let (s, b) = put(srv, DEFAULT_DOCUMENT, 7, true).await;
    assert_code(s, &b, 409, "conflict");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_concurrent_sets_one_wins_and_the_others_get_409() {
    let srv = TestServer::start().await;
    concurrent_sets(&srv).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_concurrent_sets_one_wins_and_the_others_get_409_on_postgres() {
    let Some(srv) = postgres::server().await else {
        return;
    };
    concurrent_sets(&srv).await;
    srv.stop().await;
}

/// Each refused document: 422 `policy_invalid` with kind, line and column; nothing stored,
/// no event, version 1 still in force. Validate answers the same problems with 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_documents_are_refused_with_line_and_column_and_the_old_policy_stays() {
    let srv = TestServer::start().await;
    let node = srv.enrol(LAB_NODES).await;
    let domain = node.domain_id;
    let oversized = format!("# {}\nrules: []\n", "x".repeat(1024 * 1024));
    let cases: Vec<(&str, String, &str, u32, u32)> = vec![
        ("syntax", "rules:\n  - src: [\n".into(), "syntax", 3, 1),
        (
            "unknown project",
            "rules:\n  - {src: project:nope, dst: '*'}\n".into(),
            "unknown",
            2,
            0,
        ),
        (
            "failing test",
            WEB_TO_DB.replace("expect: deny", "expect: accept"),
            "test_failed",
            10,
            0,
        ),
        ("oversized", oversized, "limit", 0, 0),
    ];
    for (what, doc, kind, line, _) in &cases {
        let before = head(&srv, domain).await;
        let (s, b) = put(&srv, doc, 1, false).await;
        assert_code(s, &b, 422, "policy_invalid");
        let e = &b["errors"][0];
        assert_eq!(e["kind"], *kind, "{what}: {b}");
        if *line > 0 {
            assert_eq!(e["line"], *line, "{what}: {b}");
        }
        assert!(
            b["message"]
                .as_str()
                .unwrap()
                .contains("the policy in force is unchanged"),
            "{b}"
        );
        assert_eq!(current(&srv).await["version"], 1, "{what}");
        assert_eq!(
            head(&srv, domain).await,
            before,
            "{what}: an event was appended"
        );
        let (s, v) = call(
            &srv,
            Verb::Post,
            &format!("{POLICY}/validate"),
            &srv.operator_token,
            Some(json!({ "document": doc })),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["valid"], false);
        assert_eq!(v["errors"], b["errors"], "{what}");
    }
    // The unknown project is pointed at its column.
    let (_, b) = put(&srv, &cases[1].1, 1, false).await;
    assert!(b["errors"][0]["column"].as_u64().unwrap() > 0, "{b}");
    // A body past the route's limit: 413 before anything is parsed.
    let huge = "x".repeat(plexsphere::policy::ops::POLICY_BODY_LIMIT + 1);
    let (s, b) = put(&srv, &huge, 1, false).await;
    assert_code(s, &b, 413, "body_too_large");
    // A good document validates.
    let (s, v) = call(
        &srv,
        Verb::Post,
        &format!("{POLICY}/validate"),
        &srv.operator_token,
        Some(json!({ "document": WEB_TO_DB })),
    )
    .await;
    assert_eq!((s, &v["valid"]), (StatusCode::OK, &json!(true)), "{v}");
    srv.stop().await;
}

/// Read-only reads and validates; setting and rolling back need admin; tagging and tagged
/// tokens need a token not limited to a project.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_and_project_limits_are_enforced() {
    let srv = TestServer::start().await;
    let node = srv.enrol(LAB_NODES).await;
    let ro = fresh(&srv, OperatorScope::ReadOnly, None).await;
    let op = fresh(&srv, OperatorScope::Operator, None).await;
    let project_op = fresh(&srv, OperatorScope::Operator, Some(LAB_NODES)).await;
    let set = json!({"document": WEB_TO_DB, "expected_version": 1});
    let rollback = json!({"version": 1, "expected_version": 1});
    let tags_path = format!("/v1/nodes/{}/tags", node.node_id);
    let explain = format!("{POLICY}/explain?src={0}&dst={0}", node.node_id);
    for path in [POLICY.to_owned(), format!("{POLICY}/history"), explain] {
        let (s, b) = call(&srv, Verb::Get, &path, &ro, None).await;
        assert_eq!(s, StatusCode::OK, "{path}: {b}");
        let (s, b) = call(&srv, Verb::Get, &path, &project_op, None).await;
        assert_eq!(s, StatusCode::OK, "{path} with a project token: {b}");
    }
    let validate = json!({"document": WEB_TO_DB});
    let (s, b) = call(
        &srv,
        Verb::Post,
        &format!("{POLICY}/validate"),
        &ro,
        Some(validate),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    for bearer in [&ro, &op] {
        let (s, b) = call(&srv, Verb::Put, POLICY, bearer, Some(set.clone())).await;
        assert_code(s, &b, 403, "insufficient_scope");
        let (s, b) = call(
            &srv,
            Verb::Post,
            &format!("{POLICY}/rollback"),
            bearer,
            Some(rollback.clone()),
        )
        .await;
        assert_code(s, &b, 403, "insufficient_scope");
    }
    // A project-limited operator token is refused these too (admin tokens are never limited).
    let (s, b) = call(&srv, Verb::Put, POLICY, &project_op, Some(set)).await;
    assert_code(s, &b, 403, "insufficient_scope");
    let (s, b) = call(
        &srv,
        Verb::Put,
        &tags_path,
        &ro,
        Some(json!({"tags": ["web"]})),
    )
    .await;
    assert_code(s, &b, 403, "insufficient_scope");
    for bearer in [&project_op] {
        let (s, b) = call(
            &srv,
            Verb::Put,
            &tags_path,
            bearer,
            Some(json!({"tags": ["web"]})),
        )
        .await;
        assert_code(s, &b, 403, "forbidden");
        assert!(
            b["message"]
                .as_str()
                .unwrap()
                .contains("not limited to a project"),
            "{b}"
        );
        let issue = format!("/v1/projects/{LAB_NODES}/bootstrap-tokens");
        let tagged =
            json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 3600, "tags": ["web"]});
        let (s, b) = call(&srv, Verb::Post, &issue, bearer, Some(tagged)).await;
        assert_code(s, &b, 403, "forbidden");
        let plain = json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 3600});
        let (s, b) = call(&srv, Verb::Post, &issue, bearer, Some(plain)).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    assert_eq!(srv.node_view(node.node_id).await["tags"], json!([]));
    // An operator token for every project may tag; the policy stays at version 1 throughout.
    let (s, b) = call(
        &srv,
        Verb::Put,
        &tags_path,
        &op,
        Some(json!({"tags": ["web"]})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(current(&srv).await["version"], 1);
    srv.stop().await;
}

/// A token's tags are checked and fixed at issue; the node it registers carries them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tagged_tokens_node_registers_with_its_tags() {
    let srv = TestServer::start().await;
    let issue = format!("/v1/projects/{LAB_NODES}/bootstrap-tokens");
    let (s, t) = srv
        .op_post(
            &issue,
            json!({"kind": "node", "env_prefix": "asg", "ttl_secs": 3600, "max_uses": 2, "tags": ["tag:ci", "db", "ci"]}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    assert_eq!(t["tags"], json!(["ci", "db"]));
    let listed = srv.tokens(LAB_NODES).await;
    assert_eq!(
        listed.iter().find(|v| v.id == t["id"]).unwrap().tags,
        vec!["ci", "db"]
    );
    let (s, reg) = srv
        .register(&register_body(t["token"].as_str().unwrap(), &wg_key(77)))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{reg}");
    let id: Uuid = serde_json::from_value(reg["node_id"].clone()).unwrap();
    assert_eq!(srv.node_view(id).await["tags"], json!(["ci", "db"]));
    // The document may name the token's tags before any node carries them... and after.
    let doc = "rules:\n  - {src: tag:ci, dst: tag:db, proto: tcp, ports: 5432}\n";
    assert_eq!(put(&srv, doc, 1, true).await.0, StatusCode::OK);
    for bad in [
        json!(["a b"]),
        json!(["tag:"]),
        json!((0..33).map(|i| format!("t{i}")).collect::<Vec<_>>()),
    ] {
        let (s, b) = srv
            .op_post(
                &issue,
                json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 3600, "tags": bad}),
            )
            .await;
        assert_code(s, &b, 422, "invalid_request");
    }
    let (s, b) = call(
        &srv,
        Verb::Put,
        &format!("/v1/nodes/{id}/tags"),
        &srv.operator_token,
        Some(json!({"tags": ["ok", "not ok"]})),
    )
    .await;
    assert_code(s, &b, 422, "invalid_request");
    assert!(b["message"].as_str().unwrap().contains("not ok"), "{b}");
    srv.stop().await;
}
