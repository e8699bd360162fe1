//! DNS names (issue 27, docs/api.md "Names"): renaming a node (operator or admin not limited
//! to a Project, as tagging: a name is what every node of the Domain resolves), and a
//! Domain's DNS suffix (read: every token that sees the Domain; set: admin not limited to a
//! Project, it renames every node of the Domain at once).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use plexsphere_wire::admin::NodeView;
use plexsphere_wire::routes::{DnsSettings, RenameRequest};

use super::extract::{ApiJson, Operator, UuidPath};
use super::signing_keys::visible_domain;
use super::state::AppState;
use crate::error::Error;
use crate::node::names::Renamed;
use crate::store::{self, names};
use crate::views::node_view;

/// `PUT /v1/nodes/{id}/name`: the node as it is now; 422 for a name that is not a DNS label,
/// 409 `name_taken`.
pub(crate) async fn rename(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(id): UuidPath,
    ApiJson(req): ApiJson<RenameRequest>,
) -> Result<Json<NodeView>, Error> {
    let node = super::operator::require_node(&mut st.store.acquire().await?, &op, id).await?;
    op.domain_wide(
        node.domain_id,
        "renaming a node reaches the whole Domain: every node of the Domain resolves the name",
    )?;
    let now = store::unix(st.now());
    match st.name_ops().rename(id, &req.name, now).await? {
        Renamed::NoNode => Err(Error::NotFound(format!(
            "no live node with id {id}; `plexctl node list` shows them"
        ))),
        Renamed::Done(row) => {
            tracing::info!(node_id = %id, operator = %op.id, name = %row.dns_name, "node renamed by an operator");
            let detail = serde_json::json!({"name": row.dns_name});
            st.audit(super::audit_record::by(
                &op,
                Some(row.domain_id),
                "node.rename",
                format!("node/{id}"),
                detail,
            ))
            .await;
            Ok(Json(node_view(&row, now, st.config.offline_after_secs())?))
        }
    }
}

/// `GET /v1/domains/{domain}/dns`.
pub(crate) async fn get_dns(
    State(st): State<Arc<AppState>>,
    op: Operator,
    Path(domain): Path<String>,
) -> Result<Json<DnsSettings>, Error> {
    let domain = visible_domain(&st, &op, &domain).await?;
    let suffix = names::suffix(&mut *st.store.acquire().await?, domain.id).await?;
    Ok(Json(DnsSettings { suffix }))
}

/// `PUT /v1/domains/{domain}/dns`: answers the settings as stored.
pub(crate) async fn set_dns(
    State(st): State<Arc<AppState>>,
    op: Operator,
    Path(domain): Path<String>,
    ApiJson(req): ApiJson<DnsSettings>,
) -> Result<Json<DnsSettings>, Error> {
    let domain = visible_domain(&st, &op, &domain).await?;
    op.domain_wide(
        domain.id,
        "setting the DNS suffix renames every node of the Domain",
    )?;
    let now = store::unix(st.now());
    if !st
        .name_ops()
        .set_suffix(domain.id, &req.suffix, now)
        .await?
    {
        return Err(Error::NotFound("the Domain is gone".into()));
    }
    tracing::info!(domain_id = %domain.id, operator = %op.id, suffix = %req.suffix, "DNS suffix set by an operator");
    let detail = serde_json::json!({"suffix": req.suffix});
    st.audit(super::audit_record::by(
        &op,
        Some(domain.id),
        "domain.dns-suffix",
        format!("domain/{}", domain.id),
        detail,
    ))
    .await;
    Ok(Json(DnsSettings { suffix: req.suffix }))
}
