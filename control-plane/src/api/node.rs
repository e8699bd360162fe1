//! The node endpoints (`Authorization: Bearer pxnk_...`, the path's id is the caller's own):
//! heartbeat, endpoint report, state pull, ingest and leave. The event stream is in `sse`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use plexsphere_wire::node::{
    EndpointAck, EndpointReport, Heartbeat, HeartbeatAck, IngestBatch, MAX_NODE_BODY,
};

use super::extract::{ApiJson, ClientAddr, NodeAuth};
use super::state::AppState;
use crate::error::Error;
use crate::node::decisions;
use crate::store;
use crate::store::observations::{self, Recorded};

/// A node deleted between authentication and its ingest batch.
const GONE: &str =
    "this node no longer exists (deleted); register it again with a fresh bootstrap token";

/// At most this many observations in one ingest batch.
pub(crate) const MAX_OBSERVATIONS: usize = 4096;

pub(crate) async fn heartbeat(
    State(st): State<Arc<AppState>>,
    NodeAuth { node }: NodeAuth,
    ApiJson(hb): ApiJson<Heartbeat, MAX_NODE_BODY>,
) -> Result<Json<HeartbeatAck>, Error> {
    let now = store::unix(st.now());
    let threshold = st.config.offline_after_secs();
    let (state_version, relay_token) = st.node_ops().heartbeat(&node, &hb, now).await?;
    // `node` was read before this call marked it seen: it tells whether it had gone quiet.
    let was_quiet = node.last_seen_at.is_none_or(|seen| now - seen > threshold);
    if was_quiet {
        tracing::info!(node_id = %node.id, mesh_ip = %node.mesh_ip, plexd_version = %hb.plexd_version, "node online");
    }
    tracing::debug!(node_id = %node.id, uptime_secs = hb.uptime_secs, state_version = ?hb.state_version,
        peers_configured = hb.peers.configured, peers_connected = hb.peers.connected, "heartbeat");
    Ok(Json(HeartbeatAck {
        state_version,
        intervals: st.config.intervals,
        relay_token: Some(relay_token),
        rotate_key: node.rotation.rotate_key_requested_at.is_some(),
        rotate_credential: node.rotation.rotate_credential_requested_at.is_some(),
    }))
}

pub(crate) async fn endpoints(
    State(st): State<Arc<AppState>>,
    NodeAuth { node }: NodeAuth,
    ClientAddr(observed): ClientAddr,
    ApiJson(report): ApiJson<EndpointReport, MAX_NODE_BODY>,
) -> Result<Json<EndpointAck>, Error> {
    let now = store::unix(st.now());
    let ack = st
        .node_ops()
        .report_endpoints(&node, &report, observed, now)
        .await?;
    Ok(Json(ack))
}

pub(crate) async fn state(
    State(st): State<Arc<AppState>>,
    NodeAuth { node }: NodeAuth,
    headers: HeaderMap,
) -> Result<Response, Error> {
    let now = store::unix(st.now());
    let (version, env) = st.node_ops().signed_state(node.id, now).await?;
    let etag = HeaderValue::from_str(&decisions::etag(version))
        .map_err(|e| Error::Internal(format!("cannot build an ETag: {e}")))?;
    let inm = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok());
    if decisions::not_modified(inm, version) {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response());
    }
    Ok(([(header::ETAG, etag)], Json(env)).into_response())
}

pub(crate) async fn ingest(
    State(st): State<Arc<AppState>>,
    NodeAuth { node }: NodeAuth,
    ApiJson(batch): ApiJson<IngestBatch, MAX_NODE_BODY>,
) -> Result<StatusCode, Error> {
    if batch.observations.len() > MAX_OBSERVATIONS {
        return Err(Error::Invalid(format!(
            "an ingest batch carries at most {MAX_OBSERVATIONS} observations, not {}; send smaller batches",
            batch.observations.len()
        )));
    }
    super::observations::check_batch(&batch)?;
    let now = store::unix(st.now());
    match observations::record(&st.store, node.id, &batch, now).await? {
        Recorded::Stored => {
            if batch.dropped > 0 {
                tracing::info!(node_id = %node.id, dropped = batch.dropped, "node dropped observations while the API was away");
            }
            tracing::debug!(node_id = %node.id, batch_id = %batch.batch_id, observations = batch.observations.len(), "ingest batch stored");
        }
        Recorded::Duplicate => {
            tracing::info!(node_id = %node.id, batch_id = %batch.batch_id, "ingest batch already stored (the node sent it again after a lost answer); not stored twice");
        }
        Recorded::Gone => return Err(Error::Unauthorized(GONE)),
    }
    Ok(StatusCode::ACCEPTED)
}

pub(crate) async fn leave(
    State(st): State<Arc<AppState>>,
    NodeAuth { node }: NodeAuth,
) -> Result<StatusCode, Error> {
    let now = store::unix(st.now());
    st.node_ops().leave(node.id, now).await?;
    Ok(StatusCode::NO_CONTENT)
}
