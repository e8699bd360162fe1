//! The access policy reaching the nodes (issue 25): a node's signed state lists only the
//! peers the Domain's policy connects to it and carries its view; peer events of a node the
//! policy does not connect never reach a stream (ring and store gap alike); a policy change
//! reaches every stream as a resync and the next state has the new version; the compile is
//! redone on a tag change and not on an endpoint change.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::nodes::pull;
use common::*;
use plexsphere::store::policies::{self, Inserted, NewVersion};
use plexsphere::store::{events, nodes};
use plexsphere_wire::RegisterResponse;
use plexsphere_wire::node::{EventKind, NodeState};
use plexsphere_wire::signed::{DomainVerifier, SignContext};
use reqwest::{Method, StatusCode};
use serde_json::json;
use uuid::Uuid;

/// web may open tcp/5432 on db; nothing else.
const WEB_TO_DB: &str =
    "tags: [web, db, ci]\nrules:\n  - {src: 'tag:web', dst: 'tag:db', proto: tcp, ports: 5432}\n";
/// Every node may open tcp/5432 on db: db is everyone's peer, no two others are peers.
const ALL_TO_DB: &str =
    "tags: [web, db, ci]\nrules:\n  - {src: '*', dst: 'tag:db', proto: tcp, ports: 5432}\n";

/// Appends the Domain-wide resync a policy or tag change appends (target none, subject nil)
/// and announces it.
async fn resync(tx: &mut sqlx::AnyConnection, domain: Uuid) -> u64 {
    let kind = EventKind::Resync {
        reason: "the Domain's access policy changed".into(),
    };
    events::append(tx, domain, None, Uuid::nil(), &kind, 0)
        .await
        .unwrap()
}

/// Stores `doc` as the Domain's next policy version (what the admin route does); answers
/// the version and the resync's seq.
async fn set_policy(srv: &TestServer, domain: Uuid, doc: &str) -> (u64, u64) {
    let mut tx = srv.store.pool().begin().await.unwrap();
    let current = policies::current(&mut tx, domain)
        .await
        .unwrap()
        .map_or(0, |r| r.version);
    let new = NewVersion {
        document: doc,
        author: "test",
        summary: "",
        now: 0,
    };
    let Inserted::Stored(row) = policies::insert(&mut tx, domain, current, new)
        .await
        .unwrap()
    else {
        panic!("a conflict")
    };
    let seq = resync(&mut tx, domain).await;
    tx.commit().await.unwrap();
    srv.state.bus.notify(domain, seq);
    (row.version, seq)
}

/// Sets a node's tags (what the tag route does): answers the resync's seq.
async fn set_tags(srv: &TestServer, node: &RegisterResponse, tags: &[&str]) -> u64 {
    let mut tx = srv.store.pool().begin().await.unwrap();
    let tags: Vec<String> = tags.iter().map(|t| t.to_string()).collect();
    assert!(nodes::set_tags(&mut tx, node.node_id, &tags).await.unwrap());
    let seq = resync(&mut tx, node.domain_id).await;
    tx.commit().await.unwrap();
    srv.state.bus.notify(node.domain_id, seq);
    seq
}

/// `reg`'s signed state, verified with its Domain key.
async fn state(srv: &TestServer, reg: &RegisterResponse) -> NodeState {
    let (status, _, env) = pull(srv, reg, None).await;
    assert_eq!(status, StatusCode::OK);
    DomainVerifier::from_b64(&reg.domain_signing_public_key)
        .unwrap()
        .open(SignContext::NodeState, &env.unwrap())
        .unwrap()
}

fn peers(s: &NodeState) -> Vec<Uuid> {
    let mut p: Vec<Uuid> = s.peers.iter().map(|p| p.node_id).collect();
    p.sort();
    p
}

fn sorted(mut ids: Vec<Uuid>) -> Vec<Uuid> {
    ids.sort();
    ids
}

/// web, db and ci, tagged so.
async fn fleet(srv: &TestServer) -> [RegisterResponse; 3] {
    let web = srv.enrol(LAB_NODES).await;
    let db = srv.enrol(LAB_NODES).await;
    let ci = srv.enrol(LAB_NODES).await;
    set_tags(srv, &web, &["web"]).await;
    set_tags(srv, &db, &["db"]).await;
    set_tags(srv, &ci, &["ci"]).await;
    [web, db, ci]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_lists_only_the_connected_peers_and_carries_the_view() {
    let srv = TestServer::start().await;
    let [web, db, ci] = fleet(&srv).await;
    // The default document (version 1, allow-all): every node is every node's peer.
    let s = state(&srv, &ci).await;
    assert_eq!(peers(&s), sorted(vec![web.node_id, db.node_id]));
    let before = s.policy.unwrap().version;
    let (version, _) = set_policy(&srv, web.domain_id, WEB_TO_DB).await;
    assert_eq!(version, before + 1);
    let (sw, sd, sc) = (
        state(&srv, &web).await,
        state(&srv, &db).await,
        state(&srv, &ci).await,
    );
    assert_eq!(peers(&sw), vec![db.node_id]);
    assert_eq!(peers(&sd), vec![web.node_id]);
    assert!(
        peers(&sc).is_empty(),
        "ci learns of no node: {:?}",
        sc.peers
    );
    for s in [&sw, &sd, &sc] {
        let p = s.policy.as_ref().unwrap();
        assert_eq!(p.version, version);
        assert_eq!(p.view.node, s.node_id);
        assert_eq!(sorted(p.view.peer_ids().collect()), peers(s));
        let filter = plexsphere_policy::NodeFilter::new(&p.view).unwrap();
        assert_eq!(sorted(filter.peer_ids().collect()), peers(s));
    }
    // db may not open anything on web; web may open tcp/5432 on db.
    let f = plexsphere_policy::NodeFilter::new(&sd.policy.unwrap().view).unwrap();
    let w = f.peer(&web.node_id).unwrap();
    assert!(f.inbound_allows(w, plexsphere_policy::Proto::Tcp, 5432));
    assert!(!f.outbound_allows(w, plexsphere_policy::Proto::Tcp, 22));
    // ci's state carries no key of another node (db's is in web's state, web's in db's).
    let text = serde_json::to_string(&sc).unwrap();
    for p in sw.peers.iter().chain(&sd.peers) {
        assert!(!text.contains(p.public_key.as_str()), "{text}");
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_added_of_a_new_node_reaches_only_the_streams_the_policy_connects() {
    let srv = TestServer::start().await;
    let [_web, db, ci] = fleet(&srv).await;
    set_policy(&srv, db.domain_id, ALL_TO_DB).await;
    let mut on_db = srv.open_events(&db, None).await;
    let mut on_ci = srv.open_events(&ci, None).await;
    srv.wait_for("both streams to open", async || {
        srv.state.streams.open_for(db.node_id) == 1 && srv.state.streams.open_for(ci.node_id) == 1
    })
    .await;
    // The Domain's compile is current (a state pull) and does not know x, the new node: db
    // must get x (x may open db), ci must not.
    let compiles = srv.state.policies.compiles();
    state(&srv, &db).await;
    assert_eq!(srv.state.policies.compiles(), compiles + 1);
    let x = srv.enrol(LAB_NODES).await;
    // x's endpoints: db hears of them, ci does not.
    let r = srv
        .node_req(Method::POST, &x, "/endpoints")
        .json(&json!({"listen_port": 51820, "addresses": ["192.0.2.77"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // A marker every node gets: it bounds the wait (keep-alives never end a stream).
    let marker = set_tags(&srv, &db, &["db"]).await;
    let ev = on_db.next_event().await.unwrap();
    assert!(
        matches!(&ev.kind, EventKind::PeerAdded { peer } if peer.node_id == x.node_id),
        "db got {ev:?}"
    );
    let added_at = ev.seq;
    let ev = on_db.next_event().await.unwrap();
    assert!(
        matches!(&ev.kind, EventKind::EndpointChanged { peer_node_id, .. } if *peer_node_id == x.node_id),
        "db got {ev:?}"
    );
    assert_eq!(on_db.next_event().await.unwrap().seq, marker);
    // ci's next event is the marker: nothing of x before it.
    let ev = on_ci.next_event().await.unwrap();
    assert_eq!(ev.seq, marker, "ci got {ev:?}");
    assert!(matches!(ev.kind, EventKind::Resync { .. }));

    // The same from the store: every stream closed (the Domain's ring ends), ci resumes from
    // before x registered and reads the gap from the store.
    drop((on_db, on_ci));
    srv.wait_for("the streams to close", async || {
        srv.state.streams.open_for(ci.node_id) == 0 && srv.state.streams.open_for(db.node_id) == 0
    })
    .await;
    let from = (added_at - 1).to_string();
    let mut resumed = srv.open_events(&ci, Some(&from)).await;
    let ev = resumed.next_event().await.unwrap();
    assert_eq!(ev.seq, marker, "ci's replay: {ev:?}");
    let mut db_again = srv.open_events(&db, Some(&from)).await;
    let ev = db_again.next_event().await.unwrap();
    assert!(
        matches!(&ev.kind, EventKind::PeerAdded { peer } if peer.node_id == x.node_id),
        "db's replay: {ev:?}"
    );
    srv.stop().await;
}

/// A node that resumes from before its own registration (`Last-Event-ID: 0`, as the HA
/// test's streams do) gets the earlier nodes' `peer_added` under allow-all: the events are
/// decided with a compile that knows the node (the stream's start), not one as of the event,
/// which cannot know a node that registered later (the first build hid them all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_resuming_from_before_its_registration_gets_the_earlier_peers() {
    let srv = TestServer::start().await;
    let a = srv.enrol(LAB_NODES).await;
    // The Domain's compile now knows a only (a state pull), then b registers.
    state(&srv, &a).await;
    let b = srv.enrol(LAB_NODES).await;
    let mut on_b = srv.open_events(&b, Some("0")).await;
    // A marker every node gets bounds the wait (keep-alives never end a stream).
    let marker = set_tags(&srv, &a, &["a"]).await;
    let ev = on_b.next_event().await.unwrap();
    assert!(
        ev.seq < marker,
        "b got the marker before a's peer_added: {ev:?}"
    );
    assert!(
        matches!(&ev.kind, EventKind::PeerAdded { peer } if peer.node_id == a.node_id),
        "b's replay from 0 starts with a's peer_added: {ev:?}"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_policy_change_the_next_state_has_the_new_version_and_peers() {
    let srv = TestServer::start().await;
    let [web, db, ci] = fleet(&srv).await;
    let (v1, _) = set_policy(&srv, web.domain_id, WEB_TO_DB).await;
    assert!(peers(&state(&srv, &ci).await).is_empty());
    let mut on_ci = srv.open_events(&ci, None).await;
    srv.wait_for("ci's stream to open", async || {
        srv.state.streams.open_for(ci.node_id) == 1
    })
    .await;
    let (v2, seq) = set_policy(&srv, web.domain_id, ALL_TO_DB).await;
    let ev = on_ci.next_event().await.unwrap();
    assert_eq!(ev.seq, seq);
    assert!(matches!(ev.kind, EventKind::Resync { .. }), "{ev:?}");
    let s = state(&srv, &ci).await;
    assert!(s.version >= seq);
    let p = s.policy.as_ref().unwrap();
    assert_eq!((p.version, v2), (v1 + 1, v1 + 1));
    assert_eq!(peers(&s), vec![db.node_id]);
    // And after it, db's endpoints reach ci (now connected), web's do not.
    for (who, addr) in [(&web, "192.0.2.5"), (&db, "192.0.2.6")] {
        let r = srv
            .node_req(Method::POST, who, "/endpoints")
            .json(&json!({"listen_port": 51820, "addresses": [addr]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    let marker = set_tags(&srv, &db, &["db"]).await;
    let ev = on_ci.next_event().await.unwrap();
    assert!(
        matches!(&ev.kind, EventKind::EndpointChanged { peer_node_id, .. } if *peer_node_id == db.node_id),
        "{ev:?}"
    );
    assert_eq!(
        on_ci.next_event().await.unwrap().seq,
        marker,
        "nothing of web"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compile_is_redone_on_a_tag_change_and_not_on_an_endpoint_change() {
    let srv = TestServer::start().await;
    let [web, db, ci] = fleet(&srv).await;
    set_policy(&srv, web.domain_id, WEB_TO_DB).await;
    state(&srv, &ci).await;
    let compiles = srv.state.policies.compiles();
    // Endpoint changes and more state pulls: the same compile.
    let r = srv
        .node_req(Method::POST, &web, "/endpoints")
        .json(&json!({"listen_port": 51820, "addresses": ["192.0.2.9"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    for n in [&web, &db, &ci] {
        state(&srv, n).await;
    }
    assert_eq!(srv.state.policies.compiles(), compiles);
    // ci becomes a web node: one compile, and ci now reaches db.
    set_tags(&srv, &ci, &["web"]).await;
    let s = state(&srv, &ci).await;
    assert_eq!(peers(&s), vec![db.node_id]);
    state(&srv, &db).await;
    assert_eq!(srv.state.policies.compiles(), compiles + 1);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_rows_never_serve_a_peer_as_it_was_before_an_event() {
    let srv = TestServer::start().await;
    let (web, db) = srv.enrol_pair().await;
    let spec = |s: &NodeState| s.peers.iter().find(|p| p.node_id == db.node_id).cloned();
    let before = spec(&state(&srv, &web).await).unwrap();
    // Pulled again at the same head: the same rows.
    assert_eq!(spec(&state(&srv, &web).await).unwrap(), before);
    // db's endpoints change: web's next state has them.
    let r = srv
        .node_req(Method::POST, &db, "/endpoints")
        .json(&json!({"listen_port": 51820, "addresses": ["192.0.2.44"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let after = spec(&state(&srv, &web).await).unwrap();
    assert_ne!(after.endpoints, before.endpoints);
    assert!(
        after
            .endpoints
            .iter()
            .any(|e| e.to_string() == "192.0.2.44:51820")
    );
    // db is revoked: web's next state no longer lists it.
    let (status, body) = srv
        .op_post(&format!("/v1/nodes/{}/revoke", db.node_id), json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(spec(&state(&srv, &web).await).is_none());
    srv.stop().await;
}
