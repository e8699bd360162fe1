//! The broker over the real router, real TLS and a real SQLite file: resources walking their
//! phases on the local-directory substrate, every refusal of a create before anything is
//! stored, sealed cloud credentials and the catalog. A machine's token is `broker_tokens.rs`'s.
#![allow(clippy::unwrap_used)]

mod common;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use common::broker::{bucket_request, credential, credential_key, history, phase, wait_for};
use common::{LAB_NODES, TestServer};
use plexsphere_broker::blueprint::version_id;
use plexsphere_broker::credentials;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::Row as _;
use uuid::Uuid;

#[tokio::test]
async fn a_local_bucket_walks_to_ready_and_is_deleted_with_its_directory() {
    let srv = TestServer::start().await;
    let cred = credential(&srv, "local").await;
    let (status, created) = srv
        .op_post(
            &format!("/v1/projects/{LAB_NODES}/resources"),
            bucket_request(&cred, json!({"region": "us-east-1"})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    assert_eq!(phase(&created), "Pending");
    assert_eq!(created["kind"], "bucket");
    assert_eq!(created["parameters"], json!({"region": "us-east-1"}));
    let id = created["id"].as_str().unwrap().to_owned();

    let ready = wait_for(&srv, &id, "Ready", |r| phase(r) == "Ready").await;
    assert_eq!(history(&ready), ["Pending", "Provisioning", "Ready"]);
    let dir = srv.dir.path().join("buckets").join(format!("pr-{id}"));
    assert!(dir.is_dir(), "{} is missing", dir.display());

    let (status, list) = srv
        .op_get(&format!("/v1/projects/{LAB_NODES}/resources"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");

    let (status, deleting) = srv.op_delete(&format!("/v1/resources/{id}")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{deleting}");
    assert!(
        ["Deprovisioning", "Deleted"].contains(&phase(&deleting)),
        "{deleting}"
    );
    let deleted = wait_for(&srv, &id, "Deleted", |r| phase(r) == "Deleted").await;
    assert_eq!(
        history(&deleted),
        [
            "Pending",
            "Provisioning",
            "Ready",
            "Deprovisioning",
            "Deleted"
        ]
    );
    assert!(!dir.exists(), "{} still exists", dir.display());
    // Deleting again answers the resource unchanged.
    let (status, again) = srv.op_delete(&format!("/v1/resources/{id}")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(phase(&again), "Deleted");
    srv.stop().await;
}

#[tokio::test]
async fn every_refusal_comes_before_anything_is_stored() {
    let srv = TestServer::start().await;
    let local = credential(&srv, "local").await;
    let openstack = credential(&srv, "openstack").await;
    let revoked = credential(&srv, "local").await;
    let (status, body) = srv
        .op_post(
            &format!("/v1/cloud-credentials/{revoked}/revoke"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["revoked_at"].is_string(), "{body}");

    let path = format!("/v1/projects/{LAB_NODES}/resources");
    let cases = [
        (
            bucket_request(&local, json!({})),
            422,
            "invalid_parameters",
            "`region`",
        ),
        (
            bucket_request(&local, json!({"region": "us-east-1", "size": 3})),
            422,
            "invalid_parameters",
            "`size`",
        ),
        (
            bucket_request(&local, json!({"region": "Mars"})),
            422,
            "invalid_parameters",
            "`region`",
        ),
        (
            json!({"kind": "bucket", "blueprint_version_id": Uuid::from_u128(7), "cloud_credential_id": local, "parameters": {"region": "us-east-1"}}),
            422,
            "invalid_request",
            "no blueprint version",
        ),
        (
            json!({"kind": "node", "blueprint_version_id": version_id("local-bucket", "v1"), "cloud_credential_id": local, "parameters": {"region": "us-east-1"}}),
            422,
            "invalid_request",
            "--kind bucket",
        ),
        (
            bucket_request(&revoked, json!({"region": "us-east-1"})),
            422,
            "invalid_request",
            "revoked",
        ),
        (
            bucket_request(
                &Uuid::from_u128(9).to_string(),
                json!({"region": "us-east-1"}),
            ),
            422,
            "invalid_request",
            "no cloud credential",
        ),
        (
            bucket_request(&openstack, json!({"region": "us-east-1"})),
            422,
            "invalid_request",
            "`local` cloud credential",
        ),
        (
            json!({"kind": "node", "blueprint_version_id": version_id("local-machine", "v1"), "cloud_credential_id": local, "parameters": {"release": "bookworm"}}),
            503,
            "unavailable",
            "local-machine substrate",
        ),
    ];
    for (body, want_status, want_code, want_text) in cases {
        let (status, answer) = srv.op_post(&path, body.clone()).await;
        assert_eq!(status.as_u16(), want_status, "{body} -> {answer}");
        assert_eq!(answer["code"], want_code, "{body} -> {answer}");
        let message = answer["message"].as_str().unwrap();
        assert!(message.contains(want_text), "{body} -> {message}");
    }
    let (status, answer) = srv
        .op_post(
            &format!("/v1/projects/{}/resources", Uuid::from_u128(5)),
            bucket_request(&local, json!({"region": "us-east-1"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");

    let (_, list) = srv.op_get(&path).await;
    assert_eq!(list["items"], json!([]), "{list}");
    let mut conn = srv.store.pool().acquire().await.unwrap();
    let n: i64 = sqlx::query("SELECT COUNT(*) AS n FROM resources")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get("n");
    assert_eq!(n, 0);
    assert!(!srv.dir.path().join("buckets").exists());
    srv.stop().await;
}

#[tokio::test]
async fn credentials_are_sealed_at_rest_and_never_returned() {
    let srv = TestServer::start().await;
    let secret = "hunter2-SECRET-7f3a9c";
    let (status, body) = srv
        .op_post(
            "/v1/cloud-credentials",
            json!({"name": "prod", "provider": "openstack", "payload": {
                "auth_url": "https://keystone.example:5000/v3", "username": "broker",
                "password": secret, "project_name": "machines"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(!body.to_string().contains(secret), "{body}");
    assert!(body.get("payload").is_none(), "{body}");
    let id: Uuid = body["id"].as_str().unwrap().parse().unwrap();
    let (_, list) = srv.op_get("/v1/cloud-credentials").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert!(!list.to_string().contains(secret), "{list}");
    assert_eq!(list["items"][0]["name"], "prod");
    assert_eq!(list["items"][0]["revoked_at"], Value::Null);

    // A bad provider is refused.
    let (status, body) = srv
        .op_post(
            "/v1/cloud-credentials",
            json!({"name": "x", "provider": "aws", "payload": {}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    // An OpenStack payload the broker could not use is refused when stored, naming what is
    // wrong and never echoing a secret.
    let (status, body) = srv
        .op_post(
            "/v1/cloud-credentials",
            json!({"name": "x", "provider": "openstack", "payload": {"password": secret}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("auth_url"),
        "{body}"
    );
    assert!(!body.to_string().contains(secret), "{body}");

    // Sealed under a key derived from the replica's KEK (so every replica opens it), not under
    // a key file of this data directory; nothing but the blob is stored.
    assert!(!srv.dir.path().join("credentials.key").exists());
    let kek = plexsphere::keys::Kek::dev(srv.dir.path()).unwrap();
    let mut conn = srv.store.pool().acquire().await.unwrap();
    let sealed: String = sqlx::query("SELECT sealed_payload FROM cloud_credentials")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get("sealed_payload");
    assert!(!sealed.contains(secret));
    let blob = STANDARD.decode(&sealed).unwrap();
    // The label is pinned: changing it would leave every stored credential unopenable.
    let key = credential_key(&kek);
    let plain = credentials::open(&key, id, &blob).unwrap();
    let v: Value = serde_json::from_slice(plain.expose()).unwrap();
    assert_eq!(v["password"], secret);
    drop(conn);

    // No file of the database holds the plaintext.
    for entry in std::fs::read_dir(srv.dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("plexsphere.db") {
            let bytes = std::fs::read(&path).unwrap();
            let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!found, "{name} holds the plaintext");
        }
    }
    srv.stop().await;
}

#[tokio::test]
async fn the_catalog_lists_the_builtin_blueprints() {
    let srv = TestServer::start().await;
    let (status, body) = srv.op_get("/v1/blueprints").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let items = body["items"].as_array().unwrap();
    let bucket = items.iter().find(|b| b["name"] == "local-bucket").unwrap();
    assert_eq!(
        bucket["version_id"],
        version_id("local-bucket", "v1").to_string()
    );
    assert_eq!(bucket["class"], "standalone");
    assert_eq!(bucket["substrate"], "local-directory");
    assert_eq!(bucket["parameters"]["region"]["required"], true);
    assert_eq!(items.len(), 4, "{body}");
    srv.stop().await;
}

#[tokio::test]
async fn a_rotated_credential_keeps_its_id_and_a_revoked_one_still_deletes_what_it_made() {
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

    // Rotation: same id, a new sealed payload that opens to the new secret; never echoed.
    let sealed = |srv: &TestServer| {
        let pool = srv.store.pool().clone();
        async move {
            let mut conn = pool.acquire().await.unwrap();
            sqlx::query("SELECT sealed_payload FROM cloud_credentials")
                .fetch_one(&mut *conn)
                .await
                .unwrap()
                .get::<String, _>("sealed_payload")
        }
    };
    let before = sealed(&srv).await;
    let (status, rotated) = srv
        .op_post(
            &format!("/v1/cloud-credentials/{cred}/rotate"),
            json!({"payload": {"user": "rotated-SECRET-41"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    assert_eq!(rotated["id"], cred.as_str());
    assert!(
        !rotated.to_string().contains("rotated-SECRET-41"),
        "{rotated}"
    );
    let after = sealed(&srv).await;
    assert_ne!(before, after);
    let kek = plexsphere::keys::Kek::dev(srv.dir.path()).unwrap();
    let key = credential_key(&kek);
    let plain = credentials::open(
        &key,
        cred.parse().unwrap(),
        &STANDARD.decode(&after).unwrap(),
    )
    .unwrap();
    assert_eq!(plain.expose(), br#"{"user":"rotated-SECRET-41"}"#);
    let (status, body) = srv
        .op_post(
            &format!("/v1/cloud-credentials/{cred}/rotate"),
            json!({"payload": "not an object"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, body) = srv
        .op_post(
            &format!("/v1/cloud-credentials/{}/rotate", Uuid::from_u128(3)),
            json!({"payload": {}}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // Revoked: no rotation, no new resource, but what it made is still deleted with it.
    let (status, body) = srv
        .op_post(&format!("/v1/cloud-credentials/{cred}/revoke"), json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = srv
        .op_post(
            &format!("/v1/cloud-credentials/{cred}/rotate"),
            json!({"payload": {}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("revoked"),
        "{body}"
    );
    let (status, deleting) = srv.op_delete(&format!("/v1/resources/{id}")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{deleting}");
    let deleted = wait_for(&srv, &id, "Deleted", |r| phase(r) == "Deleted").await;
    assert_eq!(
        history(&deleted),
        [
            "Pending",
            "Provisioning",
            "Ready",
            "Deprovisioning",
            "Deleted"
        ]
    );
    srv.stop().await;
}
