//! The HTTP API of docs/api.md: an axum router over shared [`AppState`] (`state.rs`), one
//! file of handlers per audience (`public`, `operator`, `node`, `sse`, `observations`,
//! `broker`), the extractors in `extract.rs`.

mod audit;
mod audit_record;
pub mod auth;
mod broker;
mod console_events;
pub mod error;
mod event_ring;
pub mod extract;
pub mod fanout;
pub(crate) mod health;
mod names;
mod node;
mod node_settings;
mod observations;
mod operator;
mod operator_auth;
mod operator_reach;
mod paths;
mod paths_shared;
mod policy;
mod public;
mod roles;
mod rotation;
pub mod routes;
mod session_check;
mod signing_keys;
pub mod sse;
mod state;
mod streams;
mod subnet;

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;

use crate::error::Error;
pub use routes::{
    ADMIN, AUDIT, Access, COMPUTE_ONLY_POSTS, Need, OPERATE, READ, RouteSpec, Routes, SELF_POSTS,
    Verb,
};
pub use state::{ApiConfig, AppState, Clock, EventConfig};
pub use state::{NODE_RATE_LIMIT, NodeRateLimit};

/// Every route of docs/api.md with who may call it: the one table the router and the tests
/// use (docs/api.md, "Operator token scopes", lists the same rows). Adding a route is one
/// line; an operator route names the least scope it needs: `READ` for reads, `OPERATE` for
/// day-to-day changes, `ADMIN` for what manages access or global configuration.
#[rustfmt::skip] // a table: one route per line
fn routes() -> Routes {
    use Access::{Node, Public};
    use Verb::{Delete, Get, Post, Put};
    Routes::default()
        .add(Get, "/v1/version", Public, public::version)
        .add(Get, "/v1/ca.crt", Public, public::ca_cert)
        .add(Post, plexsphere_wire::proof::REGISTER_CHALLENGE_PATH, Public, public::register_challenge)
        .add(Post, plexsphere_wire::REGISTER_PATH, Public, public::register)
        .add(Get, "/v1/domains", READ, operator::list_domains)
        .add(Get, "/v1/projects", READ, operator::list_projects)
        .add(Post, "/v1/projects/{project_id}/bootstrap-tokens", OPERATE, operator::issue_token)
        .add(Get, "/v1/projects/{project_id}/bootstrap-tokens", READ, operator::list_tokens)
        .add(Post, "/v1/bootstrap-tokens/{token_id}/revoke", OPERATE, operator::revoke_token)
        .add(Get, "/v1/nodes", READ, operator::list_nodes)
        .add(Get, "/v1/nodes/{node_id}", READ, operator::get_node)
        .add(Delete, "/v1/nodes/{node_id}", Node, node::leave)
        .add(Post, "/v1/nodes/{node_id}/revoke", OPERATE, operator::revoke_node)
        .add(Post, "/v1/nodes/{node_id}/heartbeat", Node, node::heartbeat)
        .add(Post, "/v1/nodes/{node_id}/endpoints", Node, node::endpoints)
        .add(Get, "/v1/nodes/{node_id}/state", Node, node::state)
        .add(Get, "/v1/nodes/{node_id}/events", Node, sse::events)
        .add(Post, "/v1/nodes/{node_id}/ingest", Node, node::ingest)
        .add(Get, "/v1/nodes/{node_id}/observations", READ, observations::list)
        .add(Get, "/v1/blueprints", READ, broker::list_blueprints)
        .add(Post, "/v1/cloud-credentials", ADMIN, broker::create_credential)
        .add(Get, "/v1/cloud-credentials", READ, broker::list_credentials)
        .add(Post, "/v1/cloud-credentials/{id}/revoke", ADMIN, broker::revoke_credential)
        .add(Post, "/v1/cloud-credentials/{id}/rotate", ADMIN, broker::rotate_credential)
        .add(Post, "/v1/projects/{project_id}/resources", OPERATE, broker::create_resource)
        .add(Get, "/v1/projects/{project_id}/resources", READ, broker::list_resources)
        .add(Get, "/v1/resources/{id}", READ, broker::get_resource)
        .add(Delete, "/v1/resources/{id}", OPERATE, broker::delete_resource)
        .add(Get, "/v1/operator-tokens/self", READ, operator::whoami)
        .add(Get, "/v1/operator-tokens", ADMIN, operator::list_operator_tokens)
        .add(Post, "/v1/operator-tokens", ADMIN, operator::create_operator_token)
        .add(Post, "/v1/operator-tokens/{id}/revoke", ADMIN, operator::revoke_operator_token)
        .add(Get, "/v1/nodes/{node_id}/key", Node, rotation::key_challenge)
        .add(Post, "/v1/nodes/{node_id}/key", Node, rotation::rotate_key)
        .add(Post, "/v1/nodes/{node_id}/credential", Node, rotation::rotate_credential)
        .add(Post, "/v1/nodes/{node_id}/rotate-key", OPERATE, rotation::request_key_rotation)
        .add(Post, "/v1/nodes/{node_id}/rotate-credential", OPERATE, rotation::request_credential_rotation)
        .add(Put, "/v1/nodes/{node_id}/udp-offload", OPERATE, node_settings::set_udp_offload)
        .add(Get, "/v1/domains/{domain}/signing-keys", READ, signing_keys::list)
        .add(Post, "/v1/domains/{domain}/signing-keys", ADMIN, signing_keys::rotate)
        .add(Get, "/v1/nodes/{node_id}/signing-keys", Node, signing_keys::chain)
        .add(Get, "/v1/domains/{domain}/policy", READ, policy::get)
        .add(Put, "/v1/domains/{domain}/policy", ADMIN, policy::set)
        .add(Post, "/v1/domains/{domain}/policy/validate", READ, policy::validate)
        .add(Get, "/v1/domains/{domain}/policy/history", READ, policy::history)
        .add(Post, "/v1/domains/{domain}/policy/rollback", ADMIN, policy::rollback)
        .add(Get, "/v1/domains/{domain}/policy/explain", READ, policy::explain)
        .add(Put, "/v1/nodes/{node_id}/tags", OPERATE, policy::set_node_tags)
        .add(Put, "/v1/nodes/{node_id}/name", OPERATE, names::rename)
        .add(Put, "/v1/nodes/{node_id}/routes", Node, subnet::report)
        .add(Get, "/v1/routes", READ, subnet::list)
        .add(Post, "/v1/routes/approve", OPERATE, subnet::approve)
        .add(Post, "/v1/routes/deny", OPERATE, subnet::deny)
        .add(Get, "/v1/domains/{domain}/dns", READ, names::get_dns)
        .add(Put, "/v1/domains/{domain}/dns", ADMIN, names::set_dns)
        .add(Get, "/v1/audit", AUDIT, audit::list)
        .add(Post, "/v1/audit/verify", AUDIT, audit::verify)
        .add(Put, "/v1/nodes/{node_id}/paths", Node, paths::report)
        .add(Get, "/v1/nodes/{node_id}/paths", READ, paths::node_paths)
        .add(Get, "/v1/mesh/map", READ, paths::mesh_map)
        .add(Get, "/v1/relays", READ, paths::relays)
        .add(Get, "/v1/console/events", READ, console_events::events)
        .add(Get, "/v1/auth/config", Public, auth::config)
        .add(Get, "/v1/auth/sign-in", Public, auth::sign_in)
        .add(Get, "/v1/auth/callback", Public, auth::callback)
        .add(Post, "/v1/auth/session", Public, auth::exchange)
        .add(Post, "/v1/auth/sign-out", READ, auth::sign_out)
        .add(Get, "/v1/auth/whoami", READ, auth::whoami)
        .add(Get, "/v1/role-bindings", READ, roles::list)
        .add(Post, "/v1/role-bindings", ADMIN, roles::bind)
        .add(Post, "/v1/role-bindings/{id}/delete", ADMIN, roles::unbind)
        .add(Get, "/healthz", Public, health::healthz)
        .add(Get, "/readyz", Public, health::readyz)
        .add(Get, "/metrics", READ, health::metrics)
}

/// The route table (method, path, who may call it) the router is built from.
pub fn route_table() -> Vec<RouteSpec> {
    routes().table
}

/// Every route of docs/api.md.
pub fn router(state: Arc<AppState>) -> Router {
    routes()
        .router
        // The API's paths answer the JSON 404; every other path is the web console's.
        .fallback(crate::console::fallback)
        .method_not_allowed_fallback(|| async {
            let mut resp = axum::response::IntoResponse::into_response(Error::BadRequest(
                "this method is not allowed on this endpoint; see docs/api.md".into(),
            ));
            *resp.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
            resp
        })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            health::track,
        ))
        .with_state(state)
}

/// The `--metrics-listen` listener's router: `GET /metrics` without authentication (that
/// listener is for loopback or a private network; the API listener's `/metrics` needs a
/// token).
pub(crate) fn metrics_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", axum::routing::get(health::metrics_open))
        .with_state(state)
}
