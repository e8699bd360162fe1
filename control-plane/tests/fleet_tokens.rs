//! Reusable and ephemeral bootstrap tokens against the real server, on SQLite and Postgres:
//! the use limit holds under a race, replays take no use, revocation stops further uses, and an
//! ephemeral node offline past its allowance is removed (its peers drop it) while others stay.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::nodes::pull;
use common::*;
use plexsphere::api::EventConfig;
use plexsphere_wire::RegisterResponse;
use plexsphere_wire::admin::{IssuedToken, TokenStatus};
use plexsphere_wire::node::NodeState;
use plexsphere_wire::signed::{DomainVerifier, SignContext};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::Row as _;

async fn issue(srv: &TestServer, extra: Value) -> (StatusCode, Value) {
    let mut body = json!({"kind": "node", "env_prefix": "asg", "ttl_secs": 3600});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    srv.op_post(&format!("/v1/projects/{LAB_NODES}/bootstrap-tokens"), body)
        .await
}

async fn issue_ok(srv: &TestServer, extra: Value) -> IssuedToken {
    let (status, body) = issue(srv, extra).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    serde_json::from_value(body).unwrap()
}

async fn node_count(srv: &TestServer) -> i64 {
    sqlx::query("SELECT COUNT(*) AS n FROM nodes")
        .fetch_one(srv.store.pool())
        .await
        .unwrap()
        .try_get("n")
        .unwrap()
}

/// `uses` racing registrations plus `extra` more, each with its own key, on one token that
/// allows `uses`: exactly `uses` nodes are made, the rest are told the token is used up, and
/// the token lists them all; a replay by a winner's key answers its node and takes no use.
async fn racing_registrations_never_exceed_the_limit(srv: TestServer) {
    const USES: u32 = 5;
    const EXTRA: u32 = 15;
    let srv = Arc::new(srv);
    let issued = issue_ok(&srv, json!({"max_uses": USES})).await;
    assert_eq!(issued.max_uses, USES);
    let mut tasks = Vec::new();
    for i in 0..USES + EXTRA {
        let srv = srv.clone();
        let token = issued.token.clone();
        tasks.push(tokio::spawn(async move {
            let key = wg_key(2_000 + i);
            let (s, b) = srv.register(&register_body(&token, &key)).await;
            (key, s, b)
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let (key, status, body) = t.await.unwrap();
        if status == StatusCode::CREATED {
            winners.push((key, body["node_id"].as_str().unwrap().to_owned()));
        } else {
            assert_code(status, &body, 403, "token_consumed");
        }
    }
    assert_eq!(
        winners.len(),
        USES as usize,
        "exactly the use limit succeeded"
    );
    assert_eq!(node_count(&srv).await, i64::from(USES));

    let listed = srv.tokens(LAB_NODES).await;
    let t = listed.iter().find(|t| t.id == issued.id).unwrap();
    assert_eq!((t.uses, t.max_uses), (USES, USES));
    assert_eq!(t.status, TokenStatus::Consumed);
    let made: HashSet<String> = t.nodes.iter().map(ToString::to_string).collect();
    let won: HashSet<String> = winners.iter().map(|(_, id)| id.clone()).collect();
    assert_eq!(made, won, "the token lists the nodes it made");

    // A winner's key replays (its node never authenticated): the same node, 200, no use.
    let (key, node_id) = &winners[0];
    let (s, b) = srv.register(&register_body(&issued.token, key)).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["node_id"], node_id.as_str());
    assert_eq!(node_count(&srv).await, i64::from(USES));
    let again = srv.tokens(LAB_NODES).await;
    assert_eq!(again.iter().find(|t| t.id == issued.id).unwrap().uses, USES);
    Arc::into_inner(srv).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reusable_token_makes_at_most_its_limit_on_sqlite() {
    racing_registrations_never_exceed_the_limit(TestServer::start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reusable_token_makes_at_most_its_limit_on_postgres() {
    let Some(srv) = postgres::server().await else {
        return;
    };
    racing_registrations_never_exceed_the_limit(srv).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_take_no_use_and_revocation_stops_further_uses() {
    let srv = TestServer::start().await;
    let issued = issue_ok(&srv, json!({"max_uses": 3})).await;
    let (s, first) = srv
        .register(&register_body(&issued.token, &wg_key(1)))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    // The same key twice more: replays, so two uses are still left.
    for _ in 0..2 {
        let (s, b) = srv
            .register(&register_body(&issued.token, &wg_key(1)))
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        assert_eq!(b["node_id"], first["node_id"]);
    }
    let (s, b) = srv
        .register(&register_body(&issued.token, &wg_key(2)))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let t = srv
        .tokens(LAB_NODES)
        .await
        .into_iter()
        .find(|t| t.id == issued.id)
        .unwrap();
    assert_eq!((t.uses, t.max_uses, t.status), (2, 3, TokenStatus::Active));
    // Revoked with a use left: no more nodes; the two it made stay.
    let (s, b) = srv
        .op_post(
            &format!("/v1/bootstrap-tokens/{}/revoke", issued.id),
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["status"], "revoked");
    let (s, b) = srv
        .register(&register_body(&issued.token, &wg_key(3)))
        .await;
    assert_code(s, &b, 403, "token_revoked");
    assert_eq!(node_count(&srv).await, 2);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_use_limit_and_the_ephemeral_time_are_bounded() {
    let srv = TestServer::start().await;
    for bad in [
        json!({"max_uses": 0}),
        json!({"max_uses": 1001}),
        json!({"ephemeral_offline_secs": 119}),
        json!({"ephemeral_offline_secs": 7 * 86_400 + 1}),
    ] {
        let (s, b) = issue(&srv, bad.clone()).await;
        assert_code(s, &b, 422, "invalid_request");
        assert!(
            b["message"].as_str().unwrap().contains("between"),
            "{bad}: {b}"
        );
    }
    // The defaults: single use, not ephemeral (what older clients get).
    let plain = issue_ok(&srv, json!({})).await;
    assert_eq!((plain.max_uses, plain.ephemeral_offline_secs), (1, None));
    let (s, _) = srv.register(&register_body(&plain.token, &wg_key(1))).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, b) = srv.register(&register_body(&plain.token, &wg_key(2))).await;
    assert_code(s, &b, 403, "token_consumed");
    srv.stop().await;
}

fn peer_ids(reg: &RegisterResponse, env: plexsphere_wire::signed::SignedEnvelope) -> Vec<String> {
    let verifier = DomainVerifier::from_b64(&reg.domain_signing_public_key).unwrap();
    let state: NodeState = verifier.open(SignContext::NodeState, &env).unwrap();
    state.peers.iter().map(|p| p.node_id.to_string()).collect()
}

/// Pretends `node` was last seen `ago` seconds ago (it stopped heartbeating then).
async fn last_seen_ago(srv: &TestServer, node: &RegisterResponse, ago: i64) {
    let at = time::OffsetDateTime::now_utc().unix_timestamp() - ago;
    sqlx::query("UPDATE nodes SET last_seen_at = $1 WHERE id = $2")
        .bind(at)
        .bind(node.node_id.to_string())
        .execute(srv.store.pool())
        .await
        .unwrap();
}

async fn an_ephemeral_node_offline_too_long_is_removed(srv: TestServer) {
    let eph = issue_ok(&srv, json!({"max_uses": 2, "ephemeral_offline_secs": 120})).await;
    assert_eq!(eph.ephemeral_offline_secs, Some(120));
    let (s, b) = srv.register(&register_body(&eph.token, &wg_key(1))).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let gone: RegisterResponse = serde_json::from_value(b).unwrap();
    let (s, b) = srv.register(&register_body(&eph.token, &wg_key(2))).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let eph_online: RegisterResponse = serde_json::from_value(b).unwrap();
    let steady = srv.enrol(LAB_NODES).await;
    let watcher = srv.enrol(LAB_NODES).await;
    for n in [&gone, &eph_online, &steady, &watcher] {
        assert_eq!(srv.heartbeat(n).await.0, StatusCode::OK);
    }
    assert_eq!(
        srv.node_view(gone.node_id).await["ephemeral_offline_secs"],
        120
    );
    assert!(
        srv.node_view(steady.node_id)
            .await
            .get("ephemeral_offline_secs")
            .is_none()
    );
    let (_, _, env) = pull(&srv, &watcher, None).await;
    assert_eq!(peer_ids(&watcher, env.unwrap()).len(), 3);
    let mut events = srv.open_events(&watcher, None).await;

    // The ephemeral node and the steady one both stopped 200 s ago; the other ephemeral one
    // 60 s ago (within its 120 s).
    last_seen_ago(&srv, &gone, 200).await;
    last_seen_ago(&srv, &steady, 200).await;
    last_seen_ago(&srv, &eph_online, 60).await;
    srv.wait_for("the ephemeral node's removal", async || {
        srv.op_get(&format!("/v1/nodes/{}", gone.node_id)).await.0 == StatusCode::NOT_FOUND
    })
    .await;
    // Its peers hear of it on their stream and no longer list it in their state.
    loop {
        let ev = tokio::time::timeout(common::nodes::BOUND, events.next_event())
            .await
            .unwrap()
            .unwrap();
        if let plexsphere_wire::node::EventKind::PeerRemoved { peer_node_id, .. } = ev.kind {
            assert_eq!(peer_node_id, gone.node_id);
            break;
        }
    }
    let (_, _, env) = pull(&srv, &watcher, None).await;
    let peers = peer_ids(&watcher, env.unwrap());
    assert!(!peers.contains(&gone.node_id.to_string()), "{peers:?}");
    assert!(peers.contains(&steady.node_id.to_string()), "{peers:?}");
    assert!(peers.contains(&eph_online.node_id.to_string()), "{peers:?}");
    // Its credential no longer works.
    assert_eq!(srv.heartbeat(&gone).await.0, StatusCode::UNAUTHORIZED);
    // Its token still lists only the node that exists.
    let t = srv
        .tokens(LAB_NODES)
        .await
        .into_iter()
        .find(|t| t.id == eph.id)
        .unwrap();
    assert_eq!(t.nodes, vec![eph_online.node_id]);
    // Its mesh IP is free: the next node may get it.
    let free: i64 = sqlx::query("SELECT COUNT(*) AS n FROM nodes WHERE mesh_ip = $1")
        .bind(gone.mesh_ip.to_string())
        .fetch_one(srv.store.pool())
        .await
        .unwrap()
        .try_get("n")
        .unwrap();
    assert_eq!(free, 0);
    srv.stop().await;
}

fn fast_maintenance() -> Options {
    Options {
        events: EventConfig {
            maintenance_every: Duration::from_millis(50),
            ..EventConfig::default()
        },
        ..Options::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_node_offline_too_long_is_removed_on_sqlite() {
    an_ephemeral_node_offline_too_long_is_removed(TestServer::start_with(fast_maintenance()).await)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_node_offline_too_long_is_removed_on_postgres() {
    let Some(srv) = postgres::server_with(fast_maintenance()).await else {
        return;
    };
    an_ephemeral_node_offline_too_long_is_removed(srv).await;
}

/// A database at schema version 10 with a consumed and an unused token and the consumed one's
/// node, brought to version 11: the consumed token has used its one use, the unused one none,
/// and the node knows its token (so the replay rule still finds it).
async fn upgrading_keeps_single_use_tokens_as_they_were(url: String) {
    use plexsphere::store::{Store, nodes, tokens};
    let store = Store::connect(&url).await.unwrap();
    plexsphere::store::migrator()
        .run_to(10, store.pool())
        .await
        .unwrap();
    common::store::apply_lab_seed(&store).await;
    let domain: String = sqlx::query("SELECT domain_id FROM projects WHERE id = $1")
        .bind(LAB_NODES)
        .fetch_one(store.pool())
        .await
        .unwrap()
        .try_get("domain_id")
        .unwrap();
    let node = "019a0816-0000-7000-8000-0000000000aa";
    for (id, consumed_at, by) in [
        ("00000000000000aa", Some(150_i64), Some(node)),
        ("00000000000000bb", None, None),
    ] {
        sqlx::query(
            "INSERT INTO bootstrap_tokens (id, project_id, kind, env_prefix, secret_sha256, created_at, expires_at, consumed_at, consumed_by_node) \
             VALUES ($1, $2, 'node', 'lab', 'x', 100, 4000000000, $3, $4)",
        )
        .bind(id)
        .bind(LAB_NODES)
        .bind(consumed_at)
        .bind(by)
        .execute(store.pool())
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO nodes (id, domain_id, project_id, hostname, arch, plexd_version, mesh_ip, wireguard_public_key, credential_sha256, registered_at) \
         VALUES ($1, $2, $3, 'old', 'amd64', '0.1.0', '10.64.0.9', 'k', 'x', 150)",
    )
    .bind(node)
    .bind(&domain)
    .bind(LAB_NODES)
    .execute(store.pool())
    .await
    .unwrap();

    store.migrate().await.unwrap();
    let mut conn = store.acquire().await.unwrap();
    let used = tokens::get(&mut conn, "00000000000000aa")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((used.uses, used.usage.max_uses), (1, 1));
    assert!(used.used_up());
    let fresh = tokens::get(&mut conn, "00000000000000bb")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((fresh.uses, fresh.usage.max_uses), (0, 1));
    assert_eq!(fresh.usage.ephemeral_offline_secs, None);
    let n = nodes::get(&mut conn, node.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        n.origin.bootstrap_token_id.as_deref(),
        Some("00000000000000aa")
    );
    assert_eq!(n.origin.ephemeral_offline_secs, None);
    let found = nodes::made_by_token_with_key(&mut conn, "00000000000000aa", "k")
        .await
        .unwrap();
    assert_eq!(found.map(|f| f.id.to_string()).as_deref(), Some(node));
    drop(conn);
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrading_to_version_11_keeps_single_use_tokens_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    upgrading_keeps_single_use_tokens_as_they_were(plexsphere::store::Store::sqlite_url(
        dir.path(),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrading_to_version_11_keeps_single_use_tokens_on_postgres() {
    let Some(url) = postgres::scratch_database().await else {
        return;
    };
    upgrading_keeps_single_use_tokens_as_they_were(url).await;
}
