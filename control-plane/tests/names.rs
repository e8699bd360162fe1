//! DNS names against the real server (issue 27): registration names a node from its host
//! name made unique in the Domain, the signed state carries every name and the suffix, a
//! rename and a suffix change reach every node with a `resync`, a name another live node
//! holds is `409 name_taken`, a revoked node frees its name, bad input is refused clearly,
//! and a token limited to a project may not rename.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::nodes::pull;
use common::*;
use plexsphere::api::Verb;
use plexsphere_wire::RegisterResponse;
use plexsphere_wire::admin::OperatorScope;
use plexsphere_wire::node::{EventKind, NodeState};
use plexsphere_wire::signed::{DomainVerifier, SignContext};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

async fn state(srv: &TestServer, reg: &RegisterResponse) -> NodeState {
    let (status, _, env) = pull(srv, reg, None).await;
    assert_eq!(status, StatusCode::OK);
    let verifier = DomainVerifier::from_b64(&reg.domain_signing_public_key).unwrap();
    verifier
        .open(SignContext::NodeState, &env.unwrap())
        .unwrap()
}

fn peer_name(s: &NodeState, id: Uuid) -> Option<String> {
    s.peers
        .iter()
        .find(|p| p.node_id == id)
        .and_then(|p| p.dns_name.clone())
}

async fn rename(srv: &TestServer, bearer: &str, node: Uuid, name: &str) -> (StatusCode, Value) {
    let path = format!("/v1/nodes/{node}/name");
    operators::call(srv, Verb::Put, &path, bearer, Some(json!({ "name": name }))).await
}

async fn names_follow_registration_renames_and_revocations(srv: &TestServer) {
    let (a, b) = srv.enrol_pair().await;
    // Both registered as host `node-1`: the second is made unique.
    let sa = state(srv, &a).await;
    let dns = sa.dns.clone().unwrap();
    assert_eq!(
        (dns.suffix.as_str(), dns.name.as_str()),
        ("mesh.internal", "node-1")
    );
    assert_eq!(peer_name(&sa, b.node_id).as_deref(), Some("node-1-2"));
    let (_, view) = srv.op_get(&format!("/v1/nodes/{}", b.node_id)).await;
    assert_eq!(view["name"], "node-1-2", "{view}");

    // A rename reaches the peer with a resync, and its state carries the new name.
    let mut events = srv.open_events(&a, None).await;
    let (s, view) = rename(srv, &srv.operator_token, b.node_id, "db").await;
    assert_eq!(s, StatusCode::OK, "{view}");
    assert_eq!(view["name"], "db");
    let ev = events.next_event().await.unwrap();
    assert!(matches!(ev.kind, EventKind::Resync { .. }), "{ev:?}");
    assert_eq!(
        peer_name(&state(srv, &a).await, b.node_id).as_deref(),
        Some("db")
    );
    assert_eq!(state(srv, &b).await.dns.unwrap().name, "db");

    // The same name again changes nothing; a held name is refused; bad labels are refused.
    let version = state(srv, &a).await.version;
    assert_eq!(
        rename(srv, &srv.operator_token, b.node_id, "db").await.0,
        StatusCode::OK
    );
    assert_eq!(
        state(srv, &a).await.version,
        version,
        "no event for the same name"
    );
    let (s, body) = rename(srv, &srv.operator_token, a.node_id, "db").await;
    assert_code(s, &body, 409, "name_taken");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains(&b.node_id.to_string()),
        "{body}"
    );
    for bad in ["", "Db", "-db", "db-", "d_b", "123", &"x".repeat(64)] {
        let (s, body) = rename(srv, &srv.operator_token, a.node_id, bad).await;
        assert_code(s, &body, 422, "invalid_request");
    }

    // A token limited to a project may not rename (every node of the Domain resolves names).
    let limited = operators::fresh(srv, OperatorScope::Operator, Some(LAB_NODES)).await;
    let (s, body) = rename(srv, &limited, a.node_id, "web").await;
    assert_code(s, &body, 403, "forbidden");

    // A revoked node frees its name; a new registration with the same host name takes the
    // first free label.
    let (s, _) = srv
        .op_post(&format!("/v1/nodes/{}/revoke", b.node_id), json!({}))
        .await;
    assert!(s.is_success(), "{s}");
    let (s, view) = rename(srv, &srv.operator_token, a.node_id, "db").await;
    assert_eq!(s, StatusCode::OK, "{view}");
    let c = srv.enrol(LAB_NODES).await;
    assert_eq!(state(srv, &c).await.dns.unwrap().name, "node-1");
}

async fn the_suffix_is_read_set_and_checked(srv: &TestServer) {
    let (a, _b) = srv.enrol_pair().await;
    let (_, domains) = srv.op_get("/v1/domains").await;
    let domain = domains["items"][0]["slug"].as_str().unwrap().to_owned();
    let path = format!("/v1/domains/{domain}/dns");
    let (s, got) = srv.op_get(&path).await;
    assert_eq!(s, StatusCode::OK, "{got}");
    assert_eq!(got, json!({"suffix": "mesh.internal"}));
    let put = |body: Value| operators::call(srv, Verb::Put, &path, &srv.operator_token, Some(body));
    let (s, got) = put(json!({"suffix": "corp.internal"})).await;
    assert_eq!(s, StatusCode::OK, "{got}");
    assert_eq!(state(srv, &a).await.dns.unwrap().suffix, "corp.internal");
    for bad in ["", ".internal", "Corp.internal", "a..b", "x_y.internal"] {
        let (s, body) = put(json!({ "suffix": bad })).await;
        assert_code(s, &body, 422, "invalid_request");
    }
    let reader = operators::fresh(srv, OperatorScope::ReadOnly, None).await;
    let (s, body) = operators::call(
        srv,
        Verb::Put,
        &path,
        &reader,
        Some(json!({"suffix": "x.internal"})),
    )
    .await;
    assert_code(s, &body, 403, "insufficient_scope");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_on_sqlite() {
    let srv = TestServer::start().await;
    names_follow_registration_renames_and_revocations(&srv).await;
    the_suffix_is_read_set_and_checked(&srv).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_on_postgres() {
    let Some(srv) = postgres::server().await else {
        return;
    };
    names_follow_registration_renames_and_revocations(&srv).await;
    the_suffix_is_read_set_and_checked(&srv).await;
}
