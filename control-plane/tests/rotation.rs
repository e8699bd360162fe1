//! Key and credential rotation against the real server: the proof of possession (forged,
//! replayed, another node's nonce), a key already in use, the peers' `peer_updated`, the rate
//! limit, the credential that stays valid until the new one is used, the operator's request.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use common::*;
use plexsphere_wire::RegisterResponse;
use plexsphere_wire::node::EventKind;
use plexsphere_wire::reach::public_key;
use plexsphere_wire::rotation::{KeyChallenge, KeyRotation, prove};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

fn pubkey(secret: [u8; 32]) -> String {
    common::prove::remember(secret)
}

/// A node registered with the public key of `secret`.
async fn enrol_with(srv: &TestServer, secret: [u8; 32]) -> RegisterResponse {
    let token = srv.issue_token(LAB_NODES).await;
    let (status, body) = srv
        .register(&register_body(&token.token, &pubkey(secret)))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    serde_json::from_value(body).unwrap()
}

async fn challenge(srv: &TestServer, reg: &RegisterResponse) -> KeyChallenge {
    let r = srv.node_req(Method::GET, reg, "/key").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

/// A rotation `old` -> `new` with proofs made by `old_by` and `new_by` (the honest request
/// has them equal to `old` and `new`).
fn request(
    reg: &RegisterResponse,
    c: &KeyChallenge,
    (old, old_by): ([u8; 32], [u8; 32]),
    (new, new_by): ([u8; 32], [u8; 32]),
) -> KeyRotation {
    let server = plexsphere_wire::key::PublicKey::from_base64(&c.server_public_key).unwrap();
    let (o, n) = (public_key(&old), public_key(&new));
    KeyRotation {
        old_public_key: o.to_base64(),
        new_public_key: n.to_base64(),
        nonce: c.nonce.clone(),
        old_proof: prove(&old_by, &server, reg.node_id, &o, &n, &c.nonce),
        new_proof: prove(&new_by, &server, reg.node_id, &o, &n, &c.nonce),
    }
}

async fn rotate(
    srv: &TestServer,
    reg: &RegisterResponse,
    req: &KeyRotation,
) -> (StatusCode, Option<String>, Value) {
    let r = srv
        .node_req(Method::POST, reg, "/key")
        .json(req)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_changes_only_with_proof_of_both_keys_once_and_peers_hear_it() {
    key_rotation(&TestServer::start().await).await;
}

/// The same on Postgres (migration 0009 and the compare-and-swap there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotation_on_postgres() {
    let Some(srv) = common::postgres::server().await else {
        return;
    };
    key_rotation(&srv).await;
}

async fn key_rotation(srv: &TestServer) {
    let (s0, s1, s2) = ([11u8; 32], [12u8; 32], [13u8; 32]);
    let a = enrol_with(srv, s0).await;
    let b = srv.enrol(LAB_NODES).await;
    let mut b_events = srv.open_events(&b, None).await;
    let c = challenge(srv, &a).await;
    assert!(c.expires_at > 0 && !c.nonce.is_empty());

    // Forged: the credential alone (no old private key), or no new private key, or a nonce
    // that was changed or issued to another node, or another key's proof.
    let stranger = [99u8; 32];
    for (what, req) in [
        ("no old key", request(&a, &c, (s0, stranger), (s1, s1))),
        ("no new key", request(&a, &c, (s0, s0), (s1, stranger))),
        ("proofs swapped", {
            let mut r = request(&a, &c, (s0, s0), (s1, s1));
            std::mem::swap(&mut r.old_proof, &mut r.new_proof);
            r
        }),
        ("tampered nonce", {
            let mut r = request(&a, &c, (s0, s0), (s1, s1));
            r.nonce = r.nonce.replacen('.', ".x", 1);
            r
        }),
        ("B's nonce", {
            let cb = challenge(srv, &b).await;
            request(&a, &cb, (s0, s0), (s1, s1))
        }),
    ] {
        let (s, _, body) = rotate(srv, &a, &req).await;
        assert_code(s, &body, 403, "forbidden");
        assert_eq!(
            srv.node_view(a.node_id).await["wireguard_public_key"],
            pubkey(s0),
            "{what}"
        );
    }
    // Another node's credential cannot rotate A's key (the path is A's).
    let honest = request(&a, &c, (s0, s0), (s1, s1));
    let r = srv
        .client
        .post(srv.url(&format!("/v1/nodes/{}/key", a.node_id)))
        .bearer_auth(&b.node_credential)
        .json(&honest)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    // The honest request: the key changes, B hears peer_updated with the new key.
    let (s, _, body) = rotate(srv, &a, &honest).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["public_key"], pubkey(s1));
    assert_eq!(body["already"], false);
    assert!(body["relay_token"].is_object(), "{body}");
    let view = srv.node_view(a.node_id).await;
    assert_eq!(view["wireguard_public_key"], pubkey(s1));
    assert!(view["key_rotated_at"].is_string(), "{view}");
    let ev = loop {
        let ev = b_events.next_event().await.unwrap();
        if matches!(&ev.kind, EventKind::PeerUpdated { peer } if peer.node_id == a.node_id) {
            break ev;
        }
    };
    assert_eq!(ev.seq, body["state_version"].as_u64().unwrap());
    match ev.kind {
        EventKind::PeerUpdated { peer } => assert_eq!(peer.public_key, pubkey(s1)),
        other => panic!("{other:?}"),
    }

    // The same request again (the node lost the answer): done already, nothing changes.
    let (s, _, again) = rotate(srv, &a, &honest).await;
    assert_eq!(s, StatusCode::OK, "{again}");
    assert_eq!(again["already"], true);
    assert_eq!(again["state_version"], body["state_version"]);
    // A stale request (from the old key to a third one) is refused: the key is s1 now.
    let c2 = challenge(srv, &a).await;
    let (s, _, stale) = rotate(srv, &a, &request(&a, &c2, (s0, s0), (s2, s2))).await;
    assert_code(s, &stale, 409, "conflict");
    // The next real rotation right away meets the rate limit.
    let (s, retry, limited) = rotate(srv, &a, &request(&a, &c2, (s1, s1), (s2, s2))).await;
    assert_code(s, &limited, 429, "rate_limited");
    let secs: u64 = retry.unwrap().parse().unwrap();
    assert!((1..=30).contains(&secs), "{secs}");
    assert_eq!(
        srv.node_view(a.node_id).await["wireguard_public_key"],
        pubkey(s1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_use_by_another_node_is_refused_and_bad_keys_are_invalid() {
    let srv = TestServer::start().await;
    let (sa, sc) = ([21u8; 32], [22u8; 32]);
    let a = enrol_with(&srv, sa).await;
    let _c = enrol_with(&srv, sc).await;
    let ch = challenge(&srv, &a).await;
    // Even holding C's private key, A cannot take C's key.
    let (s, _, body) = rotate(&srv, &a, &request(&a, &ch, (sa, sa), (sc, sc))).await;
    assert_code(s, &body, 409, "conflict");
    assert!(
        body["message"].as_str().unwrap().contains("another node"),
        "{body}"
    );
    let mut same = request(&a, &ch, (sa, sa), (sa, sa));
    same.new_public_key = same.old_public_key.clone();
    let (s, _, body) = rotate(&srv, &a, &same).await;
    assert_code(s, &body, 422, "invalid_request");
    let mut bad = request(&a, &ch, (sa, sa), ([23; 32], [23; 32]));
    bad.new_public_key = "short".into();
    let (s, _, body) = rotate(&srv, &a, &bad).await;
    assert_code(s, &body, 422, "invalid_request");
}

/// Issue 24: a rotation to a key whose first 8 bytes (the relay's prefix) a live node of the
/// Domain has is refused with 409 `key_prefix_in_use`, naming that node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_to_a_key_sharing_a_live_nodes_prefix_is_409() {
    let srv = TestServer::start().await;
    let (sa, new) = ([51u8; 32], [52u8; 32]);
    let a = enrol_with(&srv, sa).await;
    let b = srv.enrol(LAB_NODES).await;
    // B's key shares the first 8 bytes of A's next key (edited in: nobody makes such a pair).
    let mut shared = public_key(&new).0.to_vec();
    shared[8..].copy_from_slice(&[0x22; 24]);
    sqlx::query("UPDATE nodes SET wireguard_public_key = $1 WHERE id = $2")
        .bind(STANDARD.encode(&shared))
        .bind(b.node_id.to_string())
        .execute(srv.store.pool())
        .await
        .unwrap();
    // The prefix column is schema 16's (this fix); before it the statement fails, harmlessly.
    let _ = sqlx::query("UPDATE nodes SET key_prefix = $1 WHERE id = $2")
        .bind(
            STANDARD
                .encode(&shared[..8])
                .trim_end_matches('=')
                .to_owned(),
        )
        .bind(b.node_id.to_string())
        .execute(srv.store.pool())
        .await;
    let ch = challenge(&srv, &a).await;
    let (s, _, body) = rotate(&srv, &a, &request(&a, &ch, (sa, sa), (new, new))).await;
    assert_code(s, &body, 409, "key_prefix_in_use");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains(&b.node_id.to_string()),
        "{body}"
    );
    assert_eq!(
        srv.node_view(a.node_id).await["wireguard_public_key"],
        pubkey(sa)
    );
}

/// A credential rotation's body: the key of `secret` and its proof over a fresh challenge.
async fn credential_body(srv: &TestServer, reg: &RegisterResponse, secret: [u8; 32]) -> Value {
    let c = challenge(srv, reg).await;
    let server = plexsphere_wire::key::PublicKey::from_base64(&c.server_public_key).unwrap();
    json!({
        "public_key": public_key(&secret).to_base64(),
        "nonce": c.nonce,
        "proof": plexsphere_wire::proof::prove_credential(&secret, &server, reg.node_id, &c.nonce),
    })
}

async fn rotate_credential(
    srv: &TestServer,
    reg: &RegisterResponse,
    body: &Value,
) -> reqwest::Response {
    srv.node_req(Method::POST, reg, "/credential")
        .json(body)
        .send()
        .await
        .unwrap()
}

/// Issue 24: a node's credential alone (a copied identity.json, a leaked backup) rotated the
/// credential and locked the original out. Now the rotation proves the WireGuard private key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_rotation_without_the_private_key_is_refused() {
    let srv = TestServer::start().await;
    let sa = [41u8; 32];
    let a = enrol_with(&srv, sa).await;
    // An older plexd's empty body, or only the public key: the proof is required.
    let r = rotate_credential(&srv, &a, &json!({})).await;
    let (s, body) = (r.status(), r.json::<Value>().await.unwrap());
    assert_code(s, &body, 422, "proof_required");
    assert!(
        body["message"].as_str().unwrap().contains("upgrade plexd"),
        "{body}"
    );
    // A proof made with another private key for A's public key.
    let mut forged = credential_body(&srv, &a, [42u8; 32]).await;
    forged["public_key"] = pubkey(sa).into();
    let r = rotate_credential(&srv, &a, &forged).await;
    let (s, body) = (r.status(), r.json::<Value>().await.unwrap());
    assert_code(s, &body, 403, "proof_invalid");
    // Another key than the node's (proved by its holder) does not rotate A's credential.
    let other = credential_body(&srv, &a, [43u8; 32]).await;
    let r = rotate_credential(&srv, &a, &other).await;
    let (s, body) = (r.status(), r.json::<Value>().await.unwrap());
    assert_code(s, &body, 403, "proof_invalid");
    // A proof over a made-up nonce.
    let mut stale = credential_body(&srv, &a, sa).await;
    stale["nonce"] = "4102444800.r.0000".into();
    let r = rotate_credential(&srv, &a, &stale).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Nothing changed: the credential is the one registration handed out.
    assert_eq!(srv.heartbeat(&a).await.0, StatusCode::OK);
    assert!(srv.node_view(a.node_id).await["credential_rotated_at"].is_null());
    // The holder of the key rotates.
    let good = credential_body(&srv, &a, sa).await;
    assert_eq!(
        rotate_credential(&srv, &a, &good).await.status(),
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_credential_works_until_the_new_one_is_used_and_its_grace() {
    let srv = TestServer::start().await;
    let sa = [44u8; 32];
    let a = enrol_with(&srv, sa).await;
    let r = rotate_credential(&srv, &a, &credential_body(&srv, &a, sa).await).await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    let fresh = body["node_credential"].as_str().unwrap().to_owned();
    assert_ne!(fresh, a.node_credential);
    assert!(fresh.starts_with(&format!("pxnk_{}_", a.node_id.simple())));
    // Not used yet: the old one is still the credential.
    assert_eq!(srv.heartbeat(&a).await.0, StatusCode::OK);
    assert!(srv.node_view(a.node_id).await["credential_rotated_at"].is_null());
    // The first use of the new one makes it the credential.
    let new = RegisterResponse {
        node_credential: fresh.clone(),
        ..a.clone()
    };
    assert_eq!(srv.heartbeat(&new).await.0, StatusCode::OK);
    assert!(srv.node_view(a.node_id).await["credential_rotated_at"].is_string());
    // The old one keeps working inside its grace (calls sent before the switch).
    assert_eq!(srv.heartbeat(&a).await.0, StatusCode::OK);
    // A second rotation right away is limited.
    let r = rotate_credential(&srv, &new, &credential_body(&srv, &new, sa).await).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().get("retry-after").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_asks_and_the_heartbeat_answer_carries_it_until_the_node_rotated() {
    let srv = TestServer::start().await;
    let s0 = [31u8; 32];
    let a = enrol_with(&srv, s0).await;
    let (_, hb) = srv.heartbeat(&a).await;
    assert!(hb.get("rotate_key").is_none(), "{hb}");
    let r = srv
        .client
        .post(srv.url(&format!("/v1/nodes/{}/rotate-key", a.node_id)))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "an operator token is needed"
    );
    let (s, view) = srv
        .op_post(&format!("/v1/nodes/{}/rotate-key", a.node_id), json!({}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{view}");
    let (s, _) = srv
        .op_post(
            &format!("/v1/nodes/{}/rotate-credential", a.node_id),
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (_, hb) = srv.heartbeat(&a).await;
    assert_eq!(
        (&hb["rotate_key"], &hb["rotate_credential"]),
        (&json!(true), &json!(true))
    );
    let c = challenge(&srv, &a).await;
    let (s, _, body) = rotate(&srv, &a, &request(&a, &c, (s0, s0), ([32; 32], [32; 32]))).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let (_, hb) = srv.heartbeat(&a).await;
    assert!(hb.get("rotate_key").is_none(), "{hb}");
    assert_eq!(hb["rotate_credential"], true);
    let (s, body) = srv
        .op_post(
            "/v1/nodes/019a0816-0000-7000-8000-0000000000ff/rotate-key",
            json!({}),
        )
        .await;
    assert_code(s, &body, 404, "not_found");
}
