//! Operator token scopes and project binding, walked over the one route table the router is
//! built from (`api::route_table`): every operator route is called with a token of every scope
//! over real TLS, against SQLite (and Postgres when one is configured).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::broker::{bucket_request, credential, phase};
use common::operators::{call, fresh};
use common::*;
use plexsphere::api::{self, Access, Verb};
use plexsphere_wire::admin::OperatorScope;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The path of a table row with its parameters filled in: the lab project, ids nothing has.
fn fill(path: &str) -> String {
    let missing_uuid = "019a0816-0000-7000-8000-0000000000ff";
    let missing_hex = "0123456789abcdef";
    let id = if path.starts_with("/v1/operator-tokens") {
        missing_hex
    } else {
        missing_uuid
    };
    path.replace("{project_id}", LAB_NODES)
        .replace("{node_id}", missing_uuid)
        .replace("{token_id}", missing_hex)
        .replace("{id}", id)
}

#[test]
fn every_route_has_an_access_and_only_reads_are_open_to_read_only() {
    let table = api::route_table();
    let mut seen = std::collections::HashSet::new();
    for r in &table {
        assert!(seen.insert((r.verb, r.path)), "{r:?} is in the table twice");
        if let Access::Operator(need) = r.access
            && !r.verb.reads_only()
            && !(r.verb == Verb::Post && api::COMPUTE_ONLY_POSTS.contains(&r.path))
            && !(r.verb == Verb::Post && api::SELF_POSTS.contains(&r.path))
        {
            assert!(
                need.token_scope() > OperatorScope::ReadOnly,
                "{r:?} writes but is open to read-only"
            );
        }
        if r.access == Access::Node {
            assert!(r.path.starts_with("/v1/nodes/{node_id}"), "{r:?}");
        }
    }
    // A new public route is a decision, not an accident.
    let public: Vec<_> = table
        .iter()
        .filter(|r| r.access == Access::Public)
        .map(|r| (r.verb.as_str(), r.path))
        .collect();
    assert_eq!(
        public,
        [
            ("GET", "/v1/version"),
            ("GET", "/v1/ca.crt"),
            ("POST", "/v1/register/challenge"),
            ("POST", "/v1/register"),
            ("GET", "/v1/auth/config"),
            ("GET", "/v1/auth/sign-in"),
            ("GET", "/v1/auth/callback"),
            ("POST", "/v1/auth/session"),
            ("GET", "/healthz"),
            ("GET", "/readyz")
        ]
    );
    let admin: Vec<_> = table
        .iter()
        .filter(|r| r.access == api::ADMIN)
        .map(|r| r.path)
        .collect();
    assert!(admin.contains(&"/v1/operator-tokens"), "{admin:?}");
    assert!(admin.contains(&"/v1/cloud-credentials"), "{admin:?}");
}

/// docs/api.md lists the same rows as the code, row for row.
#[test]
fn the_docs_scope_table_agrees_with_the_route_table() {
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api.md")).unwrap();
    let section = docs
        .split("### Operator token scopes")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    let rows: Vec<String> = section
        .lines()
        // A route row's first code span is `VERB /path`.
        .filter(|l| l.starts_with("| `") && l.split('`').nth(1).is_some_and(|c| c.contains(" /")))
        .map(str::to_owned)
        .collect();
    let table = api::route_table();
    let operator_routes: Vec<_> = table
        .iter()
        .filter_map(|r| match r.access {
            Access::Operator(s) => Some((r, s)),
            _ => None,
        })
        .collect();
    for (r, scope) in &operator_routes {
        let want = format!(
            "| `{} {}` | {} |",
            r.verb.as_str(),
            r.path,
            scope.token_scope().as_str()
        );
        assert!(
            rows.iter().any(|l| l.starts_with(&want)),
            "docs/api.md has no row starting {want}"
        );
    }
    assert_eq!(rows.len(), operator_routes.len(), "{rows:#?}");
}

async fn walk_every_operator_route(srv: &TestServer) {
    let mut tokens = Vec::new();
    for scope in OperatorScope::ALL {
        tokens.push((scope, fresh(srv, scope, None).await));
    }
    let mut checked = 0;
    for r in api::route_table() {
        let Access::Operator(need) = r.access else {
            continue;
        };
        // Sign-out ends a session: a token is told so (400), whatever its scope.
        if api::SELF_POSTS.contains(&r.path) {
            continue;
        }
        let allowed =
            |have: OperatorScope| plexsphere::auth::roles::Role::of_token(have).allows(need);
        let path = fill(r.path);
        for (have, bearer) in &tokens {
            let (status, body) = call(srv, r.verb, &path, bearer, None).await;
            let what = format!("{} {path} with a {} token", r.verb.as_str(), have.as_str());
            if !allowed(*have) {
                assert_eq!(status, StatusCode::FORBIDDEN, "{what}: {body}");
                assert_eq!(body["code"], "insufficient_scope", "{what}: {body}");
                assert!(
                    body["message"]
                        .as_str()
                        .unwrap()
                        .contains(need.token_scope().as_str()),
                    "{what}: {body}"
                );
            } else {
                assert!(
                    !matches!(status.as_u16(), 401 | 403 | 500..),
                    "{what} was refused: {status} {body}"
                );
                if r.verb.reads_only() && *have == OperatorScope::ReadOnly {
                    assert!(
                        matches!(status.as_u16(), 200 | 404),
                        "{what}: {status} {body}"
                    );
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 3 * 20, "only {checked} calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operator_route_answers_each_scope_as_the_table_says() {
    let srv = TestServer::start().await;
    walk_every_operator_route(&srv).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operator_route_answers_each_scope_as_the_table_says_on_postgres() {
    let Some(srv) = postgres::server().await else {
        return;
    };
    walk_every_operator_route(&srv).await;
    srv.stop().await;
}

/// A read-only token's writes are refused before anything is stored: the objects are still
/// there and unchanged afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_token_changes_nothing() {
    let srv = TestServer::start().await;
    let ro = fresh(&srv, OperatorScope::ReadOnly, None).await;
    let node = srv.enrol(LAB_NODES).await;
    let bt = srv.issue_token(LAB_NODES).await;
    let before = srv.tokens(LAB_NODES).await.len();
    let (s, b) = call(
        &srv,
        Verb::Post,
        &format!("/v1/projects/{LAB_NODES}/bootstrap-tokens"),
        &ro,
        Some(json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 3600})),
    )
    .await;
    assert_code(s, &b, 403, "insufficient_scope");
    let (s, b) = call(
        &srv,
        Verb::Post,
        &format!("/v1/bootstrap-tokens/{}/revoke", bt.id),
        &ro,
        None,
    )
    .await;
    assert_code(s, &b, 403, "insufficient_scope");
    let (s, b) = call(
        &srv,
        Verb::Post,
        &format!("/v1/nodes/{}/revoke", node.node_id),
        &ro,
        None,
    )
    .await;
    assert_code(s, &b, 403, "insufficient_scope");
    let tokens = srv.tokens(LAB_NODES).await;
    assert_eq!(tokens.len(), before);
    assert!(tokens.iter().all(|t| t.revoked_at.is_none()));
    let (s, view) = srv.op_get(&format!("/v1/nodes/{}", node.node_id)).await;
    assert_eq!(s, StatusCode::OK);
    assert_ne!(view["status"], "revoked", "{view}");
    // And its reads work.
    let (s, b) = call(&srv, Verb::Get, "/v1/nodes", &ro, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["items"].as_array().unwrap().len(), 1);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_bound_token_neither_sees_nor_changes_another_project() {
    let srv = TestServer::start().await;
    let mine = srv.enrol(LAB_NODES).await;
    let theirs = srv.enrol(OPENSTACK).await;
    let their_bt = srv.issue_token(OPENSTACK).await;
    let cred = credential(&srv, "local").await;
    let (s, their_res) = srv
        .op_post(
            &format!("/v1/projects/{OPENSTACK}/resources"),
            bucket_request(&cred, json!({"region": "us-east-1"})),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{their_res}");
    let their_res = their_res["id"].as_str().unwrap().to_owned();
    let bound = fresh(&srv, OperatorScope::Operator, Some(LAB_NODES)).await;
    let get = async |path: &str| call(&srv, Verb::Get, path, &bound, None).await;
    let post =
        async |path: &str, body: Option<Value>| call(&srv, Verb::Post, path, &bound, body).await;

    // Listings are filtered to its project.
    let (s, b) = get("/v1/projects").await;
    assert_eq!(s, StatusCode::OK);
    let ids: Vec<_> = b["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].clone())
        .collect();
    assert_eq!(ids, [json!(LAB_NODES)]);
    let (s, b) = get("/v1/domains").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["items"].as_array().unwrap().len(), 1);
    let (_, b) = get("/v1/nodes").await;
    let ids: Vec<_> = b["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].clone())
        .collect();
    assert_eq!(ids, [json!(mine.node_id)]);
    let (s, b) = get(&format!("/v1/nodes?project_id={OPENSTACK}")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["items"], json!([]));

    // Another project's objects answer 404, as if they did not exist.
    for path in [
        format!("/v1/nodes/{}", theirs.node_id),
        format!("/v1/nodes/{}/observations", theirs.node_id),
        format!("/v1/projects/{OPENSTACK}/bootstrap-tokens"),
        format!("/v1/projects/{OPENSTACK}/resources"),
        format!("/v1/resources/{their_res}"),
    ] {
        let (s, b) = get(&path).await;
        assert_code(s, &b, 404, "not_found");
    }
    let (s, b) = post(&format!("/v1/nodes/{}/revoke", theirs.node_id), None).await;
    assert_code(s, &b, 404, "not_found");
    let (s, b) = post(
        &format!("/v1/bootstrap-tokens/{}/revoke", their_bt.id),
        None,
    )
    .await;
    assert_code(s, &b, 404, "not_found");
    let (s, b) = post(
        &format!("/v1/projects/{OPENSTACK}/bootstrap-tokens"),
        Some(json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 3600})),
    )
    .await;
    assert_code(s, &b, 404, "not_found");
    let (s, b) = post(
        &format!("/v1/projects/{OPENSTACK}/resources"),
        Some(bucket_request(&cred, json!({"region": "us-east-1"}))),
    )
    .await;
    assert_code(s, &b, 404, "not_found");
    let (s, b) = call(
        &srv,
        Verb::Delete,
        &format!("/v1/resources/{their_res}"),
        &bound,
        None,
    )
    .await;
    assert_code(s, &b, 404, "not_found");

    // Nothing of theirs changed.
    let (_, node) = srv.op_get(&format!("/v1/nodes/{}", theirs.node_id)).await;
    assert_ne!(node["status"], "revoked", "{node}");
    let tokens = srv.tokens(OPENSTACK).await;
    assert!(tokens.iter().all(|t| t.revoked_at.is_none()), "{tokens:?}");
    let (_, res) = srv.op_get(&format!("/v1/resources/{their_res}")).await;
    assert!(
        !["Deprovisioning", "Deleted"].contains(&phase(&res)),
        "{res}"
    );

    // Its own project works.
    let (s, b) = get(&format!("/v1/nodes/{}", mine.node_id)).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, b) = post(
        &format!("/v1/projects/{LAB_NODES}/bootstrap-tokens"),
        Some(json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 3600})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    srv.stop().await;
}
