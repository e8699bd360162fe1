//! The HTTP API of docs/api.md: an axum router over shared [`AppState`].

pub mod error;
pub mod extract;
mod operator;
mod public;
pub mod views;

use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use ipnet::IpNet;
use plexsphere_wire::Intervals;
use time::OffsetDateTime;

use crate::error::Error;
use crate::keys::Keyring;
use crate::ratelimit::{RateLimit, RateLimiter};
use crate::store::Store;

/// The knobs of the API.
#[derive(Debug, Clone, Default)]
pub struct ApiConfig {
    pub intervals: Intervals,
    pub register_rate_limit: RateLimit,
    /// Peers in these ranges are reverse proxies whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// The PEM of the CA the server's chain ends in, served at `/v1/ca.crt` (dev mode).
    pub ca_pem: Option<String>,
}

/// A source of "now", so tests can move time.
pub type Clock = Arc<dyn Fn() -> OffsetDateTime + Send + Sync>;

pub struct AppState {
    pub store: Store,
    pub keys: Keyring,
    pub config: ApiConfig,
    pub register_limiter: Mutex<RateLimiter>,
    pub clock: Clock,
}

impl AppState {
    pub fn new(store: Store, data_dir: &Path, config: ApiConfig) -> Self {
        Self {
            store,
            keys: Keyring::new(data_dir),
            register_limiter: Mutex::new(RateLimiter::new(config.register_rate_limit)),
            config,
            clock: Arc::new(OffsetDateTime::now_utc),
        }
    }

    pub fn now(&self) -> OffsetDateTime {
        (self.clock)()
    }
}

/// Every route of docs/api.md.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/version", get(public::version))
        .route("/v1/ca.crt", get(public::ca_cert))
        .route(plexsphere_wire::REGISTER_PATH, post(public::register))
        .route("/v1/domains", get(operator::list_domains))
        .route("/v1/projects", get(operator::list_projects))
        .route(
            "/v1/projects/{project_id}/bootstrap-tokens",
            post(operator::issue_token).get(operator::list_tokens),
        )
        .route(
            "/v1/bootstrap-tokens/{token_id}/revoke",
            post(operator::revoke_token),
        )
        .route("/v1/nodes", get(operator::list_nodes))
        .route("/v1/nodes/{node_id}", get(operator::get_node))
        .fallback(|| async { Error::NotFound("no such endpoint; see docs/api.md".into()) })
        .method_not_allowed_fallback(|| async {
            let mut resp = axum::response::IntoResponse::into_response(Error::BadRequest(
                "this method is not allowed on this endpoint; see docs/api.md".into(),
            ));
            *resp.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
            resp
        })
        .with_state(state)
}
