//! Clone detection against the real server: the first host fingerprint binds a node, another
//! one (or none) with the same credential is refused with 409 `clone_refused` and recorded for
//! operators, and the original keeps working. On SQLite and Postgres.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::nodes::pull;
use common::*;
use plexsphere::store::nodes::hosts;
use plexsphere_wire::RegisterResponse;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const X: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const Y: &str = "2222222222222222222222222222222222222222222222222222222222222222";

async fn heartbeat(srv: &TestServer, reg: &RegisterResponse, host: Option<&str>) -> (u16, Value) {
    let mut req = srv
        .node_req(Method::POST, reg, "/heartbeat")
        .json(&json!({"uptime_secs": 1, "plexd_version": "0.2.0", "peers": {"configured": 0, "connected": 0}}));
    if let Some(h) = host {
        req = req.header("plexd-host", h);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn db_i64(srv: &TestServer, sql: &'static str, id: uuid::Uuid) -> Option<i64> {
    sqlx::query_scalar::<_, Option<i64>>(sql)
        .bind(id.to_string())
        .fetch_one(srv.store.pool())
        .await
        .unwrap()
}

async fn record(srv: &TestServer, id: uuid::Uuid, now: i64) -> bool {
    let mut conn = srv.store.acquire().await.unwrap();
    let every = plexsphere::node::clone::RECORD_EVERY_SECS;
    hosts::record_clone(&mut conn, id, "192.0.2.9", None, now, every)
        .await
        .unwrap()
}

async fn clones_are_refused_and_the_original_keeps_working(srv: &TestServer) {
    let (a, b) = srv.enrol_pair().await;

    // A node that never sent a fingerprint (a plexd from before host binding) works as before.
    assert_eq!(heartbeat(srv, &a, None).await.0, 200);
    // The first fingerprint binds it.
    assert_eq!(heartbeat(srv, &a, Some(X)).await.0, 200);
    assert!(srv.node_view(a.node_id).await["clone"].is_null());

    // Mark the original's last-seen time in the past, so a clone that moved it would show.
    sqlx::query("UPDATE nodes SET last_seen_at = 1 WHERE id = $1")
        .bind(a.node_id.to_string())
        .execute(srv.store.pool())
        .await
        .unwrap();

    // Another host with the same credential: refused, with what to do.
    let (s, body) = heartbeat(srv, &a, Some(Y)).await;
    assert_code(
        StatusCode::from_u16(s).unwrap(),
        &body,
        409,
        "clone_refused",
    );
    let msg = body["message"].as_str().unwrap();
    assert!(
        msg.contains("copy of its state directory") && msg.contains("plexd join"),
        "{msg}"
    );
    // The clone's request did not count as the node being seen.
    let seen = "SELECT last_seen_at FROM nodes WHERE id = $1";
    assert_eq!(db_i64(srv, seen, a.node_id).await, Some(1));
    // No fingerprint from a bound node: refused as well (an old or tampered plexd).
    let (s, body) = heartbeat(srv, &a, None).await;
    assert_code(
        StatusCode::from_u16(s).unwrap(),
        &body,
        409,
        "clone_refused",
    );
    // Every node call is covered: the state pull and the event stream too.
    let r = srv
        .node_req(Method::GET, &a, "/state")
        .header("plexd-host", Y)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let r = srv
        .node_req(Method::GET, &a, "/events")
        .header("plexd-host", Y)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    // A malformed header is a bad request, not a clone.
    let (s, body) = heartbeat(srv, &a, Some("not-hex")).await;
    assert_code(
        StatusCode::from_u16(s).unwrap(),
        &body,
        400,
        "invalid_request",
    );

    // The operator sees it; the first refusal was recorded with its fingerprint.
    let view = srv.node_view(a.node_id).await;
    let clone = &view["clone"];
    assert!(clone["requests"].as_u64().unwrap() >= 1, "{view}");
    assert_eq!(clone["last_addr"], "127.0.0.1", "{view}");
    assert!(clone["first_seen_at"].is_string(), "{view}");
    let (s, list) = srv.op_get("/v1/nodes").await;
    assert_eq!(s, StatusCode::OK);
    let items = list["items"].as_array().unwrap();
    let of = |id: uuid::Uuid| {
        items
            .iter()
            .find(|n| n["id"] == id.to_string())
            .unwrap()
            .clone()
    };
    assert!(of(a.node_id)["clone"].is_object());
    assert!(of(b.node_id)["clone"].is_null());

    // The original keeps working: heartbeat, state pull, and it is seen again.
    assert_eq!(heartbeat(srv, &a, Some(X)).await.0, 200);
    let r = srv
        .node_req(Method::GET, &a, "/state")
        .header("plexd-host", X)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(db_i64(srv, seen, a.node_id).await.unwrap() > 1);
    assert!(srv.node_view(a.node_id).await["status"] == "online");
    // Its peer still has it: nothing was revoked or removed.
    let (s, _, env) = pull(srv, &b, None).await;
    assert_eq!(s, StatusCode::OK);
    let env = serde_json::to_string(&env.unwrap()).unwrap();
    assert!(!env.is_empty());
    assert!(view["status"] != "revoked");

    // Recording is rate-limited per node: one write per RECORD_EVERY_SECS.
    let every = plexsphere::node::clone::RECORD_EVERY_SECS;
    let far = 4_000_000_000;
    assert!(record(srv, b.node_id, far).await);
    assert!(!record(srv, b.node_id, far + every - 1).await);
    assert!(record(srv, b.node_id, far + every).await);
    let c = hosts::clone_of(&mut srv.store.acquire().await.unwrap(), b.node_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (c.first_seen_at, c.last_seen_at, c.requests),
        (far, far + every, 2)
    );
    assert_eq!((c.addr.as_str(), c.fingerprint), ("192.0.2.9", None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_are_refused_on_sqlite() {
    let srv = TestServer::start().await;
    clones_are_refused_and_the_original_keeps_working(&srv).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_are_refused_on_postgres() {
    let Some(srv) = postgres::server().await else {
        return;
    };
    clones_are_refused_and_the_original_keeps_working(&srv).await;
    srv.stop().await;
}
