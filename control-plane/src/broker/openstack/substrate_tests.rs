//! The substrate against a stand-in cloud on 127.0.0.1:0 (Keystone and Nova, a few routes of
//! axum): the token is cached and reused, a 401 from Nova signs in again once, a token about
//! to expire is replaced, and a 503, a closed port or an oversized body are `Unreachable`.
//! The real cloud is in control-plane/tests/openstack_substrate.rs.

use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use plexsphere_broker::credentials::CredentialPayload;
use serde_json::json;
use uuid::Uuid;

use super::*;

/// What the stand-in Nova answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Nova {
    /// 401 to the first token, then an empty list.
    RefuseFirstToken,
    /// 401 to every token.
    RefuseAll,
    Unavailable,
    /// A body one byte over the cap.
    Huge,
}

struct Cloud {
    base: String,
    nova: Nova,
    /// Seconds the tokens it issues live.
    token_life: i64,
    sign_ins: AtomicUsize,
    nova_calls: AtomicUsize,
}

async fn sign_in(State(c): State<Arc<Cloud>>) -> Response {
    let n = c.sign_ins.fetch_add(1, Ordering::SeqCst) + 1;
    let expires = time::OffsetDateTime::now_utc() + time::Duration::seconds(c.token_life);
    let expires = expires
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let endpoint = |path: &str| json!([{"interface": "public", "region_id": "r1", "url": format!("{}{path}", c.base)}]);
    let body = json!({"token": {
        "expires_at": expires,
        "project": {"id": "p1"},
        "catalog": [
            {"type": "compute", "endpoints": endpoint("/compute/v2.1")},
            {"type": "image", "endpoints": endpoint("/image")},
            {"type": "network", "endpoints": endpoint("/network")},
        ]
    }});
    let mut headers = HeaderMap::new();
    headers.insert(
        "X-Subject-Token",
        format!("tok-{n}")
            .parse()
            .unwrap_or_else(|_| panic!("header")),
    );
    (StatusCode::CREATED, headers, axum::Json(body)).into_response()
}

async fn servers(State(c): State<Arc<Cloud>>, headers: HeaderMap) -> Response {
    c.nova_calls.fetch_add(1, Ordering::SeqCst);
    let token = headers
        .get("X-Auth-Token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let microversion = headers
        .get("OpenStack-API-Version")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert_eq!(microversion, session::COMPUTE_MICROVERSION);
    let refused = json!({"error": {"code": 401, "message": "The request you have made requires authentication."}});
    match c.nova {
        Nova::RefuseFirstToken if token == "tok-1" => {
            (StatusCode::UNAUTHORIZED, axum::Json(refused)).into_response()
        }
        Nova::RefuseAll => (StatusCode::UNAUTHORIZED, axum::Json(refused)).into_response(),
        Nova::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response(),
        Nova::Huge => "x".repeat(http::MAX_BODY_BYTES + 1).into_response(),
        Nova::RefuseFirstToken => axum::Json(json!({"servers": []})).into_response(),
    }
}

/// Starts the stand-in cloud; its state, and the credential that signs in to it.
async fn start(nova: Nova, token_life: i64) -> (Arc<Cloud>, CredentialPayload) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let port = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("{e}"))
        .port();
    let cloud = Arc::new(Cloud {
        base: format!("http://127.0.0.1:{port}"),
        nova,
        token_life,
        sign_ins: AtomicUsize::new(0),
        nova_calls: AtomicUsize::new(0),
    });
    let app = Router::new()
        .route("/v3/auth/tokens", post(sign_in))
        .route("/compute/v2.1/servers/detail", get(servers))
        .with_state(cloud.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let cred = credential(&format!("http://127.0.0.1:{port}/v3"));
    (cloud, cred)
}

fn credential(auth_url: &str) -> CredentialPayload {
    CredentialPayload::new(
        serde_json::to_vec(&json!({
            "auth_url": auth_url,
            "application_credential_id": "app-1",
            "application_credential_secret": "secret-1",
        }))
        .unwrap_or_default(),
    )
}

fn target(credential: CredentialPayload) -> Arc<Target> {
    let resource = Resource::new(
        Uuid::new_v4(),
        Uuid::new_v4(),
        "node".into(),
        Uuid::new_v4(),
        Uuid::new_v4(),
        serde_json::Map::new(),
        time::OffsetDateTime::now_utc(),
    );
    Arc::new(Target {
        resource,
        credential,
    })
}

/// `gone`, on a blocking thread as the reconcile loop calls it.
async fn gone(s: &Arc<OpenStack>, t: &Arc<Target>) -> Result<bool, SubstrateError> {
    let (s, t) = (s.clone(), t.clone());
    tokio::task::spawn_blocking(move || s.gone(&t))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_reused_and_a_refused_one_replaced_once() {
    let (cloud, cred) = start(Nova::RefuseFirstToken, 3600).await;
    let (s, t) = (Arc::new(OpenStack::new()), target(cred));
    assert_eq!(gone(&s, &t).await, Ok(true));
    // tok-1 was refused, tok-2 answered.
    assert_eq!(cloud.sign_ins.load(Ordering::SeqCst), 2);
    assert_eq!(cloud.nova_calls.load(Ordering::SeqCst), 2);
    assert_eq!(gone(&s, &t).await, Ok(true));
    assert_eq!(gone(&s, &t).await, Ok(true));
    assert_eq!(cloud.sign_ins.load(Ordering::SeqCst), 2, "tok-2 is cached");
    assert_eq!(cloud.nova_calls.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_within_five_minutes_of_expiry_is_replaced() {
    let (cloud, cred) = start(Nova::RefuseFirstToken, 4 * 60).await;
    let (s, t) = (Arc::new(OpenStack::new()), target(cred));
    assert_eq!(gone(&s, &t).await, Ok(true));
    assert_eq!(cloud.sign_ins.load(Ordering::SeqCst), 2);
    assert_eq!(gone(&s, &t).await, Ok(true));
    assert_eq!(cloud.sign_ins.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_refusing_a_fresh_token_fails_after_one_retry() {
    let (cloud, cred) = start(Nova::RefuseAll, 3600).await;
    let (s, t) = (Arc::new(OpenStack::new()), target(cred));
    match gone(&s, &t).await {
        Err(SubstrateError::Failed(e)) => {
            assert!(
                e.starts_with(&format!(
                    "Nova of the cloud {}/v3 refused a fresh Keystone token",
                    cloud.base
                )),
                "{e}"
            );
            assert!(e.contains("plexctl cloud-credential rotate"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(cloud.sign_ins.load(Ordering::SeqCst), 2);
    assert_eq!(cloud.nova_calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outages_and_oversized_answers_are_unreachable() {
    for (nova, want) in [
        (Nova::Unavailable, "answered 503"),
        (Nova::Huge, "larger than the 4194304 bytes read"),
    ] {
        let (_cloud, cred) = start(nova, 3600).await;
        let (s, t) = (Arc::new(OpenStack::new()), target(cred));
        match gone(&s, &t).await {
            Err(SubstrateError::Unreachable(e)) => assert!(e.contains(want), "{e}"),
            other => panic!("{other:?}"),
        }
    }
    // Nothing listens: Keystone cannot be asked.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = closed.local_addr().unwrap_or_else(|e| panic!("{e}")).port();
    drop(closed);
    let (s, t) = (
        Arc::new(OpenStack::new()),
        target(credential(&format!("http://127.0.0.1:{port}/v3"))),
    );
    match gone(&s, &t).await {
        Err(SubstrateError::Unreachable(e)) => assert!(
            e.starts_with(&format!("cannot reach Keystone of the cloud http://127.0.0.1:{port}/v3 for signing in: cannot connect")),
            "{e}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn outside_a_runtime_nothing_is_asked() {
    let s = OpenStack::new();
    let t = target(credential("http://127.0.0.1:9/v3"));
    match s.gone(&t) {
        Err(SubstrateError::Unreachable(e)) => {
            assert!(e.contains("outside a tokio runtime"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}
