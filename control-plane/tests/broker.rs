//! The broker over the real router, real TLS and a real SQLite file: resources walking their
//! phases on the local-directory substrate, every refusal of a create before anything is
//! stored, sealed cloud credentials, and a machine's token and composite on the crossplane
//! substrate.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use common::{LAB_NODES, OPENSTACK, TestServer, cells_holding};
use plexsphere_broker::blueprint::version_id;
use plexsphere_broker::credentials::{self, CredentialKey};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::Row as _;
use uuid::Uuid;

async fn credential(srv: &TestServer, provider: &str) -> String {
    let (status, body) = srv
        .op_post(
            "/v1/cloud-credentials",
            json!({"name": format!("{provider}-cred"), "provider": provider, "payload": {"user": "u"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_str().unwrap().to_owned()
}

fn bucket_request(cred: &str, parameters: Value) -> Value {
    json!({
        "kind": "bucket",
        "blueprint_version_id": version_id("local-bucket", "v1"),
        "cloud_credential_id": cred,
        "parameters": parameters,
    })
}

/// Polls the resource until `done` holds on it (bounded), answering it.
async fn wait_for(srv: &TestServer, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = srv.op_get(&format!("/v1/resources/{id}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if done(&body) {
            return body;
        }
        assert!(Instant::now() < deadline, "resource never {what}: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn phase(r: &Value) -> &str {
    r["provisioning"]["phase"].as_str().unwrap()
}

fn history(r: &Value) -> Vec<String> {
    r["provisioning"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["phase"].as_str().unwrap().to_owned())
        .collect()
}

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
            json!({"name": "prod", "provider": "openstack", "payload": {"password": secret}}),
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

    // The key file is private; the stored blob opens with it to the payload.
    let key_path = srv.dir.path().join("credentials.key");
    let key_bytes = std::fs::read(&key_path).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&key_path).unwrap().permissions().mode() & 0o777;
    assert_eq!((key_bytes.len(), mode), (32, 0o600));
    let mut conn = srv.store.pool().acquire().await.unwrap();
    let sealed: String = sqlx::query("SELECT sealed_payload FROM cloud_credentials")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get("sealed_payload");
    assert!(!sealed.contains(secret));
    let blob = STANDARD.decode(&sealed).unwrap();
    let key = CredentialKey::from_bytes(&key_bytes).unwrap();
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
async fn a_machine_gets_a_bound_token_and_a_rendered_composite_and_delete_revokes_it() {
    let srv = TestServer::start().await;
    let cred = credential(&srv, "openstack").await;
    let (status, created) = srv
        .op_post(
            &format!("/v1/projects/{OPENSTACK}/resources"),
            json!({
                "kind": "node",
                "blueprint_version_id": version_id("openstack-instance", "v1alpha2"),
                "cloud_credential_id": cred,
                "parameters": {"imageName": "debian-12", "flavorName": "m1.small", "networkName": "lab"},
            }),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let r = wait_for(&srv, &id, "Provisioning", |r| phase(r) == "Provisioning").await;
    assert_eq!(history(&r), ["Pending", "Provisioning"]);

    let tokens = srv.tokens(OPENSTACK).await;
    let bound: Vec<_> = tokens
        .iter()
        .filter(|t| t.resource_id.map(|u| u.to_string()) == Some(id.clone()))
        .collect();
    assert_eq!(bound.len(), 1, "{tokens:?}");
    let token_id = bound[0].id.clone();

    let mut conn = srv.store.pool().acquire().await.unwrap();
    let composite: String = sqlx::query("SELECT composite FROM resources WHERE id = $1")
        .bind(id.clone())
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get("composite");
    drop(conn);
    assert!(
        composite.contains("kind: XOpenStackInstance"),
        "{composite}"
    );
    assert!(composite.contains(&format!("name: pr-{id}")), "{composite}");
    assert!(
        composite.contains(&format!("namespace: plexsphere-project-{OPENSTACK}")),
        "{composite}"
    );
    assert!(composite.contains(&format!("cloud-credential-{cred}")));
    assert!(composite.contains("#cloud-config"), "{composite}");
    assert!(composite.contains(&format!("resource_handle: pr-{id}")));

    let (status, _) = srv.op_delete(&format!("/v1/resources/{id}")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    wait_for(&srv, &id, "Deleted", |r| phase(r) == "Deleted").await;
    let tokens = srv.tokens(OPENSTACK).await;
    let t = tokens.iter().find(|t| t.id == token_id).unwrap();
    assert!(t.revoked_at.is_some(), "{t:?}");
    srv.stop().await;
}

#[tokio::test]
async fn no_table_holds_a_machine_token_in_clear() {
    let srv = TestServer::start().await;
    let cred = credential(&srv, "openstack").await;
    let (status, created) = srv
        .op_post(
            &format!("/v1/projects/{OPENSTACK}/resources"),
            json!({
                "kind": "node",
                "blueprint_version_id": version_id("openstack-instance", "v1alpha2"),
                "cloud_credential_id": cred,
                "parameters": {"imageName": "debian-12", "flavorName": "m1.small", "networkName": "lab"},
            }),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    wait_for(&srv, &id, "Provisioning", |r| phase(r) == "Provisioning").await;
    let tokens = srv.tokens(OPENSTACK).await;
    let bound: Vec<_> = tokens
        .iter()
        .filter(|t| t.resource_id.map(|u| u.to_string()) == Some(id.clone()))
        .collect();
    assert_eq!(bound.len(), 1, "{tokens:?}");
    let token_id = bound[0].id.clone();

    let pool = srv.store.pool();
    // The scan sees the token's public id where it belongs (it would see the text too).
    let with_id = cells_holding(pool, &token_id).await;
    assert!(
        with_id.contains(&"bootstrap_tokens.id".to_owned())
            && with_id.contains(&"resources.token_id".to_owned()),
        "{with_id:?}"
    );
    // The token's text is pxbt_lab_node_<id>_<secret>: neither it nor any token text is stored.
    assert_eq!(
        cells_holding(pool, &format!("_{token_id}_")).await,
        Vec::<String>::new()
    );
    assert_eq!(cells_holding(pool, "pxbt_").await, Vec::<String>::new());
    // The stored composite holds the document with the marker where the token was.
    assert_eq!(
        cells_holding(pool, "<bootstrap token: redacted>").await,
        ["resources.composite"]
    );
    assert_eq!(
        cells_holding(pool, "resource_handle: pr-").await,
        ["resources.composite"]
    );

    // A pass that finds it Pending with its composite stored (as after a restart) sees the
    // substrate holding it: nothing is handed over again and no second token is minted.
    let mut conn = srv.store.pool().acquire().await.unwrap();
    let row = sqlx::query("SELECT provisioning FROM resources WHERE id = $1")
        .bind(id.clone())
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let mut provisioning: Value = serde_json::from_str(row.get("provisioning")).unwrap();
    provisioning["phase"] = json!("Pending");
    sqlx::query("UPDATE resources SET provisioning = $1, phase = 'Pending' WHERE id = $2")
        .bind(provisioning.to_string())
        .bind(id.clone())
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    plexsphere::broker::reconcile::pass(&srv.state)
        .await
        .unwrap();
    wait_for(&srv, &id, "Provisioning again", |r| {
        phase(r) == "Provisioning"
    })
    .await;
    let again: Vec<_> = srv
        .tokens(OPENSTACK)
        .await
        .into_iter()
        .filter(|t| t.resource_id.map(|u| u.to_string()) == Some(id.clone()))
        .collect();
    assert_eq!(again.len(), 1, "{again:?}");
    assert!(again[0].revoked_at.is_none(), "{again:?}");
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
    assert_eq!(items.len(), 3, "{body}");
    srv.stop().await;
}

/// A machine-class blueprint on the local-directory substrate: the directory stands in for the
/// machine, so a test can take the "machine" away as a server that stopped before handing the
/// document over would have left it.
const DIR_MACHINE: &str = "name: dir-machine\nversion: v1\nresource_kind: node\nclass: machine\nsubstrate: local-directory\ncomposite: {api_version: test.plexsphere.com/v1, kind: DirMachine}\nparameters: {}\n";

#[tokio::test]
async fn a_token_is_reminted_only_when_no_machine_was_handed_its_document() {
    use plexsphere::api::{ApiConfig, AppState};
    use plexsphere::broker::BrokerConfig;
    use plexsphere::broker::reconcile::reconcile_one;
    use plexsphere::store::{Store, credentials, resources, tokens};

    let dir = tempfile::tempdir().unwrap();
    let certs = plexsphere::tls::ensure_dev_certs(&dir.path().join("tls"), &[]).unwrap();
    let store = Store::connect(&Store::sqlite_url(dir.path()))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let now = time::OffsetDateTime::now_utc();
    let manifest = plexsphere::seed::parse(plexsphere::seed::LAB_SEED, "lab").unwrap();
    plexsphere::seed::apply(&store, &manifest, "lab", now)
        .await
        .unwrap();
    let mut catalog = plexsphere_broker::Catalog::builtin().unwrap();
    let version = catalog
        .add_text("test:dir-machine.yaml", DIR_MACHINE)
        .unwrap();
    let mut broker = BrokerConfig::new(catalog);
    broker.public_url = Some("https://localhost:8443".into());
    broker.ca_pem = Some(certs.ca_pem.clone());
    let st = AppState::with_broker_config(store.clone(), dir.path(), ApiConfig::default(), broker);

    let project: Uuid = LAB_NODES.parse().unwrap();
    let cred = Uuid::now_v7();
    let resource = plexsphere_broker::Resource::new(
        Uuid::now_v7(),
        project,
        "node".into(),
        version,
        cred,
        serde_json::Map::new(),
        now,
    );
    let id = resource.id;
    let machine = dir.path().join("buckets").join(resource.composed_name());
    {
        let mut conn = store.pool().acquire().await.unwrap();
        let c = credentials::CredentialRow {
            id: cred,
            name: "local-cred".into(),
            provider: "local".into(),
            sealed_payload: String::new(),
            created_at: plexsphere::store::unix(now),
            revoked_at: None,
        };
        credentials::insert(&mut conn, &c).await.unwrap();
        let row = resources::ResourceRow {
            resource,
            token_id: None,
            composite: None,
            provisioned_at: None,
            version: 1,
            updated_at: plexsphere::store::unix(now),
        };
        resources::insert(&mut conn, &row).await.unwrap();
    }
    let row = async || {
        let mut conn = store.pool().acquire().await.unwrap();
        resources::get(&mut conn, id).await.unwrap().unwrap()
    };
    let bound = async || {
        let mut conn = store.pool().acquire().await.unwrap();
        tokens::list_for_project(&mut conn, project)
            .await
            .unwrap()
            .into_iter()
            .filter(|t| t.resource_id == Some(id))
            .collect::<Vec<_>>()
    };
    // Back to Pending with everything else kept, as a server that stopped before observing.
    let back_to_pending = async || {
        let mut conn = store.pool().acquire().await.unwrap();
        let mut r = resources::get(&mut conn, id).await.unwrap().unwrap();
        r.resource.provisioning.phase = plexsphere_broker::Phase::Pending;
        assert!(
            resources::update(&mut conn, &mut r, plexsphere::store::unix(now))
                .await
                .unwrap()
        );
    };

    // First pass: one token, stored redacted, the "machine" made.
    reconcile_one(&st, row().await).await.unwrap();
    let first = bound().await;
    assert_eq!(first.len(), 1);
    assert!(machine.is_dir());
    let r = row().await;
    assert_eq!(r.resource.provisioning.phase.as_str(), "Provisioning");
    assert_eq!(r.token_id.as_deref(), Some(first[0].id.as_str()));
    assert!(
        r.composite
            .as_deref()
            .unwrap()
            .contains("<bootstrap token: redacted>")
    );

    // Pending again while the machine exists: it was handed its document; nothing is minted.
    back_to_pending().await;
    reconcile_one(&st, row().await).await.unwrap();
    let same = bound().await;
    assert_eq!(same.len(), 1, "{same:?}");
    assert!(same[0].revoked_at.is_none());
    assert_eq!(
        row().await.resource.provisioning.phase.as_str(),
        "Provisioning"
    );

    // Pending again and no machine: the old token is revoked, a new one minted and handed over.
    back_to_pending().await;
    std::fs::remove_dir(&machine).unwrap();
    reconcile_one(&st, row().await).await.unwrap();
    let after = bound().await;
    assert_eq!(after.len(), 2, "{after:?}");
    // Both may be minted in the same second: tell them apart by id, not order.
    let (old, new): (Vec<_>, Vec<_>) = after.iter().partition(|t| t.id == first[0].id);
    assert_eq!((old.len(), new.len()), (1, 1), "{after:?}");
    assert!(old[0].revoked_at.is_some(), "{after:?}");
    assert!(new[0].revoked_at.is_none(), "{after:?}");
    assert!(machine.is_dir());
    let r = row().await;
    assert_eq!(r.token_id.as_deref(), Some(new[0].id.as_str()));
    assert_eq!(r.resource.provisioning.phase.as_str(), "Provisioning");
    assert_eq!(
        cells_holding(store.pool(), "pxbt_").await,
        Vec::<String>::new()
    );
    assert_eq!(
        cells_holding(store.pool(), &format!("_{}_", new[0].id)).await,
        Vec::<String>::new()
    );
}
