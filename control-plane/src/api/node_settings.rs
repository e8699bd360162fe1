//! `PUT /v1/nodes/{id}/udp-offload` (scope `operator`): the node's UDP GSO/GRO switch, carried
//! in its signed state (`crate::node::settings`).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use plexsphere_wire::admin::NodeView;
use plexsphere_wire::node::{UdpOffload, UdpOffloadRequest};

use super::extract::{ApiJson, Operator, UuidPath};
use super::state::AppState;
use crate::error::Error;
use crate::store;
use crate::views::node_view;

/// Sets the switch; 200 with the node, 404 for no live node (or another project's).
pub(crate) async fn set_udp_offload(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(id): UuidPath,
    ApiJson(req): ApiJson<UdpOffloadRequest>,
) -> Result<Json<NodeView>, Error> {
    super::operator::require_node(&mut st.store.acquire().await?, &op, id).await?;
    let now = store::unix(st.now());
    let row = st
        .node_ops()
        .set_udp_offload(id, req.udp_offload, now)
        .await?
        .ok_or_else(|| {
            Error::NotFound(format!(
                "no live node with id {id}; `plexctl node list` shows them"
            ))
        })?;
    let setting = req.udp_offload.map_or("default", UdpOffload::as_str);
    tracing::info!(node_id = %id, operator = %op.id, udp_offload = setting, "UDP offload set by an operator");
    let detail = serde_json::json!({"udp_offload": setting, "name": row.dns_name});
    st.audit(super::audit_record::by(
        &op,
        Some(row.domain_id),
        "node.udp-offload",
        format!("node/{id}"),
        detail,
    ))
    .await;
    Ok(Json(node_view(&row, now, st.config.offline_after_secs())?))
}
