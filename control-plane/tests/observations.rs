//! Ingest observations are stored, bounded and shown to the operator
//! (`GET /v1/nodes/{id}/observations`), on a real SQLite file and on Postgres
//! (`PLEXSPHERE_TEST_POSTGRES_URL`, as `tests/postgres.rs` uses it; `scripts/test` sets it).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::*;
use plexsphere_wire::RegisterResponse;
use plexsphere_wire::admin::ObservationList;
use plexsphere_wire::node::ObservationKind;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Sends `body` as an ingest batch; a body without a `batch_id` is a new batch and gets one.
async fn ingest(srv: &TestServer, node: &RegisterResponse, mut body: Value) {
    if body.get("batch_id").is_none() {
        body["batch_id"] = json!(uuid::Uuid::new_v4());
    }
    let r = srv
        .node_req(Method::POST, node, "/ingest")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
}

async fn observations(srv: &TestServer, node: uuid::Uuid, query: &str) -> ObservationList {
    let (status, body) = srv
        .op_get(&format!("/v1/nodes/{node}/observations{query}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    serde_json::from_value(body).unwrap()
}

async fn stored_rows(srv: &TestServer, node: uuid::Uuid) -> i64 {
    let row = sqlx::query("SELECT COUNT(*) AS n FROM observations WHERE node_id = $1")
        .bind(node.to_string())
        .fetch_one(srv.store.pool())
        .await
        .unwrap();
    sqlx::Row::get(&row, "n")
}

fn traffic(at: i64, peer: uuid::Uuid, rx: u64) -> Value {
    json!({"at": at, "type": "traffic", "peer_node_id": peer, "rx_bytes": rx, "tx_bytes": 1})
}

/// The whole behaviour, against whichever database `srv` runs on.
async fn scenario(srv: &TestServer) {
    let (a, b) = srv.enrol_pair().await;

    // A batch is stored as sent, listed newest first, with the dropped count summed.
    let batch = json!({"dropped": 3, "observations": [
        {"at": 100, "type": "handshake", "peer_node_id": b.node_id, "endpoint": "192.0.2.7:51820"},
        traffic(101, b.node_id, 4096),
        {"at": 102, "type": "error", "message": "bad\u{1b}[31m peer\nline"},
    ]});
    ingest(srv, &a, batch).await;
    ingest(srv, &a, json!({"dropped": 2, "observations": []})).await;
    let list = observations(srv, a.node_id, "").await;
    assert_eq!((list.node_id, list.dropped), (a.node_id, 5));
    let ats: Vec<i64> = list.items.iter().map(|o| o.at).collect();
    assert_eq!(ats, [102, 101, 100]);
    assert_eq!(
        list.items[0].kind,
        ObservationKind::Error {
            message: "bad\u{1b}[31m peer\nline".into()
        }
    );
    assert_eq!(
        list.items[2].kind,
        ObservationKind::Handshake {
            peer_node_id: b.node_id,
            endpoint: Some("192.0.2.7:51820".parse().unwrap())
        }
    );
    assert!(
        list.items
            .iter()
            .all(|o| o.received_at.unix_timestamp() > 0)
    );

    // The kind filter and the limit.
    let only = observations(srv, a.node_id, "?kind=traffic").await;
    assert_eq!(only.items.len(), 1);
    assert!(matches!(
        only.items[0].kind,
        ObservationKind::Traffic { rx_bytes: 4096, peer_node_id, .. } if peer_node_id == b.node_id
    ));
    assert_eq!(
        observations(srv, a.node_id, "?limit=2").await.items.len(),
        2
    );
    assert!(observations(srv, b.node_id, "").await.items.is_empty());

    // A batch sent again because its answer was lost is stored once, also when the copies
    // arrive together; the node's next batch is stored as usual.
    let retried = json!({"batch_id": uuid::Uuid::new_v4(), "dropped": 1,
        "observations": [traffic(700, b.node_id, 7)]});
    ingest(srv, &a, retried.clone()).await;
    tokio::join!(
        ingest(srv, &a, retried.clone()),
        ingest(srv, &a, retried.clone()),
        ingest(srv, &a, retried.clone()),
    );
    ingest(
        srv,
        &a,
        json!({"observations": [traffic(701, b.node_id, 8)]}),
    )
    .await;
    let list = observations(srv, a.node_id, "").await;
    let ats: Vec<i64> = list.items.iter().map(|o| o.at).collect();
    assert_eq!(ats, [701, 700, 102, 101, 100]);
    assert_eq!(
        list.dropped, 6,
        "the retried batch's dropped count is summed once"
    );

    // The bound: at most 500 per node, the newest kept; another node's rows are untouched.
    ingest(srv, &b, json!({"observations": [traffic(1, a.node_id, 1)]})).await;
    for round in 0..2i64 {
        let obs: Vec<Value> = (0..300)
            .map(|i| traffic(1000 + round * 300 + i, b.node_id, 1))
            .collect();
        ingest(srv, &a, json!({ "observations": obs })).await;
    }
    assert_eq!(stored_rows(srv, a.node_id).await, 500);
    let all = observations(srv, a.node_id, "?limit=500").await;
    assert_eq!(all.items.len(), 500);
    assert_eq!(all.items[0].at, 1599);
    assert_eq!(all.items[499].at, 1100);
    assert!(all.items.windows(2).all(|w| w[0].at == w[1].at + 1));
    assert_eq!(
        observations(srv, a.node_id, "?kind=error")
            .await
            .items
            .len(),
        0
    );
    assert_eq!(stored_rows(srv, b.node_id).await, 1);

    // A batch larger than the bound keeps its newest 500.
    let obs: Vec<Value> = (0..600).map(|i| traffic(5000 + i, a.node_id, 1)).collect();
    ingest(srv, &b, json!({ "observations": obs })).await;
    let all = observations(srv, b.node_id, "?limit=500").await;
    assert_eq!((all.items[0].at, all.items[499].at), (5599, 5100));
    assert_eq!(stored_rows(srv, b.node_id).await, 500);

    // Refusals: unknown node, bad limit, bad kind, no or a non-operator token.
    let unknown = "019a0816-0000-7000-8000-0000000000ff";
    let (s, body) = srv
        .op_get(&format!("/v1/nodes/{unknown}/observations"))
        .await;
    assert_code(s, &body, 404, "not_found");
    assert!(
        body["message"].as_str().unwrap().contains(unknown),
        "{body}"
    );
    for q in ["?limit=0", "?limit=501", "?limit=x"] {
        let (s, body) = srv
            .op_get(&format!("/v1/nodes/{}/observations{q}", a.node_id))
            .await;
        assert_code(s, &body, 400, "invalid_request");
        assert!(
            body["message"].as_str().unwrap().contains("limit"),
            "{body}"
        );
    }
    let (s, body) = srv
        .op_get(&format!("/v1/nodes/{}/observations?kind=peer", a.node_id))
        .await;
    assert_code(s, &body, 400, "invalid_request");
    assert!(body["message"].as_str().unwrap().contains("kind"), "{body}");
    let path = format!("/v1/nodes/{}/observations", a.node_id);
    let r = srv.client.get(srv.url(&path)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let body: Value = r.json().await.unwrap();
    assert_code(StatusCode::UNAUTHORIZED, &body, 401, "unauthorized");
    let r = srv
        .node_req(Method::GET, &a, "/observations")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    // Deleting a node (plexd leave) deletes its observations.
    let r = srv.node_req(Method::DELETE, &b, "").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(stored_rows(srv, b.node_id).await, 0);
    let (s, body) = srv
        .op_get(&format!("/v1/nodes/{}/observations", b.node_id))
        .await;
    assert_code(s, &body, 404, "not_found");
    assert_eq!(stored_rows(srv, a.node_id).await, 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observations_are_stored_bounded_and_listed_on_sqlite() {
    let srv = TestServer::start().await;
    scenario(&srv).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observations_are_stored_bounded_and_listed_on_postgres() {
    let Some(srv) = postgres::server().await else {
        return;
    };
    scenario(&srv).await;
    srv.stop().await;
}
