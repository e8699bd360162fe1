//! `POST /v1/register` against the real server: happy path, replay, races, IPAM, refusals.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::collections::HashSet;
use std::net::IpAddr;

use common::*;
use ipnet::IpNet;
use plexsphere::store::tokens;
use plexsphere_wire::RegisterResponse;
use plexsphere_wire::admin::TokenStatus;
use reqwest::StatusCode;
use sqlx::Row as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn happy_path_stores_only_a_digest_and_consumes_the_token() {
    let srv = TestServer::start().await;
    let issued = srv.issue_token(LAB_NODES).await;
    assert!(issued.token.starts_with("pxbt_lab_node_"));
    let mut body = register_body(&issued.token, &wg_key(1));
    body["project_id"] = LAB_NODES.into();
    body["resource_handle"] = "web-1".into();
    let (status, json) = srv.register(&body).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    let r: RegisterResponse = serde_json::from_value(json).unwrap();
    assert_eq!(r.project_id.to_string(), LAB_NODES);
    assert_eq!(r.mesh_cidr.to_string(), "10.64.0.0/16");
    assert!(r.mesh_cidr.contains(&r.mesh_ip));
    // Domain-range Projects stay out of the openstack sub-range.
    assert!(
        !"10.64.1.0/24"
            .parse::<IpNet>()
            .unwrap()
            .contains(&r.mesh_ip)
    );
    assert_eq!(r.mesh_ip.to_string(), "10.64.0.1");
    assert!(
        r.node_credential
            .starts_with(&format!("pxnk_{}_", r.node_id.simple()))
    );
    assert_eq!(r.intervals, plexsphere_wire::Intervals::default());
    assert_eq!(r.domain_signing_public_key.len(), 44);

    // No column of any row holds the credential's text or its secret.
    // The whole secret part, as the server parses it: its base64url text may itself hold '_'.
    let secret = plexsphere_wire::secret::NodeCredential::parse(&r.node_credential)
        .unwrap()
        .secret
        .expose()
        .to_owned();
    let row = sqlx::query("SELECT * FROM nodes WHERE id = $1")
        .bind(r.node_id.to_string())
        .fetch_one(srv.store.pool())
        .await
        .unwrap();
    let cred_digest: String = row.try_get("credential_sha256").unwrap();
    assert_eq!(cred_digest.len(), 64);
    for i in 0..row.len() {
        if let Ok(Some(v)) = row.try_get::<Option<String>, _>(i) {
            assert!(
                !v.contains(&secret) && !v.contains(&r.node_credential),
                "column {i} holds the credential"
            );
        }
    }

    let tokens = srv.tokens(LAB_NODES).await;
    let t = tokens.iter().find(|t| t.id == issued.id).unwrap();
    assert_eq!(t.status, TokenStatus::Consumed);
    assert_eq!(t.consumed_by_node, Some(r.node_id));

    let (status, node) = srv.op_get(&format!("/v1/nodes/{}", r.node_id)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(node["mesh_ip"], "10.64.0.1");
    assert_eq!(node["resource_handle"], "web-1");
    assert_eq!(node["status"], "registered");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_by_the_same_key_gets_the_same_node_and_another_key_is_refused() {
    let srv = TestServer::start().await;
    let issued = srv.issue_token(OPENSTACK).await;
    let (s1, first) = srv
        .register(&register_body(&issued.token, &wg_key(1)))
        .await;
    assert_eq!(s1, StatusCode::CREATED);
    assert_eq!(first["mesh_ip"], "10.64.1.1");
    let (s2, again) = srv
        .register(&register_body(&issued.token, &wg_key(1)))
        .await;
    assert_eq!(s2, StatusCode::OK, "{again}");
    assert_eq!(again["node_id"], first["node_id"]);
    assert_eq!(again["mesh_ip"], first["mesh_ip"]);
    assert_ne!(
        again["node_credential"], first["node_credential"],
        "a replay issues a fresh credential"
    );
    let (s3, other) = srv
        .register(&register_body(&issued.token, &wg_key(2)))
        .await;
    assert_code(s3, &other, 403, "token_consumed");

    // Once the node has authenticated, even the same key is refused.
    let id: uuid::Uuid = first["node_id"].as_str().unwrap().parse().unwrap();
    let mut conn = srv.store.pool().acquire().await.unwrap();
    plexsphere::store::nodes::touch_last_seen(&mut conn, id, 1)
        .await
        .unwrap();
    drop(conn);
    let (s4, late) = srv
        .register(&register_body(&issued.token, &wg_key(1)))
        .await;
    assert_code(s4, &late, 403, "token_consumed");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_racing_registrations_on_one_token_make_one_node() {
    let srv = std::sync::Arc::new(TestServer::start().await);
    let issued = srv.issue_token(LAB_NODES).await;
    let mut tasks = Vec::new();
    for i in 0..50u32 {
        let srv = srv.clone();
        let token = issued.token.clone();
        let key_a = i % 2 == 0;
        tasks.push(tokio::spawn(async move {
            let key = if key_a { wg_key(1) } else { wg_key(1000 + i) };
            let (s, b) = srv.register(&register_body(&token, &key)).await;
            (key_a, s, b)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let count: i64 = sqlx::query("SELECT COUNT(*) AS n FROM nodes")
        .fetch_one(srv.store.pool())
        .await
        .unwrap()
        .try_get("n")
        .unwrap();
    assert_eq!(count, 1, "exactly one node exists");
    let row = sqlx::query("SELECT id, wireguard_public_key FROM nodes")
        .fetch_one(srv.store.pool())
        .await
        .unwrap();
    let node_id: String = row.try_get("id").unwrap();
    let winner_key: String = row.try_get("wireguard_public_key").unwrap();
    // Whoever won the race owns the token: every request with the winner's key answers that
    // node (one 201, the rest 200 replays); every other key gets 403 token_consumed. Half
    // the requests carry key A, so when A won, all 25 of them succeed.
    let a_won = winner_key == wg_key(1);
    let mut created = 0;
    let mut succeeded = 0;
    for (key_a, status, body) in &results {
        if status.is_success() {
            assert_eq!(body["node_id"], node_id.as_str(), "{body}");
            created += usize::from(*status == StatusCode::CREATED);
            succeeded += 1;
            if a_won {
                assert!(*key_a, "a key other than the winner's succeeded: {body}");
            }
        } else {
            assert_code(*status, body, 403, "token_consumed");
            assert!(
                !(a_won && *key_a),
                "a replay by the winner's key was refused: {body}"
            );
        }
    }
    assert_eq!(created, 1, "exactly one answer is the creation");
    assert_eq!(succeeded, if a_won { 25 } else { 1 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_nodes_get_unique_addresses_until_the_sub_range_is_exhausted() {
    let srv = std::sync::Arc::new(TestServer::start().await);
    let sub: IpNet = "10.64.1.0/24".parse().unwrap();
    let domain: IpNet = "10.64.0.0/16".parse().unwrap();
    let mut plan = Vec::new();
    for i in 0..300u32 {
        let project = if i < 250 { OPENSTACK } else { LAB_NODES };
        plan.push((project, srv.issue_token(project).await.token, i));
    }
    let mut tasks = Vec::new();
    for (project, token, i) in plan {
        let srv = srv.clone();
        tasks.push(tokio::spawn(async move {
            let (s, b) = srv.register(&register_body(&token, &wg_key(i))).await;
            assert_eq!(s, StatusCode::CREATED, "{b}");
            let r: RegisterResponse = serde_json::from_value(b).unwrap();
            (project, r.mesh_ip)
        }));
    }
    let mut seen: HashSet<IpAddr> = HashSet::new();
    for t in tasks {
        let (project, ip) = t.await.unwrap();
        assert!(seen.insert(ip), "{ip} handed out twice");
        assert_ne!(ip, "10.64.1.0".parse::<IpAddr>().unwrap());
        assert_ne!(ip, "10.64.1.255".parse::<IpAddr>().unwrap());
        if project == OPENSTACK {
            assert!(sub.contains(&ip), "{ip} outside {sub}");
        } else {
            assert!(
                domain.contains(&ip) && !sub.contains(&ip),
                "{ip} must be in {domain} and outside {sub}"
            );
            assert_ne!(ip, "10.64.0.0".parse::<IpAddr>().unwrap());
        }
    }
    assert_eq!(seen.len(), 300);
    // 250 of 254 hosts are taken: four more fit, the fifth finds the range exhausted.
    for i in 0..4u32 {
        let token = srv.issue_token(OPENSTACK).await.token;
        let (s, b) = srv
            .register(&register_body(&token, &wg_key(5000 + i)))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    let token = srv.issue_token(OPENSTACK).await;
    let (s, b) = srv
        .register(&register_body(&token.token, &wg_key(6000)))
        .await;
    assert_code(s, &b, 409, "mesh_range_exhausted");
    assert!(
        b["message"].as_str().unwrap().contains("10.64.1.0/24"),
        "{b}"
    );
    // The refused registration consumed nothing.
    let t = srv
        .tokens(OPENSTACK)
        .await
        .into_iter()
        .find(|t| t.id == token.id)
        .unwrap();
    assert_eq!(t.status, TokenStatus::Active);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_carry_exact_statuses_and_codes() {
    let srv = TestServer::start().await;

    // Expired: move the token's expiry into the past through the store.
    let expired = srv.issue_token(LAB_NODES).await;
    let mut conn = srv.store.pool().acquire().await.unwrap();
    assert!(
        tokens::set_expires_at(&mut conn, &expired.id, 1)
            .await
            .unwrap()
    );
    drop(conn);
    let (s, b) = srv
        .register(&register_body(&expired.token, &wg_key(1)))
        .await;
    assert_code(s, &b, 401, "token_expired");

    // Revoked.
    let revoked = srv.issue_token(LAB_NODES).await;
    let (s, b) = srv
        .op_post(
            &format!("/v1/bootstrap-tokens/{}/revoke", revoked.id),
            serde_json::json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["status"], "revoked");
    let (s, b) = srv
        .register(&register_body(&revoked.token, &wg_key(1)))
        .await;
    assert_code(s, &b, 403, "token_revoked");

    // Wrong project.
    let t = srv.issue_token(LAB_NODES).await;
    let mut body = register_body(&t.token, &wg_key(1));
    body["project_id"] = OPENSTACK.into();
    let (s, b) = srv.register(&body).await;
    assert_code(s, &b, 403, "project_mismatch");

    // Unknown token: well-formed but never issued, and a malformed text.
    let unknown = format!("pxbt_lab_node_0123456789abcdef_{}", "A".repeat(43));
    let (s, b) = srv.register(&register_body(&unknown, &wg_key(1))).await;
    assert_code(s, &b, 401, "token_unknown");
    let (s, b) = srv.register(&register_body("hello", &wg_key(1))).await;
    assert_code(s, &b, 401, "token_unknown");
    // A known id with a wrong secret.
    let forged = format!("pxbt_lab_node_{}_{}", t.id, "B".repeat(43));
    let (s, b) = srv.register(&register_body(&forged, &wg_key(1))).await;
    assert_code(s, &b, 401, "token_unknown");

    // Bad WireGuard key, bad arch.
    let (s, b) = srv.register(&register_body(&t.token, "c2hvcnQ=")).await;
    assert_code(s, &b, 422, "invalid_request");
    let mut body = register_body(&t.token, &wg_key(1));
    body["arch"] = "riscv64".into();
    let (s, b) = srv.register(&body).await;
    assert_code(s, &b, 422, "invalid_request");

    let post = |body: Vec<u8>, ctype: Option<&'static str>| {
        let mut req = srv.client.post(srv.url("/v1/register")).body(body);
        if let Some(c) = ctype {
            req = req.header("content-type", c);
        }
        req.send()
    };
    let json = |r: reqwest::Response| async move {
        let s = r.status();
        let body: serde_json::Value = r.json().await.unwrap();
        (s, body)
    };
    // Malformed JSON.
    let (s, b) = json(
        post(b"{not json".to_vec(), Some("application/json"))
            .await
            .unwrap(),
    )
    .await;
    assert_code(s, &b, 400, "invalid_json");
    // Unknown field.
    let mut body = register_body(&t.token, &wg_key(1));
    body["projectid"] = "x".into();
    let (s, b) = json(
        post(body.to_string().into_bytes(), Some("application/json"))
            .await
            .unwrap(),
    )
    .await;
    assert_code(s, &b, 400, "invalid_json");
    assert!(b["message"].as_str().unwrap().contains("projectid"), "{b}");
    // Wrong type.
    let mut body = register_body(&t.token, &wg_key(1));
    body["hostname"] = 7.into();
    let (s, b) = json(
        post(body.to_string().into_bytes(), Some("application/json"))
            .await
            .unwrap(),
    )
    .await;
    assert_code(s, &b, 400, "invalid_json");
    // Missing content type.
    let body = register_body(&t.token, &wg_key(1)).to_string().into_bytes();
    let (s, b) = json(post(body.clone(), None).await.unwrap()).await;
    assert_code(s, &b, 415, "unsupported_media_type");
    let (s, b) = json(post(body, Some("text/plain")).await.unwrap()).await;
    assert_code(s, &b, 415, "unsupported_media_type");
    // Oversized body.
    let mut big = register_body(&t.token, &wg_key(1));
    big["hostname"] = "a".repeat(20 * 1024).into();
    let (s, b) = json(
        post(big.to_string().into_bytes(), Some("application/json"))
            .await
            .unwrap(),
    )
    .await;
    assert_code(s, &b, 413, "body_too_large");

    // None of the refusals consumed the token: it still registers.
    let (s, b) = srv.register(&register_body(&t.token, &wg_key(1))).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    srv.stop().await;
}
