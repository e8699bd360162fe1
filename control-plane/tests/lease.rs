//! One broker leader at a time (`plexsphere::leader`, docs/operations.md "Several replicas:
//! the broker lease"): the lease row on SQLite and Postgres with time stepped by hand, the
//! fence on a resource's phase write, and real `plexsphere serve` replicas on one Postgres —
//! the leader killed with SIGKILL while a resource waits, and a paused leader whose resource
//! another replica finishes while the paused one stands down.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::time::{Duration, Instant};

use common::broker::{bucket_request, history, phase};
use common::replica::Replica;
use common::{LAB_NODES, TestServer};
use plexsphere::store::{Store, lease, resources};
use plexsphere_test_support::metrics;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The lease the replicas of these tests take (`--leader-lease-secs`): short, so a takeover
/// happens within seconds.
const LEASE_SECS: u64 = 6;
/// How long a test waits for a takeover: the lease, a third of it for the next try, and room
/// for a loaded CI machine.
const TAKEOVER_BOUND: Duration = Duration::from_secs(LEASE_SECS + 1 + 15);

/// The lease's rules, on one database: taken when free, renewed by its holder, refused to
/// another until it expired, then taken over with the next term; given up on release.
async fn lease_rules(store: &Store) {
    let mut conn = store.acquire().await.unwrap();
    let t0: i64 = 1_000_000;
    let ttl: i64 = 3_000;
    assert!(
        lease::get(&mut conn, lease::BROKER)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        lease::acquire(&mut conn, lease::BROKER, "a", t0, ttl)
            .await
            .unwrap()
    );
    assert!(
        !lease::acquire(&mut conn, lease::BROKER, "b", t0 + 1, ttl)
            .await
            .unwrap()
    );
    // The holder renews before expiry; the expiry moves.
    assert!(
        lease::acquire(&mut conn, lease::BROKER, "a", t0 + 2_000, ttl)
            .await
            .unwrap()
    );
    assert!(
        !lease::acquire(&mut conn, lease::BROKER, "b", t0 + 4_999, ttl)
            .await
            .unwrap()
    );
    let held = lease::get(&mut conn, lease::BROKER).await.unwrap().unwrap();
    assert_eq!(
        held,
        lease::LeaseRow {
            holder: "a".into(),
            term: 1,
            expires_at_ms: t0 + 5_000
        }
    );
    // Expired: b takes it over, in the next term; a cannot renew any more.
    assert!(
        lease::acquire(&mut conn, lease::BROKER, "b", t0 + 5_000, ttl)
            .await
            .unwrap()
    );
    assert!(
        !lease::acquire(&mut conn, lease::BROKER, "a", t0 + 5_001, ttl)
            .await
            .unwrap()
    );
    let held = lease::get(&mut conn, lease::BROKER).await.unwrap().unwrap();
    assert_eq!((held.holder.as_str(), held.term), ("b", 2));
    // Only the holder can give it up; then anyone takes it at once.
    assert!(!lease::release(&mut conn, lease::BROKER, "a").await.unwrap());
    assert!(lease::release(&mut conn, lease::BROKER, "b").await.unwrap());
    assert!(
        lease::acquire(&mut conn, lease::BROKER, "a", t0 + 5_002, ttl)
            .await
            .unwrap()
    );
    assert_eq!(
        lease::get(&mut conn, lease::BROKER)
            .await
            .unwrap()
            .unwrap()
            .term,
        3
    );
}

#[tokio::test]
async fn the_lease_is_taken_renewed_expired_and_taken_over_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::connect(&Store::sqlite_url(dir.path()))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    lease_rules(&store).await;
}

#[tokio::test]
async fn the_lease_is_taken_renewed_expired_and_taken_over_on_postgres() {
    let Some(url) = common::postgres::scratch_database().await else {
        return;
    };
    let store = Store::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    lease_rules(&store).await;
    // Two replicas racing for a free lease: exactly one wins.
    let mut winners = 0;
    for round in 0..20i64 {
        let name = format!("race-{round}");
        let (a, b) = tokio::join!(
            async {
                let mut c = store.acquire().await.unwrap();
                lease::acquire(&mut c, &name, "a", 0, 1_000).await.unwrap()
            },
            async {
                let mut c = store.acquire().await.unwrap();
                lease::acquire(&mut c, &name, "b", 0, 1_000).await.unwrap()
            }
        );
        assert!(a != b, "round {round}: a {a}, b {b}");
        winners += 1;
    }
    assert_eq!(winners, 20);
}

/// The fence: a resource's phase write by the broker lands only while its writer holds the
/// lease, on either database.
async fn fenced_writes(srv: &TestServer) {
    let cred = common::broker::credential(srv, "local").await;
    let (status, created) = srv
        .op_post(
            &format!("/v1/projects/{LAB_NODES}/resources"),
            bucket_request(&cred, json!({"region": "us-east-1"})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let id: uuid::Uuid = created["id"].as_str().unwrap().parse().unwrap();
    let id_text = id.to_string();
    common::broker::wait_for(srv, &id_text, "Ready", |r| phase(r) == "Ready").await;
    let mut conn = srv.store.acquire().await.unwrap();
    let now = plexsphere::leader::wall_ms();
    let mut row = resources::get(&mut conn, id).await.unwrap().unwrap();
    let at = plexsphere::store::unix(time::OffsetDateTime::now_utc());
    // Nobody holds the lease: a leader's write is refused, the row is unchanged.
    assert!(
        !resources::update_as(&mut conn, &mut row, at, Some(("old", now)))
            .await
            .unwrap()
    );
    assert!(
        lease::acquire(&mut conn, lease::BROKER, "old", now, 60_000)
            .await
            .unwrap()
    );
    assert!(
        resources::update_as(&mut conn, &mut row, at, Some(("old", now)))
            .await
            .unwrap()
    );
    // Its lease expired and "new" took it: the old holder's write is refused from then on,
    // even when it has not noticed yet (a paused process).
    let later = now + 61_000;
    assert!(
        lease::acquire(&mut conn, lease::BROKER, "new", later, 60_000)
            .await
            .unwrap()
    );
    let version = row.version;
    assert!(
        !resources::update_as(&mut conn, &mut row, at, Some(("old", later)))
            .await
            .unwrap()
    );
    assert_eq!(row.version, version);
    assert!(
        resources::update_as(&mut conn, &mut row, at, Some(("new", later)))
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_phase_write_lands_only_while_its_writer_holds_the_lease_on_sqlite() {
    let srv = TestServer::start().await;
    fenced_writes(&srv).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_phase_write_lands_only_while_its_writer_holds_the_lease_on_postgres() {
    let Some(srv) = common::postgres::server().await else {
        return;
    };
    fenced_writes(&srv).await;
    srv.stop().await;
}

fn replica_flags() -> Vec<String> {
    vec![
        "--leader-lease-secs".into(),
        LEASE_SECS.to_string(),
        "--reconcile-secs".into(),
        "1".into(),
    ]
}

/// Waits (bounded) until `cond` holds.
async fn wait_until(what: &str, bound: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A fresh Postgres database with the lab seed and an operator token, for replicas.
async fn prepared_database() -> Option<(String, String)> {
    let url = common::postgres::scratch_database().await?;
    let store = common::store::seeded(&url).await;
    let now = time::OffsetDateTime::now_utc();
    let token = plexsphere::operator_tokens::create(&store, "lm-test", now)
        .await
        .unwrap()
        .expose();
    store.close().await;
    Some((url, token))
}

/// The replica that leads (its log says so), and the other one.
async fn leader_of(a: Replica, b: Replica) -> (Replica, Replica) {
    wait_until("one replica leads", TAKEOVER_BOUND, || {
        a.leads() + b.leads() > 0
    })
    .await;
    // A few renewals later, still exactly one has ever led.
    tokio::time::sleep(Duration::from_secs(LEASE_SECS)).await;
    assert_eq!(
        a.leads() + b.leads(),
        1,
        "two replicas led at once:\n{}\n---\n{}",
        a.log(),
        b.log()
    );
    if a.leads() == 1 { (a, b) } else { (b, a) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_with_sigkill_is_replaced_and_the_pending_resource_finished() {
    let Some((url, token)) = prepared_database().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let a = Replica::start("a", &url, &data, dir.path(), &replica_flags());
    let b = Replica::start("b", &url, &data, dir.path(), &replica_flags());
    let (leader, follower) = leader_of(a, b).await;
    assert!(
        follower
            .log()
            .contains("another replica leads the broker and maintenance"),
        "{}",
        follower.log()
    );
    leader.signal("-KILL");
    // A resource asked for while nobody leads (the leader dead, its lease not yet expired)
    // waits in Pending; the replica that takes over drives it through its phases.
    plexsphere::tls::install_ring_provider();
    let http = reqwest::Client::new();
    let created = create_bucket(&http, &follower.base, &token).await;
    assert_eq!(phase(&created), "Pending");
    wait_until(
        "the follower takes the lease after SIGKILL of the leader",
        TAKEOVER_BOUND,
        || follower.leads() == 1,
    )
    .await;
    let id = created["id"].as_str().unwrap();
    let ready = wait_ready(&http, &follower, &token, id).await;
    assert_eq!(history(&ready), ["Pending", "Provisioning", "Ready"]);
    assert_eq!(leader_gauge(&http, &follower.base, &token).await, 1);
}

/// Creates a local bucket (and its cloud credential) through `base`; answers the resource.
async fn create_bucket(http: &reqwest::Client, base: &str, token: &str) -> Value {
    let r = http
        .post(format!("{base}/v1/cloud-credentials"))
        .bearer_auth(token)
        .json(&json!({"name": format!("lm-cred-{}", uuid::Uuid::new_v4().simple()), "provider": "local", "payload": {"user": "u"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let cred: Value = r.json().await.unwrap();
    let r = http
        .post(format!("{base}/v1/projects/{LAB_NODES}/resources"))
        .bearer_auth(token)
        .json(&bucket_request(
            cred["id"].as_str().unwrap(),
            json!({"region": "us-east-1"}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    r.json().await.unwrap()
}

/// Polls the resource through `replica` until it is Ready (bounded).
async fn wait_ready(http: &reqwest::Client, replica: &Replica, token: &str, id: &str) -> Value {
    let deadline = Instant::now() + TAKEOVER_BOUND;
    loop {
        let r = http
            .get(format!("{}/v1/resources/{id}", replica.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let body: Value = r.json().await.unwrap();
        if phase(&body) == "Ready" {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "the resource never became Ready: {body}\n{}",
            replica.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_left_by_a_paused_leader_is_finished_by_the_other_and_the_old_one_stands_down() {
    let Some((url, token)) = prepared_database().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let a = Replica::start("a", &url, &data, dir.path(), &replica_flags());
    let b = Replica::start("b", &url, &data, dir.path(), &replica_flags());
    let (leader, follower) = leader_of(a, b).await;
    plexsphere::tls::install_ring_provider();
    let http = reqwest::Client::new();
    // The leader stops mid-flight (SIGSTOP: it holds its lease and its state, and runs on
    // once continued, as after a long GC pause or a frozen VM).
    leader.signal("-STOP");
    let created = create_bucket(&http, &follower.base, &token).await;
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(phase(&created), "Pending");
    // The follower takes the lease once the paused leader's expired, and drives the
    // resource through its phases.
    let ready = wait_ready(&http, &follower, &token, &id).await;
    assert_eq!(history(&ready), ["Pending", "Provisioning", "Ready"]);
    assert_eq!(follower.leads(), 1, "{}", follower.log());
    // The old leader runs on: it notices it no longer leads and never leads again while the
    // other holds the lease (its writes would be refused by the fence, see `fenced_writes`);
    // the resource keeps the history the new leader wrote.
    leader.signal("-CONT");
    wait_until(
        "the old leader sees it no longer leads",
        TAKEOVER_BOUND,
        || leader.log().contains("stopped leading"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = http
        .get(format!("{}/v1/resources/{id}", follower.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let after: Value = r.json().await.unwrap();
    assert_eq!(after["provisioning"], ready["provisioning"], "{after}");
    assert_eq!(leader.leads(), 1, "{}", leader.log());
    // What an operator's monitoring sees: exactly the new leader reports it leads.
    assert_eq!(leader_gauge(&http, &follower.base, &token).await, 1);
    assert_eq!(leader_gauge(&http, &leader.base, &token).await, 0);
}

/// `plexsphere_broker_leader` as the replica at `base` reports it on `/metrics`.
async fn leader_gauge(http: &reqwest::Client, base: &str, token: &str) -> i64 {
    metrics::gauge(http, base, token, "plexsphere_broker_leader")
        .await
        .unwrap()
}
