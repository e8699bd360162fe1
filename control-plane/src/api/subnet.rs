//! Subnet routes and exits (issue 27, docs/api.md "Routes"): a node's report (its own
//! credential), the route list (every token that sees the nodes), approve and deny (an
//! operator or admin token not limited to a project, as tagging: an approved route carries
//! traffic for every node the Domain's policy lets use it, across projects).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use plexsphere_wire::node::MAX_NODE_BODY;
use plexsphere_wire::routes::{Approval, RouteDecision, RouteEntry, RoutesAck, RoutesReport};

use super::extract::{ApiJson, NodeAuth, Operator};
use super::state::AppState;
use crate::error::Error;
use crate::routes::ops::RouteOps;
use crate::store::{self, domains};

fn ops(st: &AppState) -> RouteOps<'_> {
    RouteOps {
        store: &st.store,
        bus: st.bus.as_ref(),
    }
}

/// `PUT /v1/nodes/{id}/routes`.
pub(crate) async fn report(
    State(st): State<Arc<AppState>>,
    NodeAuth { node }: NodeAuth,
    ApiJson(report): ApiJson<RoutesReport, MAX_NODE_BODY>,
) -> Result<Json<RoutesAck>, Error> {
    let now = store::unix(st.now());
    Ok(Json(ops(&st).report(node.id, &report, now).await?))
}

/// `GET /v1/routes`: the routes of every Domain the token sees.
pub async fn list(
    State(st): State<Arc<AppState>>,
    op: Operator,
) -> Result<Json<Vec<RouteEntry>>, Error> {
    let mut conn = st.store.acquire().await?;
    let seen = op.seen_domains(domains::list(&mut conn).await?.iter().map(|d| d.id));
    drop(conn);
    let now = store::unix(st.now());
    Ok(Json(ops(&st).list(&seen, now).await?))
}

async fn decide(
    st: &AppState,
    op: &Operator,
    req: &RouteDecision,
    approval: Approval,
) -> Result<Json<RouteEntry>, Error> {
    let node =
        super::operator::require_node(&mut st.store.acquire().await?, op, req.node_id).await?;
    op.domain_wide(
        node.domain_id,
        "approving or denying a route reaches the whole Domain: an approved route carries traffic for every node the Domain's policy lets use it",
    )?;
    let now = store::unix(st.now());
    let by = format!("{} ({})", op.name, op.id);
    let entry = ops(st)
        .decide(req.node_id, req.cidr, approval, &by, now)
        .await?
        .ok_or_else(|| {
            Error::NotFound(format!(
                "node {} does not advertise {}; `plexctl route list` shows what each node advertises",
                req.node_id, req.cidr
            ))
        })?;
    let action = match approval {
        Approval::Approved => "route.approve",
        _ => "route.deny",
    };
    let detail = serde_json::json!({"cidr": req.cidr.to_string(), "name": node.dns_name});
    st.audit(super::audit_record::by(
        op,
        Some(node.domain_id),
        action,
        format!("node/{}", req.node_id),
        detail,
    ))
    .await;
    Ok(Json(entry))
}

/// `POST /v1/routes/approve`.
pub(crate) async fn approve(
    State(st): State<Arc<AppState>>,
    op: Operator,
    ApiJson(req): ApiJson<RouteDecision>,
) -> Result<Json<RouteEntry>, Error> {
    decide(&st, &op, &req, Approval::Approved).await
}

/// `POST /v1/routes/deny`.
pub(crate) async fn deny(
    State(st): State<Arc<AppState>>,
    op: Operator,
    ApiJson(req): ApiJson<RouteDecision>,
) -> Result<Json<RouteEntry>, Error> {
    decide(&st, &op, &req, Approval::Denied).await
}
