//! Subnet routes and exits (issue 27, docs/api.md "Routes"): a node's report (its own
//! credential), the route list (every token that sees the nodes), approve and deny (an
//! operator or admin token not limited to a project, as tagging: an approved route carries
//! traffic for every node the Domain's policy lets use it, across projects).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use plexsphere_wire::node::MAX_NODE_BODY;
use plexsphere_wire::routes::{Approval, RouteDecision, RouteEntry, RoutesAck, RoutesReport};
use uuid::Uuid;

use super::extract::{ApiJson, NodeAuth, Operator};
use super::names::unlimited;
use super::state::AppState;
use crate::error::Error;
use crate::routes_ops::RouteOps;
use crate::store::{self, domains, projects};

fn ops(st: &AppState) -> RouteOps<'_> {
    RouteOps {
        store: &st.store,
        bus: st.bus.as_ref(),
    }
}

/// `PUT /v1/nodes/{id}/routes`.
pub async fn report(
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
    let seen: Vec<Uuid> = match op.project_id {
        None => domains::list(&mut conn)
            .await?
            .iter()
            .map(|d| d.id)
            .collect(),
        Some(p) => projects::get(&mut conn, p)
            .await?
            .map(|p| vec![p.domain_id])
            .unwrap_or_default(),
    };
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
    super::operator::require_node(&mut st.store.acquire().await?, op, req.node_id).await?;
    unlimited(
        op,
        "approving or denying a route needs an operator or admin token that is not limited to a project: an approved route carries traffic for every node the Domain's policy lets use it",
    )?;
    let now = store::unix(st.now());
    let by = format!("{} ({})", op.name, op.id);
    ops(st)
        .decide(req.node_id, req.cidr, approval, &by, now)
        .await?
        .map(Json)
        .ok_or_else(|| {
            Error::NotFound(format!(
                "node {} does not advertise {}; `plexctl route list` shows what each node advertises",
                req.node_id, req.cidr
            ))
        })
}

/// `POST /v1/routes/approve`.
pub async fn approve(
    State(st): State<Arc<AppState>>,
    op: Operator,
    ApiJson(req): ApiJson<RouteDecision>,
) -> Result<Json<RouteEntry>, Error> {
    decide(&st, &op, &req, Approval::Approved).await
}

/// `POST /v1/routes/deny`.
pub async fn deny(
    State(st): State<Arc<AppState>>,
    op: Operator,
    ApiJson(req): ApiJson<RouteDecision>,
) -> Result<Json<RouteEntry>, Error> {
    decide(&st, &op, &req, Approval::Denied).await
}
