//! The node API against the real server: authentication, heartbeat and online/offline, the
//! signed state with its ETag, ingest and leave. Endpoint reports are `node_endpoints.rs`'s.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::time::Duration;

use common::nodes::pull;
use common::*;
use plexsphere_wire::node::NodeState;
use plexsphere_wire::signed::{DomainVerifier, SignContext};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_refuses_with_exact_codes() {
    let srv = TestServer::start().await;
    let a = srv.enrol_pair().await;
    let (a, b) = (&a.0, &a.1);
    let hb = json!({"uptime_secs": 1, "plexd_version": "0.1.0", "peers": {"configured": 0, "connected": 0}});
    let call = |path: String, auth: Option<String>| {
        let mut req = srv.client.post(srv.url(&path)).json(&hb);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        async move {
            let r = req.send().await.unwrap();
            let s = r.status();
            (s, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let path_a = format!("/v1/nodes/{}/heartbeat", a.node_id);
    let bearer_a = Some(format!("Bearer {}", a.node_credential));
    let (s, body) = call(path_a.clone(), None).await;
    assert_code(s, &body, 401, "unauthorized");
    let (s, body) = call(path_a.clone(), Some("Bearer pxnk_nonsense".into())).await;
    assert_code(s, &body, 401, "unauthorized");
    // The right node with a wrong secret.
    let wrong = format!("Bearer pxnk_{}_{}", a.node_id.simple(), "A".repeat(43));
    let (s, body) = call(path_a.clone(), Some(wrong)).await;
    assert_code(s, &body, 401, "unauthorized");
    // A's credential on B's path.
    let (s, body) = call(
        format!("/v1/nodes/{}/heartbeat", b.node_id),
        bearer_a.clone(),
    )
    .await;
    assert_code(s, &body, 403, "forbidden");
    let (s, body) = call("/v1/nodes/not-a-uuid/heartbeat".into(), bearer_a.clone()).await;
    assert_code(s, &body, 400, "invalid_request");
    let (s, body) = call(path_a.clone(), bearer_a.clone()).await;
    assert_eq!(s, StatusCode::OK, "{body}");

    // Revoked: 403 node_revoked on every node call.
    let (s, view) = srv
        .op_post(&format!("/v1/nodes/{}/revoke", a.node_id), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{view}");
    assert_eq!(view["status"], "revoked");
    let (s, body) = call(path_a, bearer_a.clone()).await;
    assert_code(s, &body, 403, "node_revoked");
    let r = srv.node_req(Method::GET, a, "/state").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Revoking twice is fine; an unknown node is 404.
    let (s, again) = srv
        .op_post(&format!("/v1/nodes/{}/revoke", a.node_id), json!({}))
        .await;
    assert_eq!((s, &again["status"]), (StatusCode::OK, &json!("revoked")));
    let (s, body) = srv
        .op_post(
            "/v1/nodes/019a0816-0000-7000-8000-0000000000ff/revoke",
            json!({}),
        )
        .await;
    assert_code(s, &body, 404, "not_found");

    // Deleted (left): 401.
    let r = srv.node_req(Method::DELETE, b, "").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (s, body) = srv.heartbeat(b).await;
    assert_code(s, &body, 401, "unauthorized");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_marks_online_and_silence_turns_offline() {
    let srv = TestServer::start_with(Options {
        offline_after: Some(Duration::from_secs(1)),
        ..Options::default()
    })
    .await;
    let a = srv.enrol(LAB_NODES).await;
    assert_eq!(srv.node_view(a.node_id).await["status"], "registered");
    let (s, ack) = srv.heartbeat(&a).await;
    assert_eq!(s, StatusCode::OK, "{ack}");
    // Registration of `a` was the Domain's first event.
    assert_eq!(ack["state_version"], 1);
    assert_eq!(ack["intervals"]["heartbeat_secs"], 30);
    let view = srv.node_view(a.node_id).await;
    assert_eq!(view["status"], "online");
    assert_eq!(view["plexd_version"], "0.2.0");
    assert!(view["last_seen_at"].is_string());
    // No more heartbeats: offline once the threshold has passed.
    srv.wait_for("the node to turn offline", async || {
        srv.node_view(a.node_id).await["status"] == "offline"
    })
    .await;
    let (s, _) = srv.heartbeat(&a).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(srv.node_view(a.node_id).await["status"], "online");

    // A heartbeat with a bad version or shape is refused.
    let r = srv
        .node_req(Method::POST, &a, "/heartbeat")
        .json(&json!({"uptime_secs": 1, "plexd_version": "", "peers": {"configured": 0, "connected": 0}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let r = srv
        .node_req(Method::POST, &a, "/heartbeat")
        .json(&json!({"uptime_secs": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_is_signed_lists_peers_and_answers_304_until_it_changes() {
    let srv = TestServer::start().await;
    let (a, b) = srv.enrol_pair().await;
    let (s, etag, env) = pull(&srv, &a, None).await;
    assert_eq!(s, StatusCode::OK);
    let verifier = DomainVerifier::from_b64(&a.domain_signing_public_key).unwrap();
    let state: NodeState = verifier
        .open(SignContext::NodeState, &env.clone().unwrap())
        .unwrap();
    assert_eq!(
        etag.as_deref(),
        Some(format!("\"{}\"", state.version).as_str())
    );
    assert_eq!(state.node_id, a.node_id);
    assert_eq!(state.mesh_ip, a.mesh_ip);
    assert_eq!(state.mesh_cidr, a.mesh_cidr);
    assert_eq!(state.listen_port, 51820);
    assert_eq!(state.peers.len(), 1);
    let peer = &state.peers[0];
    assert_eq!(peer.node_id, b.node_id);
    assert_eq!(peer.mesh_ip, b.mesh_ip);
    assert_eq!(peer.allowed_ips[0].to_string(), format!("{}/32", b.mesh_ip));
    assert_eq!(peer.persistent_keepalive_secs, Some(25));
    // As an event, the same bytes are refused.
    assert!(
        verifier
            .open::<NodeState>(SignContext::Event, &env.unwrap())
            .is_err()
    );

    let (s, same, body) = pull(&srv, &a, etag.as_deref()).await;
    assert_eq!(s, StatusCode::NOT_MODIFIED);
    assert_eq!(same, etag);
    assert!(body.is_none());

    // A new node bumps the version: the old tag no longer matches.
    let c = srv.enrol(LAB_NODES).await;
    let (s, newer, env) = pull(&srv, &a, etag.as_deref()).await;
    assert_eq!(s, StatusCode::OK);
    let state2: NodeState = verifier
        .open(SignContext::NodeState, &env.unwrap())
        .unwrap();
    assert!(state2.version > state.version);
    assert_eq!(newer, Some(format!("\"{}\"", state2.version)));
    let ids: Vec<_> = state2.peers.iter().map(|p| p.node_id).collect();
    assert_eq!(ids, vec![b.node_id, c.node_id]);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_accepts_batches_and_refuses_oversized_ones() {
    let srv = TestServer::start().await;
    let a = srv.enrol(LAB_NODES).await;
    let obs = json!({"at": 1, "type": "traffic", "peer_node_id": a.node_id, "rx_bytes": 1, "tx_bytes": 2});
    let send = |body: Value| srv.node_req(Method::POST, &a, "/ingest").json(&body).send();
    let r = send(json!({"batch_id": uuid::Uuid::new_v4(), "observations": [obs], "dropped": 3}))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    // Without its id a batch could not be told apart from its own retry.
    let r = send(json!({"observations": [obs]})).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["code"], "invalid_json");
    assert!(b["message"].as_str().unwrap().contains("batch_id"), "{b}");
    // Small enough to fit the body limit, too many to accept.
    let tiny = json!({"at": 1, "type": "error", "message": ""});
    let many: Vec<Value> = (0..5000).map(|_| tiny.clone()).collect();
    let r = send(json!({"batch_id": uuid::Uuid::new_v4(), "observations": many}))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let big = "x".repeat(300 * 1024);
    let r = send(json!({"batch_id": uuid::Uuid::new_v4(),
        "observations": [{"at": 1, "type": "error", "message": big}]}))
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["code"], "body_too_large");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leave_deletes_the_node_and_frees_its_mesh_ip() {
    let srv = TestServer::start().await;
    let (a, b) = srv.enrol_pair().await;
    let r = srv.node_req(Method::DELETE, &a, "").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (s, body) = srv.op_get(&format!("/v1/nodes/{}", a.node_id)).await;
    assert_code(s, &body, 404, "not_found");
    // b's state no longer lists a.
    let (_, _, env) = pull(&srv, &b, None).await;
    let verifier = DomainVerifier::from_b64(&b.domain_signing_public_key).unwrap();
    let state: NodeState = verifier
        .open(SignContext::NodeState, &env.unwrap())
        .unwrap();
    assert!(state.peers.is_empty());
    // Addresses are handed out next-fit: the next node gets the address after b's, and a's
    // comes round again only when the walk reaches it (here moved there, as after the rest
    // of the range was handed out). Then it is free to take.
    let c = srv.enrol(LAB_NODES).await;
    assert!(c.mesh_ip > b.mesh_ip && c.mesh_ip != a.mesh_ip, "{c:?}");
    let mut conn = srv.store.acquire().await.unwrap();
    let before_a = match a.mesh_ip {
        std::net::IpAddr::V4(v4) => {
            std::net::IpAddr::from(std::net::Ipv4Addr::from(u32::from(v4) - 1))
        }
        other => panic!("the lab hands out IPv4: {other}"),
    };
    plexsphere::store::mesh_ips::advance_cursor(&mut conn, a.domain_id, a.mesh_cidr, before_a)
        .await
        .unwrap();
    drop(conn);
    let d = srv.enrol(LAB_NODES).await;
    assert_eq!(d.mesh_ip, a.mesh_ip);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_view_shows_what_the_last_heartbeat_reported_on_sqlite() {
    let srv = TestServer::start().await;
    heartbeat_in_node_view(&srv).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_view_shows_what_the_last_heartbeat_reported_on_postgres() {
    let Some(srv) = postgres::server().await else {
        return;
    };
    heartbeat_in_node_view(&srv).await;
    srv.stop().await;
}

/// Null heartbeat figures before the first heartbeat; then the operator's node view (one node
/// and the list) shows exactly what the heartbeat and ingest reported.
async fn heartbeat_in_node_view(srv: &TestServer) {
    let a = srv.enrol(LAB_NODES).await;
    let path = format!("/v1/nodes/{}", a.node_id);

    // Before any heartbeat: null figures and nothing dropped.
    let (s, before) = srv.op_get(&path).await;
    assert_eq!(s, StatusCode::OK, "{before}");
    for field in [
        "last_heartbeat_at",
        "uptime_secs",
        "applied_state_version",
        "peers_configured",
        "peers_connected",
    ] {
        assert_eq!(before[field], Value::Null, "{field} in {before}");
    }
    assert_eq!(before["observations_dropped"], 0, "{before}");

    // Another authenticated call moves last_seen_at but not the heartbeat.
    let r = srv
        .node_req(Method::GET, &a, "/state")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let seen = srv.node_view(a.node_id).await;
    assert!(seen["last_seen_at"].is_string(), "{seen}");
    assert_eq!(seen["last_heartbeat_at"], Value::Null, "{seen}");

    let r = srv
        .node_req(Method::POST, &a, "/heartbeat")
        .json(&json!({
            "uptime_secs": 3723,
            "plexd_version": "0.3.0",
            "state_version": 1,
            "peers": {"configured": 3, "connected": 2},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = srv
        .node_req(Method::POST, &a, "/ingest")
        .json(&json!({"batch_id": uuid::Uuid::new_v4(), "observations": [], "dropped": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);

    let after = srv.node_view(a.node_id).await;
    let at = after["last_heartbeat_at"].as_str().unwrap();
    time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).unwrap();
    assert_eq!(after["uptime_secs"], 3723, "{after}");
    assert_eq!(after["applied_state_version"], 1, "{after}");
    assert_eq!(after["peers_configured"], 3, "{after}");
    assert_eq!(after["peers_connected"], 2, "{after}");
    assert_eq!(after["plexd_version"], "0.3.0", "{after}");
    assert_eq!(after["observations_dropped"], 4, "{after}");

    // The list shows the same figures.
    let (s, list) = srv.op_get("/v1/nodes").await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let item = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == a.node_id.to_string())
        .unwrap();
    assert_eq!(item["peers_connected"], 2, "{item}");
    assert_eq!(item["last_heartbeat_at"], at, "{item}");
}
