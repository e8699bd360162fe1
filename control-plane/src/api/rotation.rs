//! The rotation endpoints: the node's own (`GET`/`POST /v1/nodes/{id}/key`, `POST
//! /v1/nodes/{id}/credential`, node credential) and the operator's requests (`POST
//! /v1/nodes/{id}/rotate-key`, `/rotate-credential`, operator token; scope `operator`).
//! The protocol is in `plexsphere_wire::rotation`, the decisions in `node::rotation`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use plexsphere_wire::node::MAX_NODE_BODY;
use plexsphere_wire::proof::CredentialRotation;
use plexsphere_wire::rotation::{CredentialRotated, KeyChallenge, KeyRotated, KeyRotation};

use super::extract::{ApiJson, NodeAuth, Operator, UuidPath};
use super::state::AppState;
use crate::error::Error;
use crate::store;
use crate::store::nodes::{self, rotation::Request};
use crate::views::node_view;
use plexsphere_wire::admin::NodeView;

pub(crate) async fn key_challenge(
    State(st): State<Arc<AppState>>,
    NodeAuth { node }: NodeAuth,
) -> Result<Json<KeyChallenge>, Error> {
    let now = store::unix(st.now());
    Ok(Json(st.node_ops().key_challenge(&node, now).await?))
}

pub(crate) async fn rotate_key(
    State(st): State<Arc<AppState>>,
    NodeAuth { node }: NodeAuth,
    ApiJson(req): ApiJson<KeyRotation, MAX_NODE_BODY>,
) -> Result<Json<KeyRotated>, Error> {
    let now = store::unix(st.now());
    Ok(Json(st.node_ops().rotate_key(&node, &req, now).await?))
}

pub(crate) async fn rotate_credential(
    State(st): State<Arc<AppState>>,
    NodeAuth { node }: NodeAuth,
    ApiJson(req): ApiJson<CredentialRotation, MAX_NODE_BODY>,
) -> Result<Json<CredentialRotated>, Error> {
    let now = store::unix(st.now());
    let cred = st.node_ops().rotate_credential(&node, &req, now).await?;
    Ok(Json(CredentialRotated {
        node_credential: cred.expose(),
    }))
}

async fn request(
    st: &AppState,
    op: &Operator,
    id: uuid::Uuid,
    what: Request,
) -> Result<(StatusCode, Json<NodeView>), Error> {
    // A token bound to a project sees only that project's nodes.
    let node = super::operator::require_node(&mut st.store.acquire().await?, op, id).await?;
    let now = store::unix(st.now());
    if !st.node_ops().request_rotation(id, what, now).await? {
        return Err(Error::NotFound(format!(
            "no live node with id {id}; `plexctl node list` shows them"
        )));
    }
    tracing::info!(node_id = %id, operator = %op.id, what = ?what, "rotation requested by an operator; the node rotates at its next heartbeat");
    let action = match what {
        Request::Key => "node.rotate-key",
        Request::Credential => "node.rotate-credential",
    };
    let detail = serde_json::json!({"project_id": node.project_id, "name": node.dns_name});
    st.audit(super::audit_record::by(
        op,
        Some(node.domain_id),
        action,
        format!("node/{id}"),
        detail,
    ))
    .await;
    let row = nodes::get(&mut *st.store.acquire().await?, id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no node with id {id}")))?;
    let view = node_view(&row, now, st.config.offline_after_secs())?;
    Ok((StatusCode::ACCEPTED, Json(view)))
}

/// `POST /v1/nodes/{id}/rotate-key` (scope `operator`): 202 with the node.
pub(crate) async fn request_key_rotation(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(id): UuidPath,
) -> Result<(StatusCode, Json<NodeView>), Error> {
    request(&st, &op, id, Request::Key).await
}

/// `POST /v1/nodes/{id}/rotate-credential` (scope `operator`): 202 with the node.
pub(crate) async fn request_credential_rotation(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(id): UuidPath,
) -> Result<(StatusCode, Json<NodeView>), Error> {
    request(&st, &op, id, Request::Credential).await
}
