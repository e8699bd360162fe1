//! Operator token expiry, last use, legacy tokens from before scopes, the admin API that
//! manages tokens, and `plexsphere operator-token` on the server host.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::operators::{call, fresh, token};
use common::*;
use plexsphere::api::{self, Verb};
use plexsphere::operator_tokens::{self, Expiry};
use plexsphere::store::{self, operators};
use plexsphere_wire::admin::OperatorScope;
use reqwest::StatusCode;
use serde_json::{Value, json};
use time::{Duration, OffsetDateTime};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_gets_401_saying_so_and_how_to_get_another() {
    let srv = TestServer::start().await;
    let expired = token(
        &srv,
        OperatorScope::Admin,
        None,
        Duration::days(2),
        Expiry::AfterSecs(86_400),
    )
    .await;
    let (s, b) = call(&srv, Verb::Get, "/v1/projects", &expired, None).await;
    assert_code(s, &b, 401, "operator_token_expired");
    let m = b["message"].as_str().unwrap();
    assert!(
        m.contains("expired at") && m.contains("operator-token create"),
        "{m}"
    );
    let alive = token(
        &srv,
        OperatorScope::ReadOnly,
        None,
        Duration::hours(23),
        Expiry::AfterSecs(86_400),
    )
    .await;
    let (s, b) = call(&srv, Verb::Get, "/v1/projects", &alive, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    srv.stop().await;
}

async fn last_used(srv: &TestServer, id: &str) -> Option<i64> {
    let mut c = srv.store.acquire().await.unwrap();
    operators::get(&mut c, id)
        .await
        .unwrap()
        .unwrap()
        .last_used_at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_use_moves_at_most_once_a_minute() {
    let srv = TestServer::start().await;
    let ro = fresh(&srv, OperatorScope::ReadOnly, None).await;
    let id = ro.split('_').nth(1).unwrap().to_owned();
    assert_eq!(last_used(&srv, &id).await, None);
    let (s, me) = call(&srv, Verb::Get, "/v1/operator-tokens/self", &ro, None).await;
    assert_eq!(s, StatusCode::OK, "{me}");
    assert_eq!(me["scope"], "read-only");
    assert_eq!(me["legacy"], false);
    assert!(me["expires_at"].is_string(), "{me}");
    srv.wait_for("the first use to be recorded", async || {
        last_used(&srv, &id).await.is_some()
    })
    .await;
    // A use an hour ago moves to now on the next request.
    let now = store::unix(OffsetDateTime::now_utc());
    let hour_ago = now - 3600;
    let mut c = srv.store.acquire().await.unwrap();
    assert!(
        operators::touch_last_used(&mut c, &id, hour_ago, i64::MAX)
            .await
            .unwrap()
    );
    drop(c);
    let (s, _) = call(&srv, Verb::Get, "/v1/projects", &ro, None).await;
    assert_eq!(s, StatusCode::OK);
    srv.wait_for("the use to move", async || {
        last_used(&srv, &id).await.is_some_and(|t| t >= now)
    })
    .await;
    // Within the minute, the store refuses a second write.
    let mut c = srv.store.acquire().await.unwrap();
    let t = last_used(&srv, &id).await.unwrap();
    let again = t + operator_tokens::LAST_USE_WRITE_EVERY_SECS - 1;
    assert!(
        !operators::touch_last_used(
            &mut c,
            &id,
            again,
            again - operator_tokens::LAST_USE_WRITE_EVERY_SECS
        )
        .await
        .unwrap()
    );
    assert_eq!(last_used(&srv, &id).await, Some(t));
    // whoami shows it.
    let (_, me) = call(&srv, Verb::Get, "/v1/operator-tokens/self", &ro, None).await;
    assert!(me["last_used_at"].is_string(), "{me}");
    srv.stop().await;
}

/// A token from before scopes (NULL scope after migration 0008) keeps working as admin with no
/// expiry, and every listing flags it as legacy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_token_keeps_admin_and_is_listed_as_legacy() {
    let dir = tempfile::tempdir().unwrap();
    let url = store::Store::sqlite_url(dir.path());
    let st = store::Store::connect(&url).await.unwrap();
    // The schema of version 7, and a token as that version wrote it.
    let full = store::migrator();
    let v7 = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(full.migrations[..7].to_vec()),
        ..store::migrator()
    };
    v7.run(st.pool()).await.unwrap();
    let legacy = plexsphere_wire::secret::OperatorToken::generate().unwrap();
    sqlx::query(
        "INSERT INTO operator_tokens (id, name, secret_sha256, created_at, revoked_at) VALUES ($1, 'old', $2, 1, NULL)",
    )
    .bind(legacy.id.clone())
    .bind(store::secret_digest(&legacy.secret))
    .execute(st.pool())
    .await
    .unwrap();
    st.migrate().await.unwrap();
    let rows = operator_tokens::list(&st).await.unwrap();
    let v = operator_tokens::view(&rows[0], store::unix(OffsetDateTime::now_utc())).unwrap();
    assert!(v.legacy);
    assert_eq!(v.scope, OperatorScope::Admin);
    assert_eq!(v.expires_at, None);
    st.close().await;

    // And over the API on a running server: admin routes work, the listing flags it.
    let srv = TestServer::start().await;
    let legacy = plexsphere_wire::secret::OperatorToken::generate().unwrap();
    let mut c = srv.store.acquire().await.unwrap();
    operators::insert(
        &mut c,
        &operators::OperatorRow {
            id: legacy.id.clone(),
            name: "old".into(),
            secret_sha256: store::secret_digest(&legacy.secret),
            created_at: 1,
            revoked_at: None,
            scope: None,
            project_id: None,
            expires_at: None,
            last_used_at: None,
        },
    )
    .await
    .unwrap();
    drop(c);
    let (s, b) = call(
        &srv,
        Verb::Get,
        "/v1/operator-tokens",
        &legacy.expose(),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let row = b["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == legacy.id.as_str())
        .unwrap()
        .clone();
    assert_eq!(row["legacy"], true);
    assert_eq!(row["scope"], "admin");
    assert_eq!(row["expires_at"], Value::Null);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_creates_and_revokes_scoped_tokens_through_the_api() {
    let srv = TestServer::start().await;
    let (s, b) = srv
        .op_post(
            "/v1/operator-tokens",
            json!({"name": "ci", "scope": "read-only", "project_id": LAB_NODES, "expires_in": "30d"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(b["scope"], "read-only");
    assert_eq!(b["project_id"], LAB_NODES);
    let created = OffsetDateTime::parse(
        b["created_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let expires = OffsetDateTime::parse(
        b["expires_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    assert_eq!(expires - created, Duration::days(30));
    let ci = b["token"].as_str().unwrap().to_owned();
    let (s, me) = call(&srv, Verb::Get, "/v1/operator-tokens/self", &ci, None).await;
    assert_eq!(s, StatusCode::OK, "{me}");
    assert_eq!(me["id"], b["id"]);
    assert!(me.get("token").is_none(), "{me}");
    // Only admin tokens may never expire, and admin tokens are never project-bound.
    let (s, b2) = srv
        .op_post(
            "/v1/operator-tokens",
            json!({"name": "x", "scope": "operator", "expires_in": "never"}),
        )
        .await;
    assert_code(s, &b2, 422, "invalid_request");
    let (s, b2) = srv
        .op_post(
            "/v1/operator-tokens",
            json!({"name": "x", "scope": "admin", "project_id": LAB_NODES}),
        )
        .await;
    assert_code(s, &b2, 422, "invalid_request");
    let (s, b2) = srv
        .op_post(
            "/v1/operator-tokens",
            json!({"name": "x", "scope": "operator", "expires_in": "400d"}),
        )
        .await;
    assert_code(s, &b2, 422, "invalid_request");
    let (s, rev) = srv
        .op_post(
            &format!("/v1/operator-tokens/{}/revoke", b["id"].as_str().unwrap()),
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{rev}");
    assert_eq!(rev["status"], "revoked");
    let (s, b3) = call(&srv, Verb::Get, "/v1/operator-tokens/self", &ci, None).await;
    assert_code(s, &b3, 401, "unauthorized");
    srv.stop().await;
}

/// A route served without a scope from the table is refused, never served unscoped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_without_a_scope_is_refused() {
    use axum::extract::FromRequestParts as _;
    let srv = TestServer::start().await;
    let admin = format!("Bearer {}", srv.operator_token);
    let req = axum::http::Request::builder()
        .uri("/v1/unscoped")
        .header("authorization", admin)
        .body(())
        .unwrap();
    let (mut parts, ()) = req.into_parts();
    let refused = api::extract::Operator::from_request_parts(&mut parts, &srv.state).await;
    assert!(
        matches!(&refused, Err(plexsphere::error::Error::Internal(m)) if m.contains("no scope")),
        "{refused:?}"
    );
    parts
        .extensions
        .insert(api::extract::RouteScope(api::Need::Admin));
    assert!(
        api::extract::Operator::from_request_parts(&mut parts, &srv.state)
            .await
            .is_ok()
    );
    srv.stop().await;
}

/// `plexsphere operator-token create|list` on the server host: scope, project (by slug) and
/// expiry are stored and listed; what the rules refuse exits 64 with the rule.
#[test]
fn the_server_cli_creates_scoped_tokens_and_refuses_what_the_rules_forbid() {
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("seed.yaml");
    std::fs::write(&seed, plexsphere::seed::LAB_SEED).unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_plexsphere"))
            .env("PLEXSPHERE_NO_LOCAL_MACHINES", "1")
            .args(args)
            .arg("--data-dir")
            .arg(dir.path())
            .output()
            .unwrap()
    };
    assert!(
        run(&["seed", "apply", "--file", seed.to_str().unwrap()])
            .status
            .success()
    );
    let out = run(&[
        "operator-token",
        "create",
        "--name",
        "graf",
        "--scope",
        "read-only",
        "--project",
        "lab-nodes",
        "--expires-in",
        "30d",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .split('_')
        .nth(1)
        .unwrap()
        .to_owned();
    let out = run(&["operator-token", "list"]);
    let listing = String::from_utf8(out.stdout).unwrap();
    let row = listing.lines().find(|l| l.starts_with(&id)).unwrap();
    assert!(
        row.contains("read-only") && row.contains(LAB_NODES) && row.contains("active"),
        "{listing}"
    );
    assert!(!row.contains("never"), "{row}");
    for (args, says) in [
        (
            &["--scope", "operator", "--expires-in", "never"][..],
            "only an admin token may never expire",
        ),
        (
            &["--scope", "admin", "--project", "lab-nodes"][..],
            "cannot be limited to a project",
        ),
        (&["--expires-in", "2y"][..], "has the unknown unit `y`"),
        (&["--project", "nope"][..], "names no project"),
    ] {
        let mut all = vec!["operator-token", "create", "--name", "x"];
        all.extend_from_slice(args);
        let out = run(&all);
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
