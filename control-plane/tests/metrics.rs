//! `/metrics`, `/healthz`, `/readyz` and `--log-format json`: the counters move by what was
//! done, access needs a read-only token, readiness follows the database, and JSON log lines
//! parse. The exposition is read with a real parser (`prometheus-parse`).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use common::operators::fresh;
use common::*;
use plexsphere_wire::admin::OperatorScope;
use prometheus_parse::{Scrape, Value};
use reqwest::StatusCode;

/// Scrapes `/metrics` with `bearer` and parses it.
async fn scrape(srv: &TestServer, bearer: &str) -> Scrape {
    let r = srv
        .client
        .get(srv.url("/metrics"))
        .bearer_auth(bearer)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4"),
        "{:?}",
        r.headers()
    );
    let text = r.text().await.unwrap();
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap()
}

/// The value of the one sample named `name` whose labels include `labels`.
fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut hits = s
        .samples
        .iter()
        .filter(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)));
    let hit = hits.next()?;
    assert!(hits.next().is_none(), "more than one {name} {labels:?}");
    match &hit.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(*v),
        Value::Histogram(buckets) => buckets.last().map(|b| b.count),
        Value::Summary(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_registrations_requests_and_streams() {
    let srv = TestServer::start().await;
    let r = srv.client.get(srv.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "no token");
    let read_only = fresh(&srv, OperatorScope::ReadOnly, None).await;

    let a = srv.enrol(LAB_NODES).await;
    let mut stream = srv.open_events(&a, None).await;
    srv.wait_for("the stream to open", async || {
        srv.state.streams.open_for(a.node_id) == 1
    })
    .await;
    let b = srv.enrol(LAB_NODES).await;
    let ev = stream.next_event().await.unwrap();
    assert!(ev.seq > 0);
    let (s, _) = srv
        .register(&register_body("pxbt_not_a_token", &wg_key(1)))
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let _ = b;

    let m = scrape(&srv, &read_only).await;
    let reg = "plexsphere_registrations_total";
    assert_eq!(value(&m, reg, &[("result", "created")]), Some(2.0));
    assert_eq!(value(&m, reg, &[("result", "token_unknown")]), Some(1.0));
    let req = "plexsphere_http_requests_total";
    let route = ("route", "/v1/register");
    assert_eq!(
        value(&m, req, &[route, ("method", "POST"), ("status", "201")]),
        Some(2.0)
    );
    assert_eq!(
        value(&m, req, &[route, ("method", "POST"), ("status", "401")]),
        Some(1.0)
    );
    // The route template, never the raw path.
    assert!(
        m.samples.iter().filter(|x| x.metric == req).all(|x| !x
            .labels
            .get("route")
            .unwrap()
            .contains(&a.node_id.to_string())),
        "a raw path became a label"
    );
    assert_eq!(
        value(
            &m,
            "plexsphere_http_request_duration_seconds_count",
            &[route, ("method", "POST")]
        ),
        Some(3.0)
    );
    assert_eq!(value(&m, "plexsphere_event_streams_open", &[]), Some(1.0));
    assert!(value(&m, "plexsphere_event_delivery_seconds_count", &[]).unwrap() >= 1.0);
    assert!(value(&m, "plexsphere_db_pool_connections", &[]).unwrap() >= 1.0);
    assert_eq!(
        value(&m, "plexsphere_db_pool_max_connections", &[]),
        Some(8.0)
    );
    assert_eq!(
        value(&m, "plexsphere_broker_resources", &[("phase", "Ready")]),
        Some(0.0)
    );
    // One process on its own database: it leads, and its in-process bus is always up.
    assert_eq!(value(&m, "plexsphere_broker_leader", &[]), Some(1.0));
    assert_eq!(value(&m, "plexsphere_event_bus_connected", &[]), Some(1.0));

    drop(stream);
    srv.wait_for("the stream to close", async || {
        srv.state.streams.open_for(a.node_id) == 0
    })
    .await;
    let m = scrape(&srv, &read_only).await;
    assert_eq!(value(&m, "plexsphere_event_streams_open", &[]), Some(0.0));
    assert_eq!(
        value(
            &m,
            req,
            &[("route", "/metrics"), ("method", "GET"), ("status", "401")]
        ),
        Some(1.0)
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_database_and_its_migrations() {
    let srv = TestServer::start().await;
    let get = async |path: &str| {
        let r = srv.client.get(srv.url(path)).send().await.unwrap();
        (r.status(), r.text().await.unwrap())
    };
    assert_eq!(get("/healthz").await, (StatusCode::OK, "ok".to_owned()));
    assert_eq!(get("/readyz").await, (StatusCode::OK, "ok".to_owned()));

    // A migration the database does not have: not ready, naming it.
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 10")
        .execute(srv.store.pool())
        .await
        .unwrap();
    let (status, body) = get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["code"], "unavailable");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("migrations [10]"),
        "{body}"
    );

    // The database gone (its pool closed): not ready, and the process still answers.
    srv.store.close().await;
    let (status, body) = get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["code"], "unavailable");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("the database does not answer"),
        "{body}"
    );
    assert_eq!(get("/healthz").await, (StatusCode::OK, "ok".to_owned()));
}

#[test]
fn log_format_json_writes_one_json_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let mut child = dev::command(&dir.path().join("data"))
        .args(["--log-format", "json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let listening = std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .map(|l| l.unwrap())
        .find(|l| l.starts_with("listening on "));
    assert!(listening.is_some(), "dev did not start");
    dev::stop(child);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(lines.len() >= 2, "{text}");
    let serving = lines
        .iter()
        .find(|l| l["message"] == "serving the plexsphere API")
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(serving["level"], "INFO");
    assert_eq!(serving["scheme"], "https");
    assert!(serving["timestamp"].is_string());
}

/// Postgres: ready while the database answers; 503 once the database is dropped under the
/// running server (its connections are terminated; new ones are refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_on_postgres_says_unavailable_once_the_database_is_gone() {
    let Some(url) = postgres::scratch_database().await else {
        return;
    };
    let srv = TestServer::start_with(Options {
        database_url: Some(url.clone()),
        ..Options::default()
    })
    .await;
    let get = async |path: &str| {
        let r = srv.client.get(srv.url(path)).send().await.unwrap();
        (r.status(), r.text().await.unwrap())
    };
    assert_eq!(get("/readyz").await, (StatusCode::OK, "ok".to_owned()));

    let name = url
        .split('?')
        .next()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    let admin = std::env::var("PLEXSPHERE_TEST_POSTGRES_URL").unwrap();
    let pool = sqlx::AnyPool::connect(&admin).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;

    let (status, body) = get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["code"], "unavailable");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            // Refused at once, or no answer within the check's bound: both name the database.
            .starts_with("not ready: the database "),
        "{body}"
    );
    assert_eq!(get("/healthz").await, (StatusCode::OK, "ok".to_owned()));
}
