//! Roles on a Domain or a Project answer the Domain-wide routes (docs/auth.md "Roles"): a
//! person with the admin role on a Domain changes its DNS suffix and policy and reads its
//! audit chain; a member of one of its projects reads the Domain but changes nothing
//! Domain-wide and reads no audit log. Sessions are bearer sessions (`pxss_...`, what
//! `plexctl login` keeps) put in the store directly: the issuer is tests/tests/auth.rs's.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::operators::call;
use common::*;
use plexsphere::api::Verb;
use plexsphere::auth::session::SessionSecret;
use plexsphere::auth::{Auth, AuthConfig};
use plexsphere::store::{self, projects, roles, sessions};
use reqwest::StatusCode;
use serde_json::json;

fn auth() -> Arc<Auth> {
    Arc::new(
        Auth::new(AuthConfig {
            issuer: "http://127.0.0.1:9".into(),
            client_id: "console".into(),
            client_secret: "s".into(),
            cli_client_id: Some("plexctl".into()),
            groups_claim: "groups".into(),
            scopes: "openid".into(),
            public_origin: "https://localhost".into(),
            session_lifetime: Duration::from_secs(3600),
            session_idle_timeout: Duration::from_secs(3600),
            ca_file: None,
        })
        .unwrap(),
    )
}

/// A bearer session of `subject` in `group`, bound to `role` on `scope` (`domain`/`project`).
async fn person(srv: &TestServer, subject: &str, role: &str, scope: (&str, &str)) -> String {
    let now = store::unix(time::OffsetDateTime::now_utc());
    let secret = SessionSecret::generate().unwrap();
    let mut conn = srv.store.acquire().await.unwrap();
    let row = sessions::SessionRow {
        id: secret.id.clone(),
        secret_sha256: store::secret_digest(&secret.secret),
        kind: "bearer".into(),
        csrf_sha256: None,
        issuer: "http://127.0.0.1:9".into(),
        subject: subject.into(),
        email: None,
        name: None,
        groups: vec![format!("g-{subject}")],
        created_at: now,
        last_seen_at: now,
        expires_at: now + 3600,
        revoked_at: None,
        revoked_reason: None,
    };
    sessions::insert_session(&mut conn, &row).await.unwrap();
    let b = roles::BindingRow {
        id: format!("b-{subject}"),
        role: role.into(),
        scope_kind: scope.0.into(),
        scope_id: scope.1.into(),
        principal_kind: "group".into(),
        principal: format!("g-{subject}"),
        created_at: now,
        created_by: "test".into(),
    };
    roles::insert(&mut conn, &b).await.unwrap();
    secret.expose()
}

#[tokio::test]
async fn a_domain_admin_changes_its_domain_and_a_project_member_does_not() {
    let srv = TestServer::start_with(Options {
        auth: Some(auth()),
        ..Options::default()
    })
    .await;
    let project = LAB_NODES.parse().unwrap();
    let domain = projects::get(&mut srv.store.acquire().await.unwrap(), project)
        .await
        .unwrap()
        .unwrap()
        .domain_id
        .to_string();
    let admin = person(&srv, "dora", "admin", ("domain", &domain)).await;
    let member = person(&srv, "mia", "member", ("project", LAB_NODES)).await;
    let dns = format!("/v1/domains/{domain}/dns");

    let (s, body) = call(
        &srv,
        Verb::Put,
        &dns,
        &admin,
        Some(json!({"suffix": "lab.internal"})),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::OK,
        "a Domain admin sets its DNS suffix: {body}"
    );
    let (s, body) = call(
        &srv,
        Verb::Get,
        &format!("/v1/domains/{domain}/policy"),
        &admin,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let doc = body["document"].as_str().unwrap().to_owned();
    let version = body["version"].as_u64().unwrap();
    let (s, body) = call(
        &srv,
        Verb::Put,
        &format!("/v1/domains/{domain}/policy"),
        &admin,
        Some(json!({"document": doc, "expected_version": version, "dry_run": true})),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::OK,
        "a Domain admin may change its policy: {body}"
    );
    let (s, body) = call(
        &srv,
        Verb::Get,
        &format!("/v1/audit?domain={domain}"),
        &admin,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "a Domain admin reads its chain: {body}");
    assert!(
        body.to_string().contains("dns.set") || body.to_string().contains("lab.internal"),
        "the suffix change is in the Domain's chain: {body}"
    );
    let (s, _) = call(&srv, Verb::Get, "/v1/audit", &admin, None).await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "the platform chain needs a platform role"
    );

    let (s, body) = call(&srv, Verb::Get, "/v1/domains", &member, None).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["items"].as_array().unwrap().len(), 1, "{body}");
    let (s, body) = call(
        &srv,
        Verb::Put,
        &dns,
        &member,
        Some(json!({"suffix": "x.internal"})),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "a project member changes nothing Domain-wide: {body}"
    );
    let (s, _) = call(
        &srv,
        Verb::Get,
        &format!("/v1/audit?domain={domain}"),
        &member,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "a member reads no audit log");
    let (s, body) = call(&srv, Verb::Get, &dns, &member, None).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["suffix"], "lab.internal", "nothing changed: {body}");
    srv.stop().await;
}
