//! Subnet routes and exits against the real server (issue 27): reports, approval, the primary
//! and its failover (probe failure at once, a killed router within the lease and the
//! leader's sweep), the prefix in the primary's allowed IPs only, the policy deciding who
//! gets the router as a peer and the prefix, exits, and bad reports refused as a whole.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::nodes::{BOUND, pull};
use common::*;
use plexsphere::api::Verb;
use plexsphere_wire::RegisterResponse;
use plexsphere_wire::node::NodeState;
use plexsphere_wire::routes::{RouteEntry, RouterRole};
use plexsphere_wire::signed::{DomainVerifier, SignContext};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

const NET: &str = "10.1.0.0/24";

async fn state(srv: &TestServer, reg: &RegisterResponse) -> NodeState {
    let (status, _, env) = pull(srv, reg, None).await;
    assert_eq!(status, StatusCode::OK);
    let verifier = DomainVerifier::from_b64(&reg.domain_signing_public_key).unwrap();
    verifier
        .open(SignContext::NodeState, &env.unwrap())
        .unwrap()
}

/// The prefixes beyond its host route that `me`'s state puts on peer `peer` (None: no peer).
async fn routes_via(srv: &TestServer, me: &RegisterResponse, peer: Uuid) -> Option<Vec<String>> {
    let s = state(srv, me).await;
    let p = s.peers.iter().find(|p| p.node_id == peer)?;
    Some(p.allowed_ips[1..].iter().map(|n| n.to_string()).collect())
}

async fn report(srv: &TestServer, reg: &RegisterResponse, body: Value) -> (StatusCode, Value) {
    let r = srv
        .node_req(Method::PUT, reg, "/routes")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn route(healthy: bool) -> Value {
    json!({"advertise": [{"cidr": NET, "probe": "10.1.0.5", "healthy": healthy}]})
}

async fn decide(srv: &TestServer, what: &str, node: Uuid, cidr: &str) -> (StatusCode, Value) {
    srv.op_post(
        &format!("/v1/routes/{what}"),
        json!({"node_id": node, "cidr": cidr}),
    )
    .await
}

async fn list(srv: &TestServer) -> Vec<RouteEntry> {
    let (s, body) = srv.op_get("/v1/routes").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    serde_json::from_value(body).unwrap()
}

async fn primary(srv: &TestServer) -> Option<Uuid> {
    list(srv)
        .await
        .iter()
        .filter(|e| e.cidr.to_string() == NET)
        .flat_map(|e| e.routers.iter())
        .find(|r| r.role == RouterRole::Primary)
        .map(|r| r.node_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_is_approved_carried_by_one_primary_and_fails_over() {
    let srv = TestServer::start().await;
    let (r1, r2) = srv.enrol_pair().await;
    let a = srv.enrol(LAB_NODES).await;

    let (s, ack) = report(&srv, &r1, route(true)).await;
    assert_eq!(s, StatusCode::OK, "{ack}");
    assert_eq!(ack["routes"][0]["approval"], "pending", "{ack}");
    assert_eq!(ack["routes"][0]["role"], "inactive", "{ack}");
    assert_eq!(ack["renew_secs"], 1);
    assert_eq!(
        routes_via(&srv, &a, r1.node_id).await.unwrap(),
        Vec::<String>::new(),
        "pending carries nothing"
    );

    let (s, entry) = decide(&srv, "approve", r1.node_id, NET).await;
    assert_eq!(s, StatusCode::OK, "{entry}");
    assert_eq!(entry["routers"][0]["role"], "primary", "{entry}");
    assert_eq!(routes_via(&srv, &a, r1.node_id).await.unwrap(), vec![NET]);
    let s1 = state(&srv, &r1).await;
    assert_eq!(s1.served_routes.len(), 1);
    assert_eq!(s1.served_routes[0].role, RouterRole::Primary);
    let view = s1.policy.unwrap().view;
    let a_in = view.peers.iter().find(|p| p.id == a.node_id).unwrap();
    assert_eq!(
        a_in.routes_in[0].prefix.to_string(),
        NET,
        "the router may forward for a"
    );

    // A second router stands by: the prefix stays on the primary only.
    report(&srv, &r2, route(true)).await;
    decide(&srv, "approve", r2.node_id, NET).await;
    assert_eq!(primary(&srv).await, Some(r1.node_id));
    assert_eq!(
        routes_via(&srv, &a, r2.node_id).await.unwrap(),
        Vec::<String>::new()
    );

    // r1's probe fails: r2 takes over at once (no router passed the hold-down: the longest
    // healthy one anyway), and r1 does not take back over when it recovers.
    let (_, ack) = report(&srv, &r1, route(false)).await;
    assert!(
        ack["routes"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("probe of 10.1.0.5 fails"),
        "{ack}"
    );
    assert_eq!(primary(&srv).await, Some(r2.node_id));
    assert_eq!(routes_via(&srv, &a, r2.node_id).await.unwrap(), vec![NET]);
    assert_eq!(
        routes_via(&srv, &a, r1.node_id).await.unwrap(),
        Vec::<String>::new()
    );
    report(&srv, &r1, route(true)).await;
    report(&srv, &r2, route(true)).await;
    assert_eq!(primary(&srv).await, Some(r2.node_id), "no pre-emption");

    // r2 is killed (stops reporting) while r1 renews: the leader's sweep moves the route
    // once r2's lease expired.
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        report(&srv, &r1, route(true)).await;
        if primary(&srv).await == Some(r1.node_id) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "r2's lease never expired"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert_eq!(routes_via(&srv, &a, r1.node_id).await.unwrap(), vec![NET]);
    let r2_row = list(&srv).await[0]
        .routers
        .iter()
        .find(|r| r.node_id == r2.node_id)
        .unwrap()
        .clone();
    assert!(r2_row.reason.contains("no report for"), "{r2_row:?}");

    // Denying the primary moves nothing back to it; withdrawing (an empty report) ends it.
    let (s, _) = decide(&srv, "deny", r1.node_id, NET).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(primary(&srv).await, None, "r2 is gone, r1 denied");
    assert_eq!(
        routes_via(&srv, &a, r1.node_id).await.unwrap(),
        Vec::<String>::new()
    );
    let (s, _) = report(&srv, &r1, json!({})).await;
    assert_eq!(s, StatusCode::OK);
    assert!(state(&srv, &r1).await.served_routes.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reports_are_refused_whole_with_every_route_named() {
    let srv = TestServer::start().await;
    let (r, _) = srv.enrol_pair().await;
    let (_, domains) = srv.op_get("/v1/domains").await;
    let mesh = domains["items"][0]["mesh_cidr"]
        .as_str()
        .unwrap()
        .to_owned();
    let (s, body) = report(
        &srv,
        &r,
        json!({"advertise": [
            {"cidr": "127.0.0.0/8", "healthy": true},
            {"cidr": "10.1.0.7/24", "healthy": true},
            {"cidr": mesh, "healthy": true},
            {"cidr": "10.2.0.0/24", "probe": "10.9.9.9", "healthy": true},
            {"cidr": "10.3.0.0/24", "healthy": true},
            {"cidr": "10.3.0.0/24", "healthy": true},
            {"cidr": "0.0.0.0/0", "healthy": true},
        ], "use_exit": "Not A Label"}),
    )
    .await;
    assert_code(s, &body, 400, "route_refused");
    let msg = body["message"].as_str().unwrap();
    for want in [
        "127.0.0.0/8",
        "10.1.0.7/24",
        &mesh,
        "10.9.9.9",
        "10.3.0.0/24: advertised twice",
        "0.0.0.0/0",
        "use_exit",
    ] {
        assert!(msg.contains(want), "{want} not named: {msg}");
    }
    assert!(list(&srv).await.is_empty(), "nothing stored");
    let many: Vec<Value> = (0..65)
        .map(|i| json!({"cidr": format!("10.{}.0.0/24", 100 + i), "healthy": true}))
        .collect();
    let (s, body) = report(&srv, &r, json!({ "advertise": many })).await;
    assert_code(s, &body, 400, "route_refused");
    assert!(
        body["message"].as_str().unwrap().contains("at most 64"),
        "{body}"
    );
    // Approving what a node does not advertise, and a project-bound token.
    let (s, body) = decide(&srv, "approve", r.node_id, "10.5.0.0/24").await;
    assert_code(s, &body, 404, "not_found");
    let limited = operators::fresh(
        &srv,
        plexsphere_wire::admin::OperatorScope::Operator,
        Some(LAB_NODES),
    )
    .await;
    report(&srv, &r, route(true)).await;
    let (s, body) = operators::call(
        &srv,
        Verb::Post,
        "/v1/routes/approve",
        &limited,
        Some(json!({"node_id": r.node_id, "cidr": NET})),
    )
    .await;
    assert_code(s, &body, 403, "forbidden");
}

async fn set_policy(srv: &TestServer, doc: &str) {
    let (_, domains) = srv.op_get("/v1/domains").await;
    let domain = domains["items"][0]["slug"].as_str().unwrap().to_owned();
    let path = format!("/v1/domains/{domain}/policy");
    let (_, cur) = srv.op_get(&path).await;
    let body = json!({"document": doc, "expected_version": cur["version"]});
    let (s, body) = operators::call(srv, Verb::Put, &path, &srv.operator_token, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{body}");
}

async fn tag(srv: &TestServer, node: Uuid, tags: &[&str]) {
    let path = format!("/v1/nodes/{node}/tags");
    let (s, body) = operators::call(
        srv,
        Verb::Put,
        &path,
        &srv.operator_token,
        Some(json!({ "tags": tags })),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_decides_who_uses_a_route_and_auto_approves() {
    let srv = TestServer::start().await;
    let (r, a) = srv.enrol_pair().await;
    let b = srv.enrol(LAB_NODES).await;
    tag(&srv, r.node_id, &["lan-router"]).await;
    tag(&srv, a.node_id, &["client"]).await;
    set_policy(
        &srv,
        "auto_approvers:\n  routes: {\"10.0.0.0/8\": [tag:lan-router]}\nrules:\n  - {src: tag:client, dst: '10.1.0.0/25', proto: tcp, ports: 22}\n",
    )
    .await;
    let (s, ack) = report(&srv, &r, route(true)).await;
    assert_eq!(s, StatusCode::OK, "{ack}");
    assert_eq!(
        ack["routes"][0]["approval"], "approved",
        "auto-approved: {ack}"
    );
    assert_eq!(ack["routes"][0]["role"], "primary", "{ack}");
    // a may use the part of the route its rule names, for tcp 22 only; b gets nothing: not
    // even the router as a peer.
    assert_eq!(
        routes_via(&srv, &a, r.node_id).await.unwrap(),
        vec!["10.1.0.0/25"]
    );
    let view = state(&srv, &a).await.policy.unwrap().view;
    let peer = view.peers.iter().find(|p| p.id == r.node_id).unwrap();
    let g = view.grant(Some(peer.routes_out[0].grant)).unwrap();
    assert_eq!(g.access.to_string(), "tcp 22", "{g:?}");
    assert_eq!(
        routes_via(&srv, &b, r.node_id).await,
        None,
        "b may not use the route"
    );
    // An untagged router's route stays pending.
    let (_, ack) = report(
        &srv,
        &b,
        json!({"advertise": [{"cidr": "10.9.0.0/24", "healthy": true}]}),
    )
    .await;
    assert_eq!(ack["routes"][0]["approval"], "pending", "{ack}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_is_used_only_by_the_nodes_that_name_it_without_the_mesh_range() {
    let srv = TestServer::start().await;
    let (e, a) = srv.enrol_pair().await;
    let b = srv.enrol(LAB_NODES).await;
    let (_, ack) = report(&srv, &e, json!({"exit": true})).await;
    assert_eq!(ack["routes"].as_array().unwrap().len(), 2, "{ack}");
    let exit_name = state(&srv, &e).await.dns.unwrap().name;
    let (_, ack) = report(&srv, &a, json!({"use_exit": exit_name})).await;
    assert!(
        ack["use_exit_error"].as_str().unwrap().contains("approval"),
        "{ack}"
    );
    let (s, entry) = decide(&srv, "approve", e.node_id, "0.0.0.0/0").await;
    assert_eq!(s, StatusCode::OK, "{entry}");
    let (_, ack) = report(&srv, &a, json!({"use_exit": exit_name})).await;
    assert!(ack.get("use_exit_error").is_none(), "{ack}");
    let via = routes_via(&srv, &a, e.node_id).await.unwrap();
    assert!(
        via.contains(&"0.0.0.0/2".to_string()) || via.iter().any(|p| p.starts_with("128.0.0.0/")),
        "{via:?}"
    );
    assert!(via.iter().any(|p| p.contains(':')), "IPv6 too: {via:?}");
    let mesh: ipnet::IpNet = state(&srv, &a).await.mesh_cidr;
    for p in &via {
        let p: ipnet::IpNet = p.parse().unwrap();
        assert!(
            !p.contains(&mesh.network()) && !mesh.contains(&p.network()),
            "{p} overlaps {mesh}"
        );
    }
    assert_eq!(
        routes_via(&srv, &b, e.node_id).await.unwrap(),
        Vec::<String>::new(),
        "b does not use it"
    );
    assert_eq!(state(&srv, &e).await.served_routes.len(), 2);
}
