//! Operator authentication and the operator endpoints' edges.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::Value;

async fn get_with(srv: &TestServer, path: &str, auth: Option<&str>) -> (StatusCode, Value) {
    let mut req = srv.client.get(srv.url(path));
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let r = req.send().await.unwrap();
    (r.status(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_auth_refuses_missing_bad_and_revoked_tokens() {
    let srv = TestServer::start().await;
    let (s, b) = get_with(&srv, "/v1/projects", None).await;
    assert_code(s, &b, 401, "unauthorized");
    let (s, b) = get_with(&srv, "/v1/projects", Some("Bearer nonsense")).await;
    assert_code(s, &b, 401, "unauthorized");
    let forged = format!("Bearer pxop_{}", "0".repeat(16) + "_" + &"A".repeat(43));
    let (s, b) = get_with(&srv, "/v1/projects", Some(&forged)).await;
    assert_code(s, &b, 401, "unauthorized");
    // The right id with a wrong secret.
    let id = srv.operator_token.split('_').nth(1).unwrap();
    let wrong = format!("Bearer pxop_{id}_{}", "B".repeat(43));
    let (s, b) = get_with(&srv, "/v1/projects", Some(&wrong)).await;
    assert_code(s, &b, 401, "unauthorized");
    let good = format!("Bearer {}", srv.operator_token);
    let (s, b) = get_with(&srv, "/v1/projects", Some(&good)).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["items"].as_array().unwrap().len(), 2);
    // Revoked.
    assert!(
        plexsphere::operator_tokens::revoke(&srv.store, id, time::OffsetDateTime::now_utc())
            .await
            .unwrap()
    );
    let (s, b) = get_with(&srv, "/v1/projects", Some(&good)).await;
    assert_code(s, &b, 401, "unauthorized");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_queries_and_public_endpoints() {
    let srv = TestServer::start().await;
    let (s, b) = srv.op_get("/v1/nodes/not-a-uuid").await;
    assert_code(s, &b, 400, "invalid_request");
    let (s, b) = srv.op_get("/v1/projects/123/bootstrap-tokens").await;
    assert_code(s, &b, 400, "invalid_request");
    let (s, b) = srv.op_get("/v1/nodes?project_id=zzz").await;
    assert_code(s, &b, 400, "invalid_request");
    let (s, b) = srv
        .op_get("/v1/nodes/019a0816-0000-7000-8000-0000000000ff")
        .await;
    assert_code(s, &b, 404, "not_found");
    let (s, b) = srv
        .op_get("/v1/projects/019a0816-0000-7000-8000-0000000000ff/bootstrap-tokens")
        .await;
    assert_code(s, &b, 404, "not_found");
    let (s, b) = srv
        .op_post(
            "/v1/bootstrap-tokens/0123456789abcdef/revoke",
            serde_json::json!({}),
        )
        .await;
    assert_code(s, &b, 404, "not_found");
    let (s, b) = srv
        .op_post(
            &format!("/v1/projects/{LAB_NODES}/bootstrap-tokens"),
            serde_json::json!({"kind": "node", "env_prefix": "LAB", "ttl_secs": 3600}),
        )
        .await;
    assert_code(s, &b, 422, "invalid_request");
    let (s, b) = srv
        .op_post(
            &format!("/v1/projects/{LAB_NODES}/bootstrap-tokens"),
            serde_json::json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 5}),
        )
        .await;
    assert_code(s, &b, 422, "invalid_request");

    // A token lives at least the TTL asked for, counted from when it was issued: its expiry is
    // never cut down to the whole second before (a 60 s token used to live 59.26 s).
    for _ in 0..3 {
        let asked = time::OffsetDateTime::now_utc();
        let (s, b) = srv
            .op_post(
                &format!("/v1/projects/{LAB_NODES}/bootstrap-tokens"),
                serde_json::json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 60}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        let answered = time::OffsetDateTime::now_utc();
        let expires = time::OffsetDateTime::parse(
            b["expires_at"].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap();
        let at_least = asked + time::Duration::seconds(60);
        let at_most = answered + time::Duration::seconds(61);
        assert!(
            expires >= at_least && expires < at_most,
            "asked at {asked}, expires at {expires}"
        );
    }

    // Revoking a consumed token is a conflict; revoking twice is fine.
    let used = srv.issue_token(LAB_NODES).await;
    let (s, _) = srv.register(&register_body(&used.token, &wg_key(9))).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, b) = srv
        .op_post(
            &format!("/v1/bootstrap-tokens/{}/revoke", used.id),
            serde_json::json!({}),
        )
        .await;
    assert_code(s, &b, 409, "conflict");
    let fresh = srv.issue_token(LAB_NODES).await;
    for _ in 0..2 {
        let (s, b) = srv
            .op_post(
                &format!("/v1/bootstrap-tokens/{}/revoke", fresh.id),
                serde_json::json!({}),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        assert_eq!(b["status"], "revoked");
    }

    // Node listing by project.
    let (s, b) = srv
        .op_get(&format!("/v1/nodes?project_id={LAB_NODES}"))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["items"].as_array().unwrap().len(), 1);
    let (s, b) = srv
        .op_get(&format!("/v1/nodes?project_id={OPENSTACK}"))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert!(b["items"].as_array().unwrap().is_empty());
    let (s, b) = srv.op_get("/v1/domains").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["items"][0]["slug"], "lab");
    assert_eq!(
        b["items"][0]["signing_public_key"].as_str().unwrap().len(),
        44
    );

    // Public endpoints.
    let r = srv.client.get(srv.url("/v1/version")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["name"], "plexsphere");
    let r = srv.client.get(srv.url("/v1/ca.crt")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.text()
            .await
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE-----")
    );
    let r = srv.client.get(srv.url("/v1/nope")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["code"], "not_found");
    srv.stop().await;
}
