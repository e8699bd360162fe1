//! The event stream against the real server over TLS: signed deltas, resume with
//! Last-Event-ID, resync from before the window, keep-alives, revoke/leave, a slow reader.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::time::Duration;

use common::nodes::{BOUND, Frame};
use common::*;
use plexsphere::api::EventConfig;
use plexsphere::store::events;
use plexsphere_wire::node::EventKind;
use reqwest::{Method, StatusCode};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_arrive_as_signed_deltas_and_a_resume_replays_the_missed_ones() {
    let srv = TestServer::start().await;
    let a = srv.enrol(LAB_NODES).await;
    let mut stream = srv.open_events(&a, None).await;
    srv.wait_for("the stream to open", async || {
        srv.state.streams.open_for(a.node_id) == 1
    })
    .await;

    let b = srv.enrol(LAB_NODES).await;
    let ev = stream.next_event().await.unwrap();
    let EventKind::PeerAdded { peer } = &ev.kind else {
        panic!("{ev:?}")
    };
    assert_eq!(peer.node_id, b.node_id);
    assert_eq!(peer.mesh_ip, b.mesh_ip);
    let c = srv.enrol(LAB_NODES).await;
    let ev2 = stream.next_event().await.unwrap();
    assert!(ev2.seq > ev.seq);
    assert!(matches!(&ev2.kind, EventKind::PeerAdded { peer } if peer.node_id == c.node_id));

    // An endpoint change of c reaches a (not c itself).
    let r = srv
        .node_req(Method::POST, &c, "/endpoints")
        .json(&json!({"listen_port": 51820, "addresses": ["192.0.2.3"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let ev3 = stream.next_event().await.unwrap();
    let EventKind::EndpointChanged {
        peer_node_id,
        endpoints,
        ..
    } = &ev3.kind
    else {
        panic!("{ev3:?}")
    };
    assert_eq!(*peer_node_id, c.node_id);
    assert_eq!(endpoints[0].to_string(), "192.0.2.3:51820");

    // Disconnect; two nodes join meanwhile; resume from the last seen seq.
    drop(stream);
    srv.wait_for("the stream to close", async || {
        srv.state.streams.open_for(a.node_id) == 0
    })
    .await;
    let d = srv.enrol(LAB_NODES).await;
    let e = srv.enrol(LAB_NODES).await;
    let mut resumed = srv.open_events(&a, Some(&ev3.seq.to_string())).await;
    let r1 = resumed.next_event().await.unwrap();
    let r2 = resumed.next_event().await.unwrap();
    assert!(matches!(&r1.kind, EventKind::PeerAdded { peer } if peer.node_id == d.node_id));
    assert!(matches!(&r2.kind, EventKind::PeerAdded { peer } if peer.node_id == e.node_id));
    assert!(ev3.seq < r1.seq && r1.seq < r2.seq);
    // Nothing else is pending: the next event is a live one.
    let f = srv.enrol(LAB_NODES).await;
    let r3 = resumed.next_event().await.unwrap();
    assert!(matches!(&r3.kind, EventKind::PeerAdded { peer } if peer.node_id == f.node_id));
    drop(resumed);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_from_before_the_window_or_the_future_starts_with_resync() {
    let srv = TestServer::start_with(Options {
        events: EventConfig {
            retention: Duration::ZERO,
            maintenance_every: Duration::from_millis(50),
            ..EventConfig::default()
        },
        ..Options::default()
    })
    .await;
    let a = srv.enrol(LAB_NODES).await;
    let _b = srv.enrol(LAB_NODES).await;
    let _c = srv.enrol(LAB_NODES).await;
    let domain = a.domain_id;
    let head = async || {
        let mut conn = srv.store.pool().acquire().await.unwrap();
        events::head(&mut conn, domain).await.unwrap()
    };
    srv.wait_for("the prune task to drop the old events", async || {
        head().await.pruned_through >= 3
    })
    .await;
    let now = head().await.seq;
    for last in ["1", "999", "garbage"] {
        let mut s = srv.open_events(&a, Some(last)).await;
        let ev = s.next_event().await.unwrap();
        assert!(
            matches!(ev.kind, EventKind::Resync { .. }),
            "{last}: {ev:?}"
        );
        assert_eq!(ev.seq, now, "{last}");
    }
    // From the head itself there is nothing to resync.
    let mut s = srv.open_events(&a, Some(&now.to_string())).await;
    let _d = srv.enrol(LAB_NODES).await;
    let ev = s.next_event().await.unwrap();
    assert!(
        matches!(
            ev.kind,
            EventKind::PeerAdded { .. } | EventKind::Resync { .. }
        ),
        "{ev:?}"
    );
    drop(s);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_comments_arrive_on_an_idle_stream() {
    let srv = TestServer::start_with(Options {
        events: EventConfig {
            keepalive: Duration::from_millis(200),
            ..EventConfig::default()
        },
        ..Options::default()
    })
    .await;
    let a = srv.enrol(LAB_NODES).await;
    let mut s = srv.open_events(&a, None).await;
    for _ in 0..2 {
        assert_eq!(s.next().await, Some(Frame::Comment("keep-alive".into())));
    }
    // Shutting down ends the open stream cleanly (the drain does not wait for it).
    srv.stop().await;
    loop {
        match s.next().await {
            Some(Frame::Comment(_)) => continue,
            None => break,
            Some(other) => panic!("{other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_ends_the_stream_after_node_revoked_and_peers_hear_peer_removed() {
    let srv = TestServer::start().await;
    let (a, b) = srv.enrol_pair().await;
    let mut sa = srv.open_events(&a, None).await;
    let mut sb = srv.open_events(&b, None).await;
    srv.wait_for("both streams to open", async || {
        srv.state.streams.open_for(a.node_id) == 1 && srv.state.streams.open_for(b.node_id) == 1
    })
    .await;
    let (s, view) = srv
        .op_post(&format!("/v1/nodes/{}/revoke", a.node_id), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{view}");
    let ev = sa.next_event().await.unwrap();
    assert_eq!(ev.kind, EventKind::NodeRevoked);
    assert_eq!(
        sa.next().await,
        None,
        "the stream must end after node_revoked"
    );
    let ev = sb.next_event().await.unwrap();
    assert_eq!(
        ev.kind,
        EventKind::PeerRemoved {
            peer_node_id: a.node_id,
            public_key: srv.node_view(a.node_id).await["wireguard_public_key"]
                .as_str()
                .unwrap()
                .to_owned(),
        }
    );
    // The revoked credential cannot reopen the stream.
    let r = srv
        .node_req(Method::GET, &a, "/events")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    drop(sb);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leave_tells_the_peers_and_ends_the_leavers_stream() {
    let srv = TestServer::start().await;
    let (a, b) = srv.enrol_pair().await;
    let mut sa = srv.open_events(&a, None).await;
    let mut sb = srv.open_events(&b, None).await;
    srv.wait_for("both streams to open", async || {
        srv.state.streams.open_for(a.node_id) == 1 && srv.state.streams.open_for(b.node_id) == 1
    })
    .await;
    let r = srv.node_req(Method::DELETE, &a, "").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let ev = sb.next_event().await.unwrap();
    assert!(
        matches!(ev.kind, EventKind::PeerRemoved { peer_node_id, .. } if peer_node_id == a.node_id),
        "{ev:?}"
    );
    assert_eq!(sa.next_event().await.unwrap().kind, EventKind::NodeRevoked);
    assert_eq!(sa.next().await, None);
    drop(sb);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_blocks_no_publisher_and_is_dropped() {
    let srv = TestServer::start_with(Options {
        events: EventConfig {
            slow_reader_timeout: Duration::from_millis(300),
            stream_buffer: 8,
            ..EventConfig::default()
        },
        ..Options::default()
    })
    .await;
    let (a, c) = srv.enrol_pair().await;
    // HTTP/1.1: the client connection reads only as fast as this test consumes, i.e. never.
    let h1 = client_h1(&srv.ca_pem);
    let never_read = srv.open_events_with(&h1, &a, None).await;
    srv.wait_for("the stream to open", async || {
        srv.state.streams.open_for(a.node_id) == 1
    })
    .await;

    let endpoints: Vec<std::net::SocketAddr> = (1..=8)
        .map(|i| format!("192.0.2.{i}:51820").parse().unwrap())
        .collect();
    let publish = async |n: usize| {
        let mut tx = srv.store.pool().begin().await.unwrap();
        let mut seq = 0;
        for _ in 0..n {
            let kind = EventKind::EndpointChanged {
                peer_node_id: c.node_id,
                endpoints: endpoints.clone(),
                home_relay: None,
            };
            seq = events::append(&mut tx, c.domain_id, None, c.node_id, &kind, 0)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
        srv.state.bus.notify(c.domain_id, seq);
        seq
    };
    // 1000 events are published while the reader sits there (bounded, never a speed claim).
    let first = tokio::time::timeout(BOUND, async {
        let mut last = 0;
        for _ in 0..10 {
            last = publish(100).await;
        }
        last
    })
    .await
    .expect("publishing 1000 events must not wait for a stream");
    assert!(first >= 1000);
    // Keep publishing until the buffers between the server and the socket fill and the
    // stream is dropped.
    let mut published = 1000;
    while srv.state.streams.open_for(a.node_id) > 0 {
        assert!(published < 60_000, "the slow stream was never dropped");
        publish(500).await;
        published += 500;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(srv.state.streams.slow_dropped(), 1);
    drop(never_read);
    srv.stop().await;
}
