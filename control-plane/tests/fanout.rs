//! Event fan-out against the real server over TLS (SQLite, and Postgres where the store
//! matters): many streams of one Domain each receive every event once and in order, a resume
//! older than the ring gets the gap from the store, another Domain's stream gets nothing,
//! store queries per event do not grow with the number of streams, and a node's streams are
//! capped.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::nodes::SseReader;
use common::*;
use plexsphere::api::fanout::RING_EVENTS;
use plexsphere::api::sse::MAX_STREAMS_PER_NODE;
use plexsphere::store::events;
use plexsphere_wire::RegisterResponse;
use plexsphere_wire::node::EventKind;
use reqwest::{Method, StatusCode};
use serde_json::json;

/// A second Domain beside the lab's (prefix `fo`).
const OTHER_SEED: &str = "
domains:
  - slug: fo-other
    mesh_cidr: 10.66.0.0/16
    projects:
      - slug: fo-other-nodes
        id: 019a0816-0000-7000-8000-0000000000f0
        display_name: Fan-out test nodes
";
const OTHER_NODES: &str = "019a0816-0000-7000-8000-0000000000f0";

/// Streams one HTTP/2 connection carries here (the server allows 200 at once; the test's
/// own requests need a few more).
const STREAMS_PER_CONNECTION: usize = 100;

/// Enrols `n` lab nodes, then opens one stream each (a new connection for every
/// [`STREAMS_PER_CONNECTION`]); waits until all are open.
async fn open_streams(srv: &TestServer, n: usize) -> Vec<(RegisterResponse, SseReader)> {
    let mut regs = Vec::new();
    for _ in 0..n {
        regs.push(srv.enrol(LAB_NODES).await);
    }
    let mut out = Vec::new();
    for chunk in regs.chunks(STREAMS_PER_CONNECTION) {
        let client = client_for(&srv.ca_pem);
        for reg in chunk {
            let s = srv.open_events_with(&client, reg, None).await;
            out.push((reg.clone(), s));
        }
    }
    srv.wait_for("every stream to open", async || {
        out.iter()
            .all(|(r, _)| srv.state.streams.open_for(r.node_id) == 1)
    })
    .await;
    out
}

/// One endpoint change of `node` through the node API (the normal write path): an
/// `endpoint_changed` for every other node of its Domain.
async fn change_endpoint(srv: &TestServer, node: &RegisterResponse, i: u32) {
    let addr = format!("198.51.{}.{}", i / 250, i % 250 + 1);
    let r = srv
        .node_req(Method::POST, node, "/endpoints")
        .json(&json!({"listen_port": 51820, "addresses": [addr]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

/// The seqs of the next `n` events on `s`, each an endpoint change of `of`.
async fn endpoint_seqs(s: &mut SseReader, of: uuid::Uuid, n: usize) -> Vec<u64> {
    let mut seqs = Vec::new();
    for _ in 0..n {
        let ev = s.next_event().await.unwrap();
        assert!(
            matches!(ev.kind, EventKind::EndpointChanged { peer_node_id, .. } if peer_node_id == of),
            "{ev:?}"
        );
        seqs.push(ev.seq);
    }
    seqs
}

async fn many_streams_get_every_event_once_in_order(srv: TestServer) {
    let streams = open_streams(&srv, 40).await;
    let writer = srv.enrol(LAB_NODES).await;
    // The writer's own registration reached every stream first.
    let mut streams_after = Vec::new();
    for (reg, mut s) in streams {
        let ev = s.next_event().await.unwrap();
        assert!(
            matches!(&ev.kind, EventKind::PeerAdded { peer } if peer.node_id == writer.node_id),
            "{ev:?}"
        );
        streams_after.push((reg, s, ev.seq));
    }
    const EVENTS: u32 = 30;
    for i in 0..EVENTS {
        change_endpoint(&srv, &writer, i).await;
    }
    // A marker from another node ends the run: whatever came before it came exactly once.
    let marker = srv.enrol(LAB_NODES).await;
    for (_, s, joined) in &mut streams_after {
        let seqs = endpoint_seqs(s, writer.node_id, EVENTS as usize).await;
        let want: Vec<u64> = (*joined + 1..=*joined + u64::from(EVENTS)).collect();
        assert_eq!(seqs, want, "every event once, in order, none missing");
        let next = s.next_event().await.unwrap();
        assert!(
            matches!(&next.kind, EventKind::PeerAdded { peer } if peer.node_id == marker.node_id),
            "{next:?}"
        );
    }
    assert_eq!(
        srv.state.streams.fanout_readers(),
        1,
        "one reader per Domain"
    );
    drop(streams_after);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_of_one_domain_get_every_event_once_in_order_sqlite() {
    many_streams_get_every_event_once_in_order(TestServer::start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_of_one_domain_get_every_event_once_in_order_postgres() {
    let Some(srv) = postgres::server().await else {
        return;
    };
    many_streams_get_every_event_once_in_order(srv).await;
}

/// Appends `n` endpoint changes of `of` in one transaction and announces them.
async fn publish(srv: &TestServer, of: &RegisterResponse, n: usize) -> u64 {
    let mut tx = srv.store.pool().begin().await.unwrap();
    let mut seq = 0;
    for i in 0..n {
        let kind = EventKind::EndpointChanged {
            peer_node_id: of.node_id,
            endpoints: vec![
                format!("192.0.2.{}:{}", i % 250 + 1, 1000 + i)
                    .parse()
                    .unwrap(),
            ],
            home_relay: None,
        };
        seq = events::append(&mut tx, of.domain_id, None, of.node_id, &kind, 0)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    srv.state.bus.notify(of.domain_id, seq);
    seq
}

async fn a_resume_older_than_the_ring_gets_the_gap(srv: TestServer) {
    let mut live = open_streams(&srv, 1).await;
    let (a, b) = srv.enrol_pair().await;
    let writer = srv.enrol(LAB_NODES).await;
    let mut sa = srv.open_events(&a, None).await;
    srv.wait_for("a's stream to open", async || {
        srv.state.streams.open_for(a.node_id) == 1
    })
    .await;
    let first = publish(&srv, &writer, 1).await;
    assert_eq!(sa.next_event().await.unwrap().seq, first);
    drop(sa);
    srv.wait_for("a's stream to close", async || {
        srv.state.streams.open_for(a.node_id) == 0
    })
    .await;
    // More events than the ring holds, while another stream keeps the Domain's ring going.
    let n = RING_EVENTS + 500;
    let last = publish(&srv, &writer, n).await;
    assert_eq!(last, first + n as u64);
    let (_, live_stream) = &mut live[0];
    // The live stream first hears a, b and the writer join, then the batches.
    for _ in 0..3 {
        live_stream.next_event().await.unwrap();
    }
    let live_seqs = endpoint_seqs(live_stream, writer.node_id, n + 1).await;
    assert_eq!(live_seqs.last(), Some(&last));
    // a resumes from `first`: the oldest events are no longer in the ring, so they come from
    // the store, the rest from the ring; each once, in order.
    let mut resumed = srv.open_events(&a, Some(&first.to_string())).await;
    let seqs = endpoint_seqs(&mut resumed, writer.node_id, n).await;
    let want: Vec<u64> = (first + 1..=last).collect();
    assert_eq!(seqs, want);
    // Nothing else is pending: the next event is a live one (b's endpoint change).
    change_endpoint(&srv, &b, 1).await;
    let next = resumed.next_event().await.unwrap();
    assert!(
        matches!(next.kind, EventKind::EndpointChanged { peer_node_id, .. } if peer_node_id == b.node_id),
        "{next:?}"
    );
    drop((resumed, live));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_older_than_the_ring_reads_the_gap_from_the_store_sqlite() {
    a_resume_older_than_the_ring_gets_the_gap(TestServer::start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_older_than_the_ring_reads_the_gap_from_the_store_postgres() {
    let Some(srv) = postgres::server().await else {
        return;
    };
    a_resume_older_than_the_ring_gets_the_gap(srv).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_another_domain_gets_nothing() {
    let srv = TestServer::start().await;
    let manifest = plexsphere::seed::parse(OTHER_SEED, "fo-other.yaml").unwrap();
    plexsphere::seed::apply(
        &srv.store,
        &manifest,
        "fo-other",
        time::OffsetDateTime::now_utc(),
    )
    .await
    .unwrap();
    let (o1, o2) = (srv.enrol(OTHER_NODES).await, srv.enrol(OTHER_NODES).await);
    let mut other = srv.open_events(&o1, None).await;
    let mut lab = open_streams(&srv, 2).await;
    srv.wait_for("the stream of the other Domain to open", async || {
        srv.state.streams.open_for(o1.node_id) == 1
    })
    .await;
    let (writer, _) = &lab[0];
    let writer = writer.clone();
    assert_ne!(o1.domain_id, writer.domain_id);
    for i in 0..5 {
        change_endpoint(&srv, &writer, i).await;
    }
    let (_, lab_stream) = &mut lab[1];
    // The lab stream hears its own Domain's five changes...
    let seqs = endpoint_seqs(lab_stream, writer.node_id, 5).await;
    assert_eq!(seqs.len(), 5);
    // ...the other Domain's stream hears none of them: its first event is its own Domain's.
    change_endpoint(&srv, &o2, 1).await;
    let ev = other.next_event().await.unwrap();
    assert!(
        matches!(ev.kind, EventKind::EndpointChanged { peer_node_id, .. } if peer_node_id == o2.node_id),
        "{ev:?}"
    );
    assert_eq!(
        srv.state.streams.fanout_readers(),
        2,
        "one reader per Domain"
    );
    drop((other, lab));
    srv.stop().await;
}

/// Waits until the Domain's reader has started and is idle: the query count has moved from 0
/// and stays put across a few looks. A reader that has just started does one query for the
/// log's head, and a commit it was told of while reading wakes it once more; either landing
/// inside a measurement counts against the events measured (a fresh-clone CI run counted 16
/// queries for 15 so).
async fn reader_settled(srv: &TestServer) {
    let mut last = u64::MAX;
    let mut same = 0;
    srv.wait_for("the fan-out reader to start and go idle", async || {
        let now = srv.state.streams.fanout_store_queries();
        same = if now == last { same + 1 } else { 0 };
        last = now;
        now > 0 && same >= 5
    })
    .await;
}

/// Store queries the fan-out made for `events` endpoint changes, one commit (and one wake-up)
/// at a time, each waited for on every stream.
async fn queries_for(
    srv: &TestServer,
    writer: &RegisterResponse,
    streams: &mut [(RegisterResponse, SseReader)],
    events: u32,
    from: u32,
) -> u64 {
    let before = srv.state.streams.fanout_store_queries();
    for i in from..from + events {
        change_endpoint(srv, writer, i).await;
        for (_, s) in streams.iter_mut() {
            endpoint_seqs(s, writer.node_id, 1).await;
        }
    }
    srv.state.streams.fanout_store_queries() - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_queries_per_event_do_not_grow_with_the_stream_count() {
    let srv = TestServer::start().await;
    let writer = srv.enrol(LAB_NODES).await;
    const EVENTS: u32 = 5;
    let mut one = open_streams(&srv, 1).await;
    reader_settled(&srv).await;
    let with_one = queries_for(&srv, &writer, &mut one, EVENTS, 0).await;
    let mut many = open_streams(&srv, 199).await;
    // The 199 registrations reached the first stream; take them off.
    for _ in 0..199 {
        one[0].1.next_event().await.unwrap();
    }
    many.extend(one);
    reader_settled(&srv).await;
    let with_200 = queries_for(&srv, &writer, &mut many, EVENTS, EVENTS).await;
    // One head, one read of the rows, one head again per wake-up: 3 per event either way
    // (each stream reading for itself would make it 3 per event per stream).
    assert_eq!(with_one, 3 * u64::from(EVENTS), "one stream");
    assert_eq!(with_200, with_one, "200 streams cost what one costs");
    drop(many);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_over_its_stream_cap_gets_429_with_retry_after() {
    let srv = TestServer::start().await;
    let (a, b) = srv.enrol_pair().await;
    let mut open = Vec::new();
    for _ in 0..MAX_STREAMS_PER_NODE {
        open.push(srv.open_events(&a, None).await);
    }
    srv.wait_for("the streams to open", async || {
        srv.state.streams.open_for(a.node_id) == MAX_STREAMS_PER_NODE
    })
    .await;
    let r = srv
        .node_req(Method::GET, &a, "/events")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "5");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_code(StatusCode::TOO_MANY_REQUESTS, &body, 429, "rate_limited");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("event streams open"),
        "{body}"
    );
    // Another node is not affected, and the open streams still carry events.
    let sb = srv.open_events(&b, None).await;
    change_endpoint(&srv, &b, 1).await;
    for s in &mut open {
        endpoint_seqs(s, b.node_id, 1).await;
    }
    // Once one stream closes, the node may open one again.
    drop(open.pop());
    srv.wait_for("one stream to close", async || {
        srv.state.streams.open_for(a.node_id) == MAX_STREAMS_PER_NODE - 1
    })
    .await;
    let mut again = srv.open_events(&a, None).await;
    change_endpoint(&srv, &b, 2).await;
    endpoint_seqs(&mut again, b.node_id, 1).await;
    drop((sb, open, again));
    srv.stop().await;
}
