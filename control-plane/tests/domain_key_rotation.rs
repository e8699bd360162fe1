//! Domain signing-key rotation against the real server: `POST /v1/domains/{domain}/signing-keys`
//! announces the next key in every node's signed state (and in registration answers) with a
//! `resync` to every node, the new key signs after the overlap, the node route's transition
//! chain leads from a pinned key to the newest; refusals (an overlap under way, bad bodies,
//! scopes, credentials of the wrong kind); two replicas rotating at once make one generation;
//! and `plexsphere kek rotate` seals every key again under a new KEK.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::dev::BIN;
use common::nodes::pull;
use common::operators::{call, fresh};
use common::*;
use plexsphere::api::Verb;
use plexsphere::keys::rotate::{ACTIVE_RESYNC, ANNOUNCED_RESYNC};
use plexsphere_wire::RegisterResponse;
use plexsphere_wire::admin::{List, OperatorScope};
use plexsphere_wire::node::{EventKind, NodeState};
use plexsphere_wire::signed::{DomainVerifier, SignContext, SignedEnvelope};
use plexsphere_wire::signing_keys::{SigningKey, SigningKeyChain, follow};
use plexsphere_wire::signing_keys_admin::{SigningKeyStatus, SigningKeyView};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const KEYS: &str = "/v1/domains/lab/signing-keys";

async fn rotate(srv: &TestServer, body: Value) -> (StatusCode, Value) {
    call(srv, Verb::Post, KEYS, &srv.operator_token, Some(body)).await
}

async fn list(srv: &TestServer) -> Vec<SigningKeyView> {
    let (s, body) = srv.op_get(KEYS).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    serde_json::from_value::<List<SigningKeyView>>(body)
        .unwrap()
        .items
}

fn statuses(keys: &[SigningKeyView]) -> Vec<(u64, SigningKeyStatus)> {
    keys.iter().map(|k| (k.generation, k.status)).collect()
}

/// The node's signed state, unverified.
async fn envelope(srv: &TestServer, reg: &RegisterResponse) -> SignedEnvelope {
    let (status, _, env) = pull(srv, reg, None).await;
    assert_eq!(status, StatusCode::OK);
    env.unwrap()
}

/// The state opened with `key`, or None when `key` did not sign it.
fn open_with(env: &SignedEnvelope, key: &str) -> Option<NodeState> {
    DomainVerifier::from_b64(key)
        .unwrap()
        .open(SignContext::NodeState, env)
        .ok()
}

async fn chain(srv: &TestServer, reg: &RegisterResponse) -> SigningKeyChain {
    let r = srv
        .node_req(Method::GET, reg, "/signing-keys")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

/// Waits until `reg`'s state is signed by `key` (the overlap ends by the clock).
async fn wait_signed_by(srv: &TestServer, reg: &RegisterResponse, key: &str) -> NodeState {
    let mut found = None;
    srv.wait_for("the state signed by the new key", async || {
        found = open_with(&envelope(srv, reg).await, key);
        found.is_some()
    })
    .await;
    found.unwrap()
}

fn wire_key(v: &SigningKeyView) -> SigningKey {
    SigningKey {
        generation: v.generation,
        public_key: v.public_key.clone(),
        active_from: v.active_from.unix_timestamp(),
    }
}

/// Rotation with a 2 s overlap: announced in state, events and registration, then signing.
async fn announce_then_sign(srv: &TestServer) {
    let a = srv.enrol(LAB_NODES).await;
    let pinned = a.domain_signing_public_key.clone();
    assert_eq!(a.next_signing_key, None, "no rotation yet");
    assert_eq!(statuses(&list(srv).await), [(1, SigningKeyStatus::Current)]);
    // One stream as an older node (its own signed copies), one as plexd (Domain envelopes).
    let mut events = srv.open_events(&a, None).await;
    let mut domain_events = srv.open_domain_events(&a, None).await;

    let (s, body) = rotate(srv, json!({"overlap_secs": 2})).await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let made: SigningKeyView = serde_json::from_value(body).unwrap();
    assert_eq!((made.generation, made.status), (2, SigningKeyStatus::Next));
    assert_ne!(made.public_key, pinned);
    let keys = list(srv).await;
    assert_eq!(
        statuses(&keys),
        [(1, SigningKeyStatus::Current), (2, SigningKeyStatus::Next)]
    );
    assert_eq!(keys[0].public_key, pinned);
    assert_eq!(keys[1], made);

    // Every node is told at once, and its state announces the next key, signed by the current.
    events.trust(&made.public_key);
    domain_events.trust(&made.public_key);
    let (ev, by) = events.next_signed().await.unwrap();
    assert_eq!(
        ev.kind,
        EventKind::Resync {
            reason: ANNOUNCED_RESYNC.into()
        }
    );
    assert_eq!(by, 0, "the current key signs the announcement");
    assert_eq!(domain_events.next_signed().await.unwrap(), (ev.clone(), 0));
    assert_eq!(domain_events.domain_frames, 1, "plexd gets the Domain copy");
    let env = envelope(srv, &a).await;
    let state = open_with(&env, &pinned).expect("the current key still signs");
    assert!(open_with(&env, &made.public_key).is_none());
    assert_eq!(state.next_signing_key, Some(wire_key(&made)));
    assert_eq!(state.version, ev.seq, "the state is as new as the event");

    // A node registering during the overlap pins the current key and learns the next.
    let b = srv.enrol(LAB_NODES).await;
    assert_eq!(b.domain_signing_public_key, pinned);
    assert_eq!(b.next_signing_key, Some(wire_key(&made)));

    // One rotation at a time: the overlap must end first.
    let (s, body) = rotate(srv, json!({"overlap_secs": 2})).await;
    assert_code(s, &body, 409, "conflict");
    let msg = body["message"].as_str().unwrap();
    assert!(msg.contains("overlap of a rotation"), "{msg}");
    assert_eq!(
        list(srv).await.len(),
        2,
        "the refused rotation made nothing"
    );

    // After active_from the new key signs and the announcement is gone; every node is told
    // again (its stream gets a resync), and the version moved so that a node asking with its
    // ETag gets the new document. The streams opened before the rotation sign with the new
    // key too: a node that moved to it refuses the old one.
    let after = wait_signed_by(srv, &a, &made.public_key).await;
    assert_eq!(after.next_signing_key, None);
    let mut active = Vec::new();
    for reader in [&mut events, &mut domain_events] {
        let (ev, by) = loop {
            let (ev, by) = reader.next_signed().await.unwrap();
            match ev.kind {
                EventKind::PeerAdded { .. } => continue, // b's registration
                _ => break (ev, by),
            }
        };
        assert_eq!(
            ev.kind,
            EventKind::Resync {
                reason: ACTIVE_RESYNC.into()
            }
        );
        assert_eq!(by, 1, "the new key signs on a stream opened before: {ev:?}");
        active.push(ev);
    }
    assert_eq!(active[0], active[1]);
    assert_eq!(
        domain_events.domain_frames, 3,
        "the announcement, b, the activation"
    );
    let ev = active.remove(0);
    let now = open_with(&envelope(srv, &a).await, &made.public_key).unwrap();
    assert!(now.version >= ev.seq, "{} < {}", now.version, ev.seq);
    assert_eq!(
        statuses(&list(srv).await),
        [
            (1, SigningKeyStatus::Retired),
            (2, SigningKeyStatus::Current)
        ]
    );
    let (_, tag, _) = pull(srv, &a, None).await;
    assert_eq!(
        pull(srv, &a, tag.as_deref()).await.0,
        StatusCode::NOT_MODIFIED
    );
    let c = srv.enrol(LAB_NODES).await;
    assert_eq!(c.domain_signing_public_key, made.public_key);
    assert_eq!(c.next_signing_key, None);

    // A node that slept through the overlap follows the chain from the key it pinned.
    let chain = chain(srv, &a).await;
    assert_eq!(chain.transitions.len(), 1);
    let reached = follow(a.domain_id, &pinned, &chain).unwrap();
    assert_eq!(reached, [wire_key(&made)]);
    assert!(
        follow(a.domain_id, &made.public_key, &chain)
            .unwrap()
            .is_empty(),
        "the newest key has nothing to follow"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_is_announced_then_signs_after_its_overlap() {
    let srv = TestServer::start().await;
    announce_then_sign(&srv).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_is_announced_then_signs_after_its_overlap_on_postgres() {
    let Some(srv) = common::postgres::server().await else {
        return;
    };
    announce_then_sign(&srv).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rotations_make_a_chain_of_two_links_from_the_first_key() {
    let srv = TestServer::start().await;
    let a = srv.enrol(LAB_NODES).await;
    let first = a.domain_signing_public_key.clone();
    let mut made = Vec::new();
    for generation in [2, 3] {
        let (s, body) = rotate(&srv, json!({"overlap_secs": 1})).await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        let key: SigningKeyView = serde_json::from_value(body).unwrap();
        assert_eq!(key.generation, generation);
        wait_signed_by(&srv, &a, &key.public_key).await;
        made.push(key);
    }
    let chain = chain(&srv, &a).await;
    assert_eq!(chain.transitions.len(), 2);
    let reached = follow(a.domain_id, &first, &chain).unwrap();
    assert_eq!(reached, made.iter().map(wire_key).collect::<Vec<_>>());
    // From the middle key the chain leads on to the newest only.
    let reached = follow(a.domain_id, &made[0].public_key, &chain).unwrap();
    assert_eq!(reached, [wire_key(&made[1])]);
    assert_eq!(
        statuses(&list(&srv).await),
        [
            (1, SigningKeyStatus::Retired),
            (2, SigningKeyStatus::Retired),
            (3, SigningKeyStatus::Current)
        ]
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rotations_and_wrong_credentials_are_refused_clearly() {
    let srv = TestServer::start().await;
    let node = srv.enrol(LAB_NODES).await;

    let (s, body) = rotate(&srv, json!({"overlap_secs": 31 * 86_400})).await;
    assert_code(s, &body, 400, "invalid_request");
    let msg = body["message"].as_str().unwrap();
    assert!(msg.contains("30 days"), "{msg}");
    let (s, body) = rotate(&srv, json!({"overlap": 60})).await;
    assert_code(s, &body, 400, "invalid_json");
    assert!(
        body["message"].as_str().unwrap().contains("unknown field"),
        "{body}"
    );
    let (s, body) = rotate(&srv, json!({"overlap_secs": -1})).await;
    assert_code(s, &body, 400, "invalid_json");
    let (s, body) = call(
        &srv,
        Verb::Post,
        "/v1/domains/nope/signing-keys",
        &srv.operator_token,
        Some(json!({})),
    )
    .await;
    assert_code(s, &body, 404, "not_found");

    // Reading needs read-only, rotating admin.
    for scope in [OperatorScope::ReadOnly, OperatorScope::Operator] {
        let token = fresh(&srv, scope, None).await;
        let (s, body) = call(&srv, Verb::Post, KEYS, &token, Some(json!({}))).await;
        assert_code(s, &body, 403, "insufficient_scope");
        let (s, body) = call(&srv, Verb::Get, KEYS, &token, None).await;
        assert_eq!(s, StatusCode::OK, "{body}");
    }
    // A project-bound token sees its project's Domain (by id too) and no other.
    let bound = fresh(&srv, OperatorScope::ReadOnly, Some(LAB_NODES)).await;
    let by_id = format!("/v1/domains/{}/signing-keys", node.domain_id);
    let (s, body) = call(&srv, Verb::Get, &by_id, &bound, None).await;
    assert_eq!(s, StatusCode::OK, "{body}");

    // A node credential is not an operator token, and an operator token not a node's.
    let (s, body) = call(&srv, Verb::Get, KEYS, &node.node_credential, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{body}");
    let (s, body) = call(
        &srv,
        Verb::Post,
        KEYS,
        &node.node_credential,
        Some(json!({})),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{body}");
    let node_route = format!("/v1/nodes/{}/signing-keys", node.node_id);
    let (s, body) = call(&srv, Verb::Get, &node_route, &srv.operator_token, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{body}");

    assert_eq!(list(&srv).await.len(), 1, "nothing was rotated");
    assert!(chain(&srv, &node).await.transitions.is_empty());
    srv.stop().await;
}

// ---- replicas as processes ----

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A `serve` replica; killed on drop.
struct Replica {
    child: Child,
    base: String,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `serve` on `db` with `kek` and waits for its `listening on` line; Err(stderr) when
/// it exits instead.
fn serve(dir: &Path, db: &str, kek: &Path) -> Result<Replica, String> {
    let seed = dir.join("lab.yaml");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(&seed, plexsphere::seed::LAB_SEED).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--database-url", db, "--data-dir", path(dir)])
        .args(["--seed", path(&seed), "--tls-terminated-by-proxy"])
        .args(["--listen", "127.0.0.1:0", "--no-local-machines"])
        .args(["--key-encryption-key-file", path(kek)])
        .env_remove("CREDENTIALS_DIRECTORY")
        .env_remove("PLEXSPHERE_KEY_ENCRYPTION_KEY_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(base) = line.strip_prefix("listening on ") {
            return Ok(Replica {
                child,
                base: base.to_owned(),
            });
        }
    }
    child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    Err(stderr)
}

/// Runs `plexsphere args`: (success, stdout, stderr).
fn plexsphere(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("CREDENTIALS_DIRECTORY")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn admin_token(db: &str, dir: &Path) -> String {
    let (ok, out, err) = plexsphere(&[
        "operator-token",
        "create",
        "--database-url",
        db,
        "--data-dir",
        path(dir),
        "--name",
        "rotate-cp",
        "--scope",
        "admin",
    ]);
    assert!(ok, "{err}");
    out.trim().to_owned()
}

async fn replica_call(
    r: &Replica,
    method: Method,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    plexsphere::tls::install_ring_provider();
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{KEYS}", r.base))
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn replica_keys(r: &Replica, token: &str) -> Vec<SigningKeyView> {
    let (s, body) = replica_call(r, Method::GET, token, None).await;
    assert_eq!(s, 200, "{body}");
    serde_json::from_value::<List<SigningKeyView>>(body)
        .unwrap()
        .items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_rotating_at_once_make_one_generation() {
    let Some(db) = common::postgres::scratch_database().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kek = dir.path().join("kek");
    assert!(plexsphere(&["kek", "generate", "--out", path(&kek)]).0);
    let token = admin_token(&db, &dir.path().join("rc-tok"));
    let a = serve(&dir.path().join("rc-a"), &db, &kek).unwrap();
    let b = serve(&dir.path().join("rc-b"), &db, &kek).unwrap();
    // Both have read the first key before they race for the second.
    assert_eq!(replica_keys(&a, &token).await.len(), 1);
    assert_eq!(replica_keys(&b, &token).await.len(), 1);

    let body = || Some(json!({"overlap_secs": 600}));
    let ((sa, ba), (sb, bb)) = tokio::join!(
        replica_call(&a, Method::POST, &token, body()),
        replica_call(&b, Method::POST, &token, body()),
    );
    let mut codes = [sa, sb];
    codes.sort_unstable();
    assert_eq!(codes, [201, 409], "{ba} {bb}");
    let loser = if sa == 409 { &ba } else { &bb };
    assert_eq!(loser["code"], "conflict", "{loser}");
    let winner: SigningKeyView = serde_json::from_value(if sa == 201 { ba } else { bb }).unwrap();
    for r in [&a, &b] {
        let keys = replica_keys(r, &token).await;
        assert_eq!(
            statuses(&keys),
            [(1, SigningKeyStatus::Current), (2, SigningKeyStatus::Next)]
        );
        assert_eq!(keys[1], winner);
    }
    // What relays are given during the overlap: the current key and the next, one a line.
    let (ok, out, err) = plexsphere(&["domain-key", "--database-url", &db, "--domain", "lab"]);
    assert!(ok, "{err}");
    let keys = replica_keys(&a, &token).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [keys[0].public_key.as_str(), keys[1].public_key.as_str()]
    );
}

/// The sealed seeds of every stored key, by Domain and generation.
async fn sealed(db: &str) -> Vec<(String, i64, String)> {
    use sqlx::Row as _;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(db).await.unwrap();
    let rows = sqlx::query(
        "SELECT domain_id, generation, sealed_seed FROM domain_keys ORDER BY domain_id, generation",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    rows.iter()
        .map(|r| {
            (
                r.get::<String, _>("domain_id"),
                r.get::<i64, _>("generation"),
                r.get::<String, _>("sealed_seed"),
            )
        })
        .collect()
}

/// The one cloud credential's id and sealed payload.
async fn sealed_credential(db: &str) -> (String, String) {
    use sqlx::Row as _;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(db).await.unwrap();
    let row = sqlx::query("SELECT id, sealed_payload FROM cloud_credentials")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    (row.get("id"), row.get("sealed_payload"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kek_rotate_seals_every_key_again_and_only_the_new_kek_opens_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("kr-data");
    std::fs::create_dir_all(&data).unwrap();
    let db = plexsphere::store::Store::sqlite_url(&data);
    let (old, new, wrong) = (
        dir.path().join("kek-old"),
        dir.path().join("kek-new"),
        dir.path().join("kek-wrong"),
    );
    for k in [&old, &new, &wrong] {
        assert!(plexsphere(&["kek", "generate", "--out", path(k)]).0);
    }
    let token = admin_token(&db, &data);
    // Two generations under the old KEK.
    let before = {
        let r = serve(&data, &db, &old).unwrap();
        let (s, body) =
            replica_call(&r, Method::POST, &token, Some(json!({"overlap_secs": 0}))).await;
        assert_eq!(s, 201, "{body}");
        // A cloud credential, sealed under a key derived from the old KEK.
        plexsphere::tls::install_ring_provider();
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/cloud-credentials", r.base))
            .bearer_auth(&token)
            .json(&json!({"name": "os", "provider": "local", "payload": {"k": "kr-SECRET"}}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 201);
        replica_keys(&r, &token).await
    };
    assert_eq!(before.len(), 2);
    let credential =
        |kek: &Path| common::broker::credential_key(&plexsphere::keys::Kek::read(kek).unwrap());
    let opens = |key: &plexsphere_broker::credentials::CredentialKey, row: &(String, String)| {
        use base64::Engine as _;
        let blob = base64::engine::general_purpose::STANDARD
            .decode(&row.1)
            .unwrap();
        plexsphere_broker::credentials::open(key, row.0.parse().unwrap(), &blob)
            .map(|p| p.expose().to_vec())
            .ok()
    };
    let cred_before = sealed_credential(&db).await;
    assert_eq!(
        opens(&credential(&old), &cred_before).as_deref(),
        Some(&br#"{"k":"kr-SECRET"}"#[..])
    );
    let sealed_before = sealed(&db).await;

    let kek_rotate = |from: &Path, to: &Path| {
        plexsphere(&[
            "kek",
            "rotate",
            "--database-url",
            &db,
            "--old-key-encryption-key-file",
            path(from),
            "--key-encryption-key-file",
            path(to),
        ])
    };
    // A wrong old KEK: a clear error, and not one row changed.
    let (ok, _, err) = kek_rotate(&wrong, &new);
    assert!(!ok);
    assert!(err.contains("opens with neither"), "{err}");
    assert!(err.contains("nothing was changed"), "{err}");
    assert_eq!(sealed(&db).await, sealed_before);

    assert_eq!(sealed_credential(&db).await, cred_before);

    let (ok, out, err) = kek_rotate(&old, &new);
    assert!(ok, "{err}");
    assert!(out.contains("sealed 2 Domain keys again"), "{out}");
    assert!(out.contains("cloud credentials: 1 sealed again"), "{out}");
    let cred_after = sealed_credential(&db).await;
    assert_eq!(opens(&credential(&old), &cred_after), None);
    assert_eq!(
        opens(&credential(&new), &cred_after).as_deref(),
        Some(&br#"{"k":"kr-SECRET"}"#[..])
    );
    let sealed_after = sealed(&db).await;
    assert_eq!(sealed_after.len(), 2);
    for (b, a) in sealed_before.iter().zip(&sealed_after) {
        assert_eq!((&b.0, b.1), (&a.0, a.1));
        assert_ne!(b.2, a.2, "generation {} sealed again", b.1);
    }
    // Again with the same arguments: nothing to do, nothing changed.
    let (ok, out, err) = kek_rotate(&old, &new);
    assert!(ok, "{err}");
    assert!(out.contains("nothing to do"), "{out}");
    assert!(out.contains("cloud credentials: 0 sealed again"), "{out}");
    assert_eq!(sealed(&db).await, sealed_after);
    assert_eq!(sealed_credential(&db).await, cred_after);

    // The new KEK serves the same keys; the old one no longer starts a replica.
    {
        let r = serve(&data, &db, &new).unwrap();
        assert_eq!(replica_keys(&r, &token).await, before);
    }
    let err = serve(&data, &db, &old)
        .err()
        .expect("the old KEK is refused");
    assert!(err.contains("did not seal the Domain key"), "{err}");
}

/// Every cloud credential's id and sealed payload, by id.
async fn sealed_credentials(db: &str) -> Vec<(String, String)> {
    use sqlx::Row as _;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(db).await.unwrap();
    let rows = sqlx::query("SELECT id, sealed_payload FROM cloud_credentials ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    rows.iter()
        .map(|r| (r.get("id"), r.get("sealed_payload")))
        .collect()
}

/// `kek rotate` seals the Domain keys and the cloud credentials again in one transaction: a
/// credential that opens with neither KEK fails it as a whole, and the Domain keys (and the
/// credential sealed again before it) stay under the old KEK, which still starts a replica.
async fn a_credential_that_does_not_open_changes_nothing(dir: &Path, db: &str) {
    let data = dir.join("kc-data");
    let (old, new) = (dir.join("kek-old"), dir.join("kek-new"));
    for k in [&old, &new] {
        assert!(plexsphere(&["kek", "generate", "--out", path(k)]).0);
    }
    // A replica makes the Domain key under the old KEK.
    drop(serve(&data, db, &old).unwrap());
    let keys_before = sealed(db).await;
    assert!(!keys_before.is_empty());

    // Two credentials: one sealed under the old KEK (listed first, so it is sealed again
    // before the other is reached), and one whose sealed bytes open with no key.
    let good = uuid::Uuid::now_v7();
    let bad = uuid::Uuid::now_v7();
    let old_key = common::broker::credential_key(&plexsphere::keys::Kek::read(&old).unwrap());
    let new_key = common::broker::credential_key(&plexsphere::keys::Kek::read(&new).unwrap());
    let payload = plexsphere_broker::credentials::CredentialPayload::new(b"{\"k\":1}".to_vec());
    let encode = |b: &[u8]| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(b)
    };
    {
        let store = plexsphere::store::Store::connect(db).await.unwrap();
        let mut conn = store.pool().acquire().await.unwrap();
        let rows = [
            (
                good,
                "good",
                encode(&plexsphere_broker::credentials::seal(&old_key, good, &payload).unwrap()),
                1,
            ),
            (bad, "bad", encode(&[1; 45]), 2),
        ];
        for (id, name, sealed_payload, created_at) in rows {
            let row = plexsphere::store::credentials::CredentialRow {
                id,
                name: name.into(),
                provider: "local".into(),
                sealed_payload,
                created_at,
                revoked_at: None,
            };
            plexsphere::store::credentials::insert(&mut conn, &row)
                .await
                .unwrap();
        }
        drop(conn);
        store.close().await;
    }
    let credentials_before = sealed_credentials(db).await;

    let kek_rotate = || {
        plexsphere(&[
            "kek",
            "rotate",
            "--database-url",
            db,
            "--data-dir",
            path(&data),
            "--old-key-encryption-key-file",
            path(&old),
            "--key-encryption-key-file",
            path(&new),
        ])
    };
    let (ok, out, err) = kek_rotate();
    assert!(!ok, "{out}");
    assert!(
        err.contains(&format!("cloud credential {bad} (bad) opens with neither")),
        "{err}"
    );
    assert!(err.contains("nothing was changed"), "{err}");
    assert_eq!(sealed(db).await, keys_before, "the Domain keys changed");
    assert_eq!(sealed_credentials(db).await, credentials_before);
    {
        let r = serve(&data, db, &old);
        assert!(
            r.is_ok(),
            "the old KEK no longer starts a replica: {:?}",
            r.err()
        );
    }

    // Without the credential that does not open, the rotation goes through, all of it.
    {
        let store = plexsphere::store::Store::connect(db).await.unwrap();
        sqlx::query("DELETE FROM cloud_credentials WHERE id = $1")
            .bind(bad.to_string())
            .execute(store.pool())
            .await
            .unwrap();
        store.close().await;
    }
    let (ok, out, err) = kek_rotate();
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("sealed {} Domain keys again", keys_before.len())),
        "{out}"
    );
    assert!(out.contains("cloud credentials: 1 sealed again"), "{out}");
    let after = sealed_credentials(db).await;
    assert_eq!(after.len(), 1);
    let blob = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(&after[0].1)
            .unwrap()
    };
    assert!(plexsphere_broker::credentials::open(&old_key, good, &blob).is_err());
    assert_eq!(
        plexsphere_broker::credentials::open(&new_key, good, &blob)
            .unwrap()
            .expose(),
        b"{\"k\":1}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kek_rotate_with_a_credential_that_does_not_open_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = plexsphere::store::Store::sqlite_url(&dir.path().join("kc-data"));
    a_credential_that_does_not_open_changes_nothing(dir.path(), &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kek_rotate_with_a_credential_that_does_not_open_changes_nothing_on_postgres() {
    let Some(db) = common::postgres::scratch_database().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    a_credential_that_does_not_open_changes_nothing(dir.path(), &db).await;
}
