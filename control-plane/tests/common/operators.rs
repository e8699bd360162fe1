//! Operator tokens for the tests: a token of a scope, project, age and life made in the
//! store, and one call with it.

use plexsphere::api::Verb;
use plexsphere::operator_tokens::{self, Expiry, TokenSpec};
use plexsphere_wire::admin::OperatorScope;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use time::{Duration, OffsetDateTime};
use uuid::Uuid;

use super::TestServer;

/// A token of `scope` (for every project unless `project`), made `age` ago, valid for `life`.
pub async fn token(
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

pub async fn fresh(srv: &TestServer, scope: OperatorScope, project: Option<&str>) -> String {
    token(srv, scope, project, Duration::ZERO, Expiry::AfterSecs(3600)).await
}

pub async fn call(
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
    // An event stream (`GET /v1/console/events`) never ends: its status is the answer.
    let stream = r
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if stream {
        return (status, Value::Null);
    }
    (status, r.json().await.unwrap_or(Value::Null))
}
