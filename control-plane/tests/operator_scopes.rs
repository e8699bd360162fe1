//! Operator token scopes, project binding, expiry and last use, walked over the one route
//! table the router is built from (`api::route_table`): every operator route is called with a
//! token of every scope over real TLS, against SQLite (and Postgres when one is configured).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::broker::{bucket_request, credential, phase};
use common::*;
use plexsphere::api::{self, Access, Verb};
use plexsphere::operator_tokens::{self, Expiry, TokenSpec};
use plexsphere::store::{self, operators};
use plexsphere_wire::admin::OperatorScope;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use time::{Duration, OffsetDateTime};
use uuid::Uuid;

/// A token of `scope` (for every project unless `project`), made `age` ago, valid for `life`.
async fn token(
    srv: &TestServer,
    scope: OperatorScope,
    project: Option<&str>,
    age: Duration,
    life: Expiry,
) -> String {
    let spec = TokenSpec {
        name: format!("test-{}", scope.as_str()),
        scope,
        project_id: project.map(|p| Uuid::parse_str(p).unwrap()),
        expiry: life,
    };
    operator_tokens::create_scoped(&srv.store, &spec, OffsetDateTime::now_utc() - age)
        .await
        .unwrap()
        .0
        .expose()
}

async fn fresh(srv: &TestServer, scope: OperatorScope, project: Option<&str>) -> String {
    token(srv, scope, project, Duration::ZERO, Expiry::AfterSecs(3600)).await
}

async fn call(
    srv: &TestServer,
    verb: Verb,
    path: &str,
    bearer: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let method = Method::from_bytes(verb.as_str().as_bytes()).unwrap();
    let mut req = srv
        .client
        .request(method, srv.url(path))
        .bearer_auth(bearer);
    if let Some(b) = body {
        req = req.json(&b);
    } else if verb != Verb::Get && verb != Verb::Delete {
        req = req.json(&json!({}));
    }
    let r = req.send().await.unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The path of a table row with its parameters filled in: the lab project, ids nothing has.
fn fill(path: &str) -> String {
    let missing_uuid = "019a0816-0000-7000-8000-0000000000ff";
    let missing_hex = "0123456789abcdef";
    let id = if path.starts_with("/v1/operator-tokens") {
        missing_hex
    } else {
        missing_uuid
    };
    path.replace("{project_id}", LAB_NODES)
        .replace("{node_id}", missing_uuid)
        .replace("{token_id}", missing_hex)
        .replace("{id}", id)
}

#[test]
fn every_route_has_an_access_and_only_reads_are_open_to_read_only() {
    let table = api::route_table();
    let mut seen = std::collections::HashSet::new();
    for r in &table {
        assert!(seen.insert((r.verb, r.path)), "{r:?} is in the table twice");
        if let Access::Operator(scope) = r.access
            && !r.verb.reads_only()
        {
            assert!(
                scope > OperatorScope::ReadOnly,
                "{r:?} writes but is open to read-only"
            );
        }
        if r.access == Access::Node {
            assert!(r.path.starts_with("/v1/nodes/{node_id}"), "{r:?}");
        }
    }
    // A new public route is a decision, not an accident.
    let public: Vec<_> = table
        .iter()
        .filter(|r| r.access == Access::Public)
        .map(|r| (r.verb.as_str(), r.path))
        .collect();
    assert_eq!(
        public,
        [
            ("GET", "/v1/version"),
            ("GET", "/v1/ca.crt"),
            ("POST", "/v1/register")
        ]
    );
    let admin: Vec<_> = table
        .iter()
        .filter(|r| r.access == api::ADMIN)
        .map(|r| r.path)
        .collect();
    assert!(admin.contains(&"/v1/operator-tokens"), "{admin:?}");
    assert!(admin.contains(&"/v1/cloud-credentials"), "{admin:?}");
}

/// docs/api.md lists the same rows as the code, row for row.
#[test]
fn the_docs_scope_table_agrees_with_the_route_table() {
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api.md")).unwrap();
    let section = docs
        .split("### Operator token scopes")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    let rows: Vec<String> = section
        .lines()
        .filter(|l| l.starts_with("| `") && l.contains(" /v1/"))
        .map(str::to_owned)
        .collect();
    let table = api::route_table();
    let operator_routes: Vec<_> = table
        .iter()
        .filter_map(|r| match r.access {
            Access::Operator(s) => Some((r, s)),
            _ => None,
        })
        .collect();
    for (r, scope) in &operator_routes {
        let want = format!("| `{} {}` | {} |", r.verb.as_str(), r.path, scope.as_str());
        assert!(
            rows.iter().any(|l| l.starts_with(&want)),
            "docs/api.md has no row starting {want}"
        );
    }
    assert_eq!(rows.len(), operator_routes.len(), "{rows:#?}");
}

async fn walk_every_operator_route(srv: &TestServer) {
    let mut tokens = Vec::new();
    for scope in OperatorScope::ALL {
        tokens.push((scope, fresh(srv, scope, None).await));
    }
    let mut checked = 0;
    for r in api::route_table() {
        let Access::Operator(need) = r.access else {
            continue;
        };
        let path = fill(r.path);
        for (have, bearer) in &tokens {
            let (status, body) = call(srv, r.verb, &path, bearer, None).await;
            let what = format!("{} {path} with a {} token", r.verb.as_str(), have.as_str());
            if *have < need {
                assert_eq!(status, StatusCode::FORBIDDEN, "{what}: {body}");
                assert_eq!(body["code"], "insufficient_scope", "{what}: {body}");
                assert!(
                    body["message"].as_str().unwrap().contains(need.as_str()),
                    "{what}: {body}"
                );
            } else {
                assert!(
                    !matches!(status.as_u16(), 401 | 403 | 500..),
                    "{what} was refused: {status} {body}"
                );
                if r.verb.reads_only() && *have == OperatorScope::ReadOnly {
                    assert!(
                        matches!(status.as_u16(), 200 | 404),
                        "{what}: {status} {body}"
                    );
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 3 * 20, "only {checked} calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operator_route_answers_each_scope_as_the_table_says() {
    let srv = TestServer::start().await;
    walk_every_operator_route(&srv).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operator_route_answers_each_scope_as_the_table_says_on_postgres() {
    let Some(srv) = postgres::server().await else {
        return;
    };
    walk_every_operator_route(&srv).await;
    srv.stop().await;
}

/// A read-only token's writes are refused before anything is stored: the objects are still
/// there and unchanged afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_token_changes_nothing() {
    let srv = TestServer::start().await;
    let ro = fresh(&srv, OperatorScope::ReadOnly, None).await;
    let node = srv.enrol(LAB_NODES).await;
    let bt = srv.issue_token(LAB_NODES).await;
    let before = srv.tokens(LAB_NODES).await.len();
    let (s, b) = call(
        &srv,
        Verb::Post,
        &format!("/v1/projects/{LAB_NODES}/bootstrap-tokens"),
        &ro,
        Some(json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 3600})),
    )
    .await;
    assert_code(s, &b, 403, "insufficient_scope");
    let (s, b) = call(
        &srv,
        Verb::Post,
        &format!("/v1/bootstrap-tokens/{}/revoke", bt.id),
        &ro,
        None,
    )
    .await;
    assert_code(s, &b, 403, "insufficient_scope");
    let (s, b) = call(
        &srv,
        Verb::Post,
        &format!("/v1/nodes/{}/revoke", node.node_id),
        &ro,
        None,
    )
    .await;
    assert_code(s, &b, 403, "insufficient_scope");
    let tokens = srv.tokens(LAB_NODES).await;
    assert_eq!(tokens.len(), before);
    assert!(tokens.iter().all(|t| t.revoked_at.is_none()));
    let (s, view) = srv.op_get(&format!("/v1/nodes/{}", node.node_id)).await;
    assert_eq!(s, StatusCode::OK);
    assert_ne!(view["status"], "revoked", "{view}");
    // And its reads work.
    let (s, b) = call(&srv, Verb::Get, "/v1/nodes", &ro, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["items"].as_array().unwrap().len(), 1);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_bound_token_neither_sees_nor_changes_another_project() {
    let srv = TestServer::start().await;
    let mine = srv.enrol(LAB_NODES).await;
    let theirs = srv.enrol(OPENSTACK).await;
    let their_bt = srv.issue_token(OPENSTACK).await;
    let cred = credential(&srv, "local").await;
    let (s, their_res) = srv
        .op_post(
            &format!("/v1/projects/{OPENSTACK}/resources"),
            bucket_request(&cred, json!({"region": "us-east-1"})),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{their_res}");
    let their_res = their_res["id"].as_str().unwrap().to_owned();
    let bound = fresh(&srv, OperatorScope::Operator, Some(LAB_NODES)).await;
    let get = async |path: &str| call(&srv, Verb::Get, path, &bound, None).await;
    let post =
        async |path: &str, body: Option<Value>| call(&srv, Verb::Post, path, &bound, body).await;

    // Listings are filtered to its project.
    let (s, b) = get("/v1/projects").await;
    assert_eq!(s, StatusCode::OK);
    let ids: Vec<_> = b["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].clone())
        .collect();
    assert_eq!(ids, [json!(LAB_NODES)]);
    let (s, b) = get("/v1/domains").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["items"].as_array().unwrap().len(), 1);
    let (_, b) = get("/v1/nodes").await;
    let ids: Vec<_> = b["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].clone())
        .collect();
    assert_eq!(ids, [json!(mine.node_id)]);
    let (s, b) = get(&format!("/v1/nodes?project_id={OPENSTACK}")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["items"], json!([]));

    // Another project's objects answer 404, as if they did not exist.
    for path in [
        format!("/v1/nodes/{}", theirs.node_id),
        format!("/v1/nodes/{}/observations", theirs.node_id),
        format!("/v1/projects/{OPENSTACK}/bootstrap-tokens"),
        format!("/v1/projects/{OPENSTACK}/resources"),
        format!("/v1/resources/{their_res}"),
    ] {
        let (s, b) = get(&path).await;
        assert_code(s, &b, 404, "not_found");
    }
    let (s, b) = post(&format!("/v1/nodes/{}/revoke", theirs.node_id), None).await;
    assert_code(s, &b, 404, "not_found");
    let (s, b) = post(
        &format!("/v1/bootstrap-tokens/{}/revoke", their_bt.id),
        None,
    )
    .await;
    assert_code(s, &b, 404, "not_found");
    let (s, b) = post(
        &format!("/v1/projects/{OPENSTACK}/bootstrap-tokens"),
        Some(json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 3600})),
    )
    .await;
    assert_code(s, &b, 404, "not_found");
    let (s, b) = post(
        &format!("/v1/projects/{OPENSTACK}/resources"),
        Some(bucket_request(&cred, json!({"region": "us-east-1"}))),
    )
    .await;
    assert_code(s, &b, 404, "not_found");
    let (s, b) = call(
        &srv,
        Verb::Delete,
        &format!("/v1/resources/{their_res}"),
        &bound,
        None,
    )
    .await;
    assert_code(s, &b, 404, "not_found");

    // Nothing of theirs changed.
    let (_, node) = srv.op_get(&format!("/v1/nodes/{}", theirs.node_id)).await;
    assert_ne!(node["status"], "revoked", "{node}");
    let tokens = srv.tokens(OPENSTACK).await;
    assert!(tokens.iter().all(|t| t.revoked_at.is_none()), "{tokens:?}");
    let (_, res) = srv.op_get(&format!("/v1/resources/{their_res}")).await;
    assert!(
        !["Deprovisioning", "Deleted"].contains(&phase(&res)),
        "{res}"
    );

    // Its own project works.
    let (s, b) = get(&format!("/v1/nodes/{}", mine.node_id)).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, b) = post(
        &format!("/v1/projects/{LAB_NODES}/bootstrap-tokens"),
        Some(json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 3600})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    srv.stop().await;
}

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
        .insert(api::extract::RouteScope(OperatorScope::Admin));
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
        (&["--expires-in", "2y"][..], "is not a duration"),
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
