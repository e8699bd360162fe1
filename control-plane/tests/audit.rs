//! The audit log over the real server in process (docs/audit.md): the node changes an operator
//! makes are recorded on the node's Domain chain with who and how; a person behind a session is
//! stored only keyed (the database never holds the e-mail or the subject) and found again by
//! e-mail; concurrent appends to one chain get gapless seqs and the chain verifies.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::*;
use plexsphere::api::Verb;
use plexsphere::audit::{self, Actor, AuditEntry, PersonRef};
use plexsphere::store;
use reqwest::StatusCode;
use serde_json::{Value, json};

trait Put {
    async fn put(&self, path: &str, body: Value) -> (StatusCode, Value);
}

impl Put for TestServer {
    async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        operators::call(self, Verb::Put, path, &self.operator_token, Some(body)).await
    }
}

async fn lab_chain(srv: &TestServer, query: &str) -> Vec<Value> {
    let (status, page) = srv.op_get(&format!("/v1/audit?domain=lab{query}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["entries"].as_array().unwrap().clone()
}

async fn verify(srv: &TestServer, domain: Value) -> Value {
    let (status, report) = srv
        .op_post("/v1/audit/verify", json!({ "domain": domain }))
        .await;
    assert_eq!(status, StatusCode::OK, "{report}");
    report
}

#[tokio::test]
async fn node_changes_are_recorded_on_the_nodes_domain_chain() {
    node_changes(TestServer::start().await).await;
}

async fn node_changes(srv: TestServer) {
    let (a, b) = srv.enrol_pair().await;
    let (s, v) = srv
        .put(
            &format!("/v1/nodes/{}/tags", a.node_id),
            json!({"tags": ["web"]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = srv
        .put(
            &format!("/v1/nodes/{}/name", a.node_id),
            json!({"name": "web-1"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = srv
        .put(
            &format!("/v1/nodes/{}/udp-offload", a.node_id),
            json!({"udp_offload": "off"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = srv
        .op_post(&format!("/v1/nodes/{}/rotate-key", a.node_id), json!({}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (s, v) = srv
        .op_post(&format!("/v1/nodes/{}/revoke", b.node_id), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");

    let rows = lab_chain(&srv, "").await;
    let got: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["action"].as_str().unwrap().to_owned(),
                r["target"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let (na, nb) = (format!("node/{}", a.node_id), format!("node/{}", b.node_id));
    // Two token issues for the enrolment, then the node changes in order.
    assert_eq!(
        got[2..],
        [
            ("node.tag".to_owned(), na.clone()),
            ("node.rename".to_owned(), na.clone()),
            ("node.udp-offload".to_owned(), na.clone()),
            ("node.rotate-key".to_owned(), na.clone()),
            ("node.revoke".to_owned(), nb),
        ],
        "{rows:#?}"
    );
    assert_eq!(rows[2]["detail"]["tags"], json!(["web"]));
    assert_eq!(rows[3]["detail"]["name"], "web-1");
    assert_eq!(rows[4]["actor"]["kind"], "token");
    assert_eq!(rows[4]["actor"]["name"], "test");
    let report = verify(&srv, json!("lab")).await;
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["rows"], 7, "{report}");
    srv.stop().await;
}

#[tokio::test]
async fn people_are_stored_only_keyed_and_found_by_email() {
    let srv = TestServer::start().await;
    let (_, domains) = srv.op_get("/v1/domains").await;
    let domain: uuid::Uuid = domains["items"][0]["id"].as_str().unwrap().parse().unwrap();
    let pepper = srv.state.pepper_key().unwrap();
    let alice = PersonRef {
        issuer: "http://127.0.0.1:9/issuer".into(),
        subject: "alice-subject-7f3a".into(),
        email: Some("Alice.Example@Example.org".into()),
    };
    let entry = AuditEntry {
        domain_id: Some(domain),
        actor: Actor::session("sess-public-1", alice),
        action: "session.sign-in",
        target: "session/sess-public-1".into(),
        detail: json!({}),
    };
    let mut tx = srv.store.begin().await.unwrap();
    let now = store::unix(time::OffsetDateTime::now_utc());
    audit::record(&mut tx, &pepper, &entry, now).await.unwrap();
    tx.commit().await.unwrap();

    // Neither the e-mail (in any case) nor the subject is in any cell of the database.
    for needle in [
        "alice.example@example.org",
        "Alice.Example@Example.org",
        "alice-subject-7f3a",
    ] {
        let cells = cells_holding(srv.store.pool(), needle).await;
        assert!(cells.is_empty(), "{needle} is stored in clear in {cells:?}");
    }
    // The e-mail finds the row (any case), another finds nothing.
    let rows = lab_chain(&srv, "&actor_email=ALICE.example@example.org").await;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["actor"]["kind"], "session");
    assert_eq!(rows[0]["actor"]["ref"], "sess-public-1");
    assert!(rows[0]["actor"]["email_key"].is_string(), "{rows:#?}");
    assert!(
        lab_chain(&srv, "&actor_email=bob@example.org")
            .await
            .is_empty()
    );
    srv.stop().await;
}

#[tokio::test]
async fn concurrent_appends_get_gapless_seqs_and_verify() {
    concurrent_appends(TestServer::start().await).await;
}

/// The same on Postgres, where the head row's lock serializes the appends (skipped without
/// `PLEXSPHERE_TEST_POSTGRES_URL`, required under CI).
#[tokio::test]
async fn concurrent_appends_get_gapless_seqs_and_verify_on_postgres() {
    if let Some(srv) = common::postgres::server().await {
        concurrent_appends(srv).await;
    }
}

#[tokio::test]
async fn node_changes_are_recorded_on_postgres_too() {
    if let Some(srv) = common::postgres::server().await {
        node_changes(srv).await;
    }
}

async fn concurrent_appends(srv: TestServer) {
    const N: usize = 24;
    let mut tasks = Vec::new();
    for i in 0..N {
        let state = srv.state.clone();
        tasks.push(tokio::spawn(async move {
            state
                .audit(AuditEntry {
                    domain_id: None,
                    actor: Actor::system(),
                    action: "test.append",
                    target: format!("n/{i}"),
                    detail: json!({"i": i}),
                })
                .await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (status, page) = srv.op_get("/v1/audit?limit=1000").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let seqs: Vec<i64> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=N as i64).collect::<Vec<_>>());
    let report = verify(&srv, Value::Null).await;
    assert_eq!(report["ok"], true, "{report}");
    // Paging: two rows at a time from seq 10.
    let (_, page) = srv.op_get("/v1/audit?limit=2&after=10").await;
    assert_eq!(page["entries"][0]["seq"], 11, "{page}");
    assert_eq!(page["next_after"], 12, "{page}");
    let (status, body) = srv.op_get("/v1/audit?limit=5000").await;
    assert_code(status, &body, 422, "invalid_request");
    srv.stop().await;
}

#[tokio::test]
async fn the_brokers_phase_changes_are_recorded_as_the_broker() {
    use common::broker::{bucket_request, credential, phase, wait_for};
    let srv = TestServer::start().await;
    let cred = credential(&srv, "local").await;
    let (status, created) = srv
        .op_post(
            &format!("/v1/projects/{LAB_NODES}/resources"),
            bucket_request(&cred, json!({"region": "us-east-1"})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    wait_for(&srv, &id, "Ready", |r| phase(r) == "Ready").await;
    let (status, _) = srv.op_delete(&format!("/v1/resources/{id}")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    wait_for(&srv, &id, "Deleted", |r| phase(r) == "Deleted").await;

    let rows = lab_chain(&srv, "").await;
    let target = format!("resource/{id}");
    let ours: Vec<(&str, &str, &str)> = rows
        .iter()
        .filter(|r| r["target"] == target.as_str())
        .map(|r| {
            (
                r["action"].as_str().unwrap(),
                r["actor"]["kind"].as_str().unwrap(),
                r["detail"]["to"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(ours[0], ("resource.create", "token", "-"), "{rows:#?}");
    assert!(
        ours.contains(&("resource.phase", "broker", "Ready")),
        "{ours:?}"
    );
    assert!(
        ours.contains(&("resource.delete", "token", "-")),
        "{ours:?}"
    );
    assert_eq!(
        ours.last(),
        Some(&("resource.phase", "broker", "Deleted")),
        "{ours:?}"
    );
    // The credential is on the platform chain, never its payload.
    let (_, platform) = srv.op_get("/v1/audit").await;
    assert_eq!(
        platform["entries"][0]["action"], "cloud-credential.create",
        "{platform}"
    );
    assert!(
        !platform.to_string().contains("\"user\":\"u\""),
        "{platform}"
    );
    assert_eq!(verify(&srv, json!("lab")).await["ok"], true);
    assert_eq!(verify(&srv, Value::Null).await["ok"], true);
    srv.stop().await;
}
