//! Issue 24, "Prove the key": what a fleet neighbour holds (the group's reusable bootstrap
//! token, from every machine's user data, and every node's WireGuard public key, from
//! `peer_added`) does not take over a node's registration, nor register its key or its relay
//! prefix a second time.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use common::prove::{remember, wg_secret};
use common::*;
use plexsphere_wire::RegisterResponse;
use plexsphere_wire::key::PublicKey;
use plexsphere_wire::proof::{Challenge, prove_register};
use plexsphere_wire::secret::BootstrapToken;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn reusable_token(srv: &TestServer, uses: u32) -> String {
    let (status, body) = srv
        .op_post(
            &format!("/v1/projects/{LAB_NODES}/bootstrap-tokens"),
            json!({"kind": "node", "env_prefix": "asg", "ttl_secs": 3600, "max_uses": uses}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["token"].as_str().unwrap().to_owned()
}

async fn challenge(srv: &TestServer, token: &str) -> Challenge {
    let r = srv
        .client
        .post(srv.url("/v1/register/challenge"))
        .json(&json!({ "bootstrap_token": token }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

/// The attacker's registration of `key` with `token`, its proof made with `by` (its own key).
async fn forged(srv: &TestServer, token: &str, key: &str, by: [u8; 32]) -> (StatusCode, Value) {
    let c = challenge(srv, token).await;
    let server = plexsphere_wire::key::PublicKey::from_base64(&c.server_public_key).unwrap();
    let id = BootstrapToken::parse(token).unwrap().id;
    let mut body = register_body(token, key);
    body["proof"] = prove_register(&by, &server, &id, &c.nonce).into();
    body["nonce"] = c.nonce.into();
    let (s, _, b) = srv.register_unproved(&body, None).await;
    (s, b)
}

/// The attack reproduced on main: right after node v's join, before its first call, one
/// registration with the same reusable token and v's public key was answered 200 with v's node
/// id and a new credential, and v's own credential was refused (401) for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reusable_token_and_a_public_key_do_not_take_over_a_node_right_after_its_join() {
    let srv = TestServer::start().await;
    let token = reusable_token(&srv, 5).await;
    let v_key = wg_key(9_001);
    let (s, b) = srv.register(&register_body(&token, &v_key)).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let v: RegisterResponse = serde_json::from_value(b).unwrap();

    // The neighbour: the token and v's public key, no proof (as curl sent it).
    let (s, _, b) = srv
        .register_unproved(&register_body(&token, &v_key), None)
        .await;
    assert_code(s, &b, 422, "proof_required");
    assert!(
        b["message"].as_str().unwrap().contains("upgrade plexd"),
        "{b}"
    );
    assert!(b.get("node_credential").is_none(), "{b}");
    // With a challenge of its own and a proof made with its own private key.
    let (s, b) = forged(&srv, &token, &v_key, wg_secret(9_002)).await;
    assert_code(s, &b, 403, "proof_invalid");
    // With the nonce of another token.
    let other = srv.issue_token(LAB_NODES).await;
    let c = challenge(&srv, &other.token).await;
    let mut body = register_body(&token, &v_key);
    body["nonce"] = c.nonce.into();
    body["proof"] = "AAAA".into();
    let (s, _, b) = srv.register_unproved(&body, None).await;
    assert_code(s, &b, 403, "proof_invalid");

    // v keeps its credential and its first call works.
    let (s, hb) = srv.heartbeat(&v).await;
    assert_eq!(s, StatusCode::OK, "{hb}");
    // Once v authenticated, not even v's own (proved) replay mints a credential.
    let (s, b) = srv.register(&register_body(&token, &v_key)).await;
    assert_code(s, &b, 403, "token_consumed");
    assert_eq!(srv.heartbeat(&v).await.0, StatusCode::OK);
    srv.stop().await;
}

/// A plexd that crashed between the server's commit and saving its identity still comes back:
/// its own replay proves the key and gets the same node, 200, before the node authenticated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_own_proved_replay_still_recovers_a_lost_answer() {
    let srv = TestServer::start().await;
    let token = reusable_token(&srv, 2).await;
    let key = wg_key(9_101);
    let (s, first) = srv.register(&register_body(&token, &key)).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    let (s, again) = srv.register(&register_body(&token, &key)).await;
    assert_eq!(s, StatusCode::OK, "{again}");
    assert_eq!(again["node_id"], first["node_id"]);
    let node: RegisterResponse = serde_json::from_value(again).unwrap();
    assert_eq!(srv.heartbeat(&node).await.0, StatusCode::OK);
    srv.stop().await;
}

/// A node registered with the key of `secret` from a token of its own: its id.
async fn registered(srv: &TestServer, secret: [u8; 32]) -> String {
    let key = remember(secret);
    let (s, b) = srv
        .register(&register_body(
            &srv.issue_token(LAB_NODES).await.token,
            &key,
        ))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    b["node_id"].as_str().unwrap().to_owned()
}

async fn same_key_from_another_token_is_409(srv: TestServer) {
    let secret = wg_secret(9_201);
    let first = registered(&srv, secret).await;
    // The same key (its holder proves it) from another token: two live nodes, one key.
    let (s, b) = srv
        .register(&register_body(
            &srv.issue_token(LAB_NODES).await.token,
            &remember(secret),
        ))
        .await;
    assert_code(s, &b, 409, "key_in_use");
    assert!(b["message"].as_str().unwrap().contains(&first), "{b}");
    srv.stop().await;
}

async fn same_prefix_from_another_token_is_409(srv: TestServer) {
    let first = registered(&srv, wg_secret(9_301)).await;
    // A live node whose key shares only the first 8 bytes of another key (made here by
    // editing the first node's row: nobody can make such a key pair without 2^64 tries).
    let other_key = remember(wg_secret(9_302));
    let mut shared = STANDARD.decode(&other_key).unwrap();
    shared[8..].copy_from_slice(&[0x11; 24]);
    sqlx::query("UPDATE nodes SET wireguard_public_key = $1 WHERE id = $2")
        .bind(STANDARD.encode(&shared))
        .bind(first.clone())
        .execute(srv.store.pool())
        .await
        .unwrap();
    // The prefix column is schema 16's (this fix); before it the statement fails, harmlessly.
    let prefix = STANDARD
        .encode(&shared[..8])
        .trim_end_matches('=')
        .to_owned();
    let _ = sqlx::query("UPDATE nodes SET key_prefix = $1 WHERE id = $2")
        .bind(prefix.clone())
        .bind(first.clone())
        .execute(srv.store.pool())
        .await;
    let (s, b) = srv
        .register(&register_body(
            &srv.issue_token(LAB_NODES).await.token,
            &other_key,
        ))
        .await;
    assert_code(s, &b, 409, "key_prefix_in_use");
    assert!(b["message"].as_str().unwrap().contains(&first), "{b}");

    // The database itself refuses a second live row with that prefix in the Domain (two
    // replicas racing past the check): made here with a third node.
    let third = srv.enrol(LAB_NODES).await;
    let clash = sqlx::query("UPDATE nodes SET key_prefix = $1 WHERE id = $2")
        .bind(prefix.clone())
        .bind(third.node_id.to_string())
        .execute(srv.store.pool())
        .await;
    assert!(
        clash.is_err(),
        "the unique index let two live nodes share a prefix"
    );

    // Revoked, the first node's prefix is free again.
    let (s, b) = srv
        .op_post(&format!("/v1/nodes/{first}/revoke"), json!({}))
        .await;
    assert!(s.is_success(), "{b}");
    let (s, b) = srv
        .register(&register_body(
            &srv.issue_token(LAB_NODES).await.token,
            &other_key,
        ))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_from_another_token_is_409_on_sqlite() {
    same_key_from_another_token_is_409(TestServer::start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_from_another_token_is_409_on_postgres() {
    let Some(srv) = postgres::server().await else {
        return;
    };
    same_key_from_another_token_is_409(srv).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_prefix_from_another_token_is_409_on_sqlite() {
    same_prefix_from_another_token_is_409(TestServer::start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_prefix_from_another_token_is_409_on_postgres() {
    let Some(srv) = postgres::server().await else {
        return;
    };
    same_prefix_from_another_token_is_409(srv).await;
}

/// Nonces go only to holders of a known token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_challenge_needs_a_known_token() {
    let srv = TestServer::start().await;
    let r = srv
        .client
        .post(srv.url("/v1/register/challenge"))
        .json(&json!({ "bootstrap_token": "pxbt_lab_node_0123456789abcdef_nope" }))
        .send()
        .await
        .unwrap();
    let (s, b) = (r.status(), r.json::<Value>().await.unwrap());
    assert!(s == StatusCode::UNAUTHORIZED, "{b}");
    assert_eq!(b["code"], "token_unknown");
    srv.stop().await;
}

/// Schema 16 on a database that already holds nodes: every live node's `key_prefix` is what
/// plexsphere computes (all 64 values of the 11th base64 character), and rows that already
/// clash (one key twice, one prefix twice) do not stop the migration: the oldest keeps its
/// prefix, the others get none.
async fn upgrading_computes_prefixes_and_keeps_clashing_rows(url: String) {
    use plexsphere::store::Store;
    use sqlx::Row as _;
    let store = Store::connect(&url).await.unwrap();
    plexsphere::store::migrator()
        .run_to(15, store.pool())
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
    let insert = |id: String, ip: String, key: [u8; 32], at: i64, revoked: Option<i64>| {
        let (store, domain) = (&store, domain.clone());
        async move {
            sqlx::query(
                "INSERT INTO nodes (id, domain_id, project_id, hostname, arch, plexd_version, mesh_ip, wireguard_public_key, credential_sha256, registered_at, revoked_at) \
                 VALUES ($1, $2, $3, 'old', 'amd64', '0.1.0', $4, $5, 'x', $6, $7)",
            )
            .bind(id)
            .bind(domain)
            .bind(LAB_NODES)
            .bind(ip)
            .bind(STANDARD.encode(key))
            .bind(at)
            .bind(revoked)
            .execute(store.pool())
            .await
            .unwrap();
        }
    };
    let id = |n: u32| format!("019a0816-0000-7000-8000-{n:012x}");
    // 64 keys: the 11th base64 character takes every value.
    let mut keys = Vec::new();
    for i in 0u8..64 {
        let mut k = [0u8; 32];
        k[0] = i;
        k[7] = i >> 2;
        k[8] = (i & 3) << 6;
        k[31] = 1;
        keys.push(k);
        insert(
            id(u32::from(i) + 1),
            format!("10.64.0.{}", u32::from(i) + 10),
            k,
            100,
            None,
        )
        .await;
    }
    // Clashes with key 0, all registered after it: the same key, the same prefix; and a
    // revoked node with the same key (outside the index).
    let same_key = keys[0];
    let mut same_prefix = keys[0];
    same_prefix[20] = 0xee;
    insert(id(100), "10.64.0.100".into(), same_key, 200, None).await;
    insert(id(101), "10.64.0.101".into(), same_prefix, 150, None).await;
    insert(id(102), "10.64.0.102".into(), same_key, 50, Some(60)).await;

    store.migrate().await.unwrap();
    let prefix_of = |n: u32| {
        let pool = store.pool().clone();
        async move {
            sqlx::query("SELECT key_prefix FROM nodes WHERE id = $1")
                .bind(id(n))
                .fetch_one(&pool)
                .await
                .unwrap()
                .try_get::<Option<String>, _>("key_prefix")
                .unwrap()
        }
    };
    for (i, k) in keys.iter().enumerate() {
        let n = u32::try_from(i).unwrap() + 1;
        assert_eq!(
            prefix_of(n).await.as_deref(),
            Some(plexsphere_wire::proof::key_prefix(&PublicKey(*k)).as_str()),
            "key {i}: {}",
            STANDARD.encode(k)
        );
    }
    assert_eq!(
        prefix_of(100).await,
        None,
        "a second live node with one key"
    );
    assert_eq!(
        prefix_of(101).await,
        None,
        "a second live node with one prefix"
    );
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrading_to_version_16_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    upgrading_computes_prefixes_and_keeps_clashing_rows(plexsphere::store::Store::sqlite_url(
        dir.path(),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrading_to_version_16_on_postgres() {
    let Some(url) = postgres::scratch_database().await else {
        return;
    };
    upgrading_computes_prefixes_and_keeps_clashing_rows(url).await;
}

/// The proof key derives from the Domain's signing key: a challenge answered just before a new
/// signing-key generation becomes current still proves after it (within its 5 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_challenge_from_before_a_domain_key_rotation_still_proves_after_it() {
    let srv = TestServer::start().await;
    let token = srv.issue_token(LAB_NODES).await.token;
    let secret = wg_secret(9_401);
    let key = remember(secret);
    let before = challenge(&srv, &token).await;
    let (s, body) = srv
        .op_post("/v1/domains/lab/signing-keys", json!({"overlap_secs": 2}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    srv.wait_for("the new signing key is current", async || {
        challenge(&srv, &token).await.server_public_key != before.server_public_key
    })
    .await;
    let server = plexsphere_wire::key::PublicKey::from_base64(&before.server_public_key).unwrap();
    let id = BootstrapToken::parse(&token).unwrap().id;
    let mut req = register_body(&token, &key);
    req["proof"] = prove_register(&secret, &server, &id, &before.nonce).into();
    req["nonce"] = before.nonce.into();
    let (s, _, b) = srv.register_unproved(&req, None).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    srv.stop().await;
}
