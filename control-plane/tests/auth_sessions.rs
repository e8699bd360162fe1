//! Session lifetime, idle timeout and role removal on the server's own clock (an injected
//! `AppState::clock`, no waiting): `api::auth::live_session` is the check every
//! session-authenticated request goes through (`api::extract::Operator`).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use plexsphere::api::auth::live_session;
use plexsphere::api::{ApiConfig, AppState};
use plexsphere::auth::session::{Kind, SessionSecret};
use plexsphere::auth::{Auth, AuthConfig};
use plexsphere::broker::BrokerConfig;
use plexsphere::error::Error;
use plexsphere::store::{self, Store, roles, sessions};

const T0: i64 = 1_900_000_000;

struct Clocked {
    state: AppState,
    now: Arc<AtomicI64>,
    _dir: tempfile::TempDir,
}

async fn server() -> Clocked {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::connect(&Store::sqlite_url(dir.path()))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let now = Arc::new(AtomicI64::new(T0));
    let clock = Arc::clone(&now);
    let auth = Auth::new(AuthConfig {
        issuer: "http://127.0.0.1:9".into(),
        client_id: "console".into(),
        client_secret: "s".into(),
        cli_client_id: None,
        groups_claim: "groups".into(),
        scopes: "openid".into(),
        public_origin: "https://cp.example".into(),
        session_lifetime: Duration::from_secs(12 * 3600),
        session_idle_timeout: Duration::from_secs(3600),
        ca_file: None,
    })
    .unwrap();
    let mut state = AppState::with_broker_config(
        store,
        dir.path(),
        ApiConfig::default(),
        BrokerConfig::default(),
    )
    .with_auth(Some(Arc::new(auth)));
    state.clock = Arc::new(move || {
        time::OffsetDateTime::from_unix_timestamp(clock.load(Ordering::SeqCst)).unwrap()
    });
    Clocked {
        state,
        now,
        _dir: dir,
    }
}

async fn session_for(st: &AppState, subject: &str) -> SessionSecret {
    let secret = SessionSecret::generate().unwrap();
    let row = sessions::SessionRow {
        id: secret.id.clone(),
        secret_sha256: store::secret_digest(&secret.secret),
        kind: "cookie".into(),
        csrf_sha256: None,
        issuer: "http://127.0.0.1:9".into(),
        subject: subject.into(),
        email: None,
        name: None,
        groups: vec!["ops".into()],
        created_at: T0,
        last_seen_at: T0,
        expires_at: T0 + 12 * 3600,
        revoked_at: None,
        revoked_reason: None,
    };
    sessions::insert_session(&mut st.store.acquire().await.unwrap(), &row)
        .await
        .unwrap();
    secret
}

async fn bind_group(st: &AppState, id: &str) {
    let b = roles::BindingRow {
        id: id.into(),
        role: "member".into(),
        scope_kind: "platform".into(),
        scope_id: String::new(),
        principal_kind: "group".into(),
        principal: "ops".into(),
        created_at: T0,
        created_by: "test".into(),
    };
    roles::insert(&mut st.store.acquire().await.unwrap(), &b)
        .await
        .unwrap();
}

fn expired(r: Result<impl std::fmt::Debug, Error>, why: &str) {
    match r {
        Err(Error::SessionExpired(m)) => assert!(m.contains(why), "{m}"),
        other => panic!("expected session_expired ({why}), got {other:?}"),
    }
}

#[tokio::test]
async fn an_idle_session_ends_and_stays_ended() {
    let c = server().await;
    bind_group(&c.state, "b1").await;
    let s = session_for(&c.state, "alice").await;
    c.now.store(T0 + 3000, Ordering::SeqCst);
    live_session(&c.state, &s, Kind::Cookie).await.unwrap();
    // Used at T0+3000: idle counts from there.
    c.now.store(T0 + 3000 + 3599, Ordering::SeqCst);
    live_session(&c.state, &s, Kind::Cookie).await.unwrap();
    c.now.store(T0 + 3000 + 3599 + 3600, Ordering::SeqCst);
    expired(live_session(&c.state, &s, Kind::Cookie).await, "idle");
    c.now.store(T0 + 3000 + 3599 + 3601, Ordering::SeqCst);
    expired(live_session(&c.state, &s, Kind::Cookie).await, "idle");
}

#[tokio::test]
async fn a_used_session_still_ends_at_its_lifetime() {
    let c = server().await;
    bind_group(&c.state, "b1").await;
    let s = session_for(&c.state, "alice").await;
    let mut t = T0;
    while t + 3000 < T0 + 12 * 3600 {
        t += 3000;
        c.now.store(t, Ordering::SeqCst);
        live_session(&c.state, &s, Kind::Cookie).await.unwrap();
    }
    c.now.store(T0 + 12 * 3600, Ordering::SeqCst);
    expired(live_session(&c.state, &s, Kind::Cookie).await, "lifetime");
}

#[tokio::test]
async fn removing_the_last_binding_revokes_and_a_cookie_session_is_no_bearer() {
    let c = server().await;
    bind_group(&c.state, "b1").await;
    let s = session_for(&c.state, "alice").await;
    live_session(&c.state, &s, Kind::Cookie).await.unwrap();
    assert!(matches!(
        live_session(&c.state, &s, Kind::Bearer).await,
        Err(Error::Unauthorized(_))
    ));
    roles::delete(&mut c.state.store.acquire().await.unwrap(), "b1")
        .await
        .unwrap();
    expired(live_session(&c.state, &s, Kind::Cookie).await, "no role");
    // A new binding does not bring a revoked session back.
    bind_group(&c.state, "b2").await;
    expired(live_session(&c.state, &s, Kind::Cookie).await, "no role");
}
