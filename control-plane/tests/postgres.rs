//! The node API and the event log on Postgres (the multi-replica store): the same portable
//! SQL as SQLite. Needs a server: `PLEXSPHERE_TEST_POSTGRES_URL=postgres://user@host/db`
//! (a role that may create databases); each run creates and uses a fresh database.
//! `scripts/test` starts a throwaway cluster and sets it; without it the test says so and
//! passes nothing off as tested, and under `CI` it fails.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::*;
use plexsphere_wire::node::EventKind;
use reqwest::{Method, StatusCode};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_api_and_the_event_log_work_on_postgres() {
    let Some(srv) = postgres::server().await else {
        return;
    };
    let a = srv.enrol(LAB_NODES).await;
    let mut stream = srv.open_events(&a, None).await;
    srv.wait_for("the stream to open", async || {
        srv.state.streams.open_for(a.node_id) == 1
    })
    .await;
    let b = srv.enrol(LAB_NODES).await;
    let ev = stream.next_event().await.unwrap();
    assert!(matches!(&ev.kind, EventKind::PeerAdded { peer } if peer.node_id == b.node_id));
    let (s, ack) = srv.heartbeat(&b).await;
    assert_eq!(s, StatusCode::OK, "{ack}");
    assert_eq!(ack["state_version"], ev.seq);
    assert_eq!(srv.node_view(b.node_id).await["status"], "online");
    let r = srv
        .node_req(Method::POST, &b, "/endpoints")
        .json(&json!({"listen_port": 51820, "addresses": ["192.0.2.9"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let ev2 = stream.next_event().await.unwrap();
    assert!(
        matches!(&ev2.kind, EventKind::EndpointChanged { peer_node_id, .. } if *peer_node_id == b.node_id)
    );
    assert_eq!(ev2.seq, ev.seq + 1);
    let r = srv
        .node_req(Method::GET, &a, "/state")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["etag"], format!("\"{}\"", ev2.seq).as_str());
    let (s, _) = srv
        .op_post(&format!("/v1/nodes/{}/revoke", a.node_id), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        stream.next_event().await.unwrap().kind,
        EventKind::NodeRevoked
    );
    assert_eq!(stream.next().await, None);
    let r = srv.node_req(Method::DELETE, &b, "").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // Pruning everything up to now works on Postgres too.
    let deleted = {
        let mut tx = srv.store.pool().begin().await.unwrap();
        let n = plexsphere::store::events::prune(&mut tx, i64::MAX)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        n
    };
    assert!(deleted >= 5, "{deleted}");
    srv.stop().await;
}
