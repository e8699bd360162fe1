//! The HTTP API of docs/api.md: an axum router over shared [`AppState`] (`state.rs`), one
//! file of handlers per audience (`public`, `operator`, `node`, `sse`, `observations`,
//! `broker`), the extractors in `extract.rs`.

mod broker;
pub mod error;
pub mod extract;
mod node;
mod observations;
mod operator;
mod public;
mod rotation;
pub mod sse;
mod state;
mod streams;

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};

use crate::error::Error;
pub use state::{ApiConfig, AppState, Clock, EventConfig};

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
        .route(
            "/v1/nodes/{node_id}",
            get(operator::get_node).delete(node::leave),
        )
        .route("/v1/nodes/{node_id}/revoke", post(operator::revoke_node))
        .route("/v1/nodes/{node_id}/heartbeat", post(node::heartbeat))
        .route("/v1/nodes/{node_id}/endpoints", post(node::endpoints))
        .route("/v1/nodes/{node_id}/state", get(node::state))
        .route("/v1/nodes/{node_id}/events", get(sse::events))
        .route("/v1/nodes/{node_id}/ingest", post(node::ingest))
        .route("/v1/nodes/{node_id}/observations", get(observations::list))
        .route("/v1/blueprints", get(broker::list_blueprints))
        .route(
            "/v1/cloud-credentials",
            post(broker::create_credential).get(broker::list_credentials),
        )
        .route(
            "/v1/cloud-credentials/{id}/revoke",
            post(broker::revoke_credential),
        )
        .route(
            "/v1/projects/{project_id}/resources",
            post(broker::create_resource).get(broker::list_resources),
        )
        .route(
            "/v1/resources/{id}",
            get(broker::get_resource).delete(broker::delete_resource),
        )
        .route(
            "/v1/nodes/{node_id}/key",
            get(rotation::key_challenge).post(rotation::rotate_key),
        )
        .route(
            "/v1/nodes/{node_id}/credential",
            post(rotation::rotate_credential),
        )
        // Operator routes, scope `operator`.
        .route(
            "/v1/nodes/{node_id}/rotate-key",
            post(rotation::request_key_rotation),
        )
        .route(
            "/v1/nodes/{node_id}/rotate-credential",
            post(rotation::request_credential_rotation),
        )
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
