//! Paths (issue 28, docs/api.md "Paths"): a node's report of each peer's path (its own
//! credential), a node's paths, the mesh map and the relays with their health (operators:
//! filtered to the projects the caller sees).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::{Query, State};
use plexsphere_wire::admin::{CandidateView, NatView};
use plexsphere_wire::node::MAX_NODE_BODY;
use plexsphere_wire::paths::{PathsAck, PathsReport, check_report};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::extract::{ApiJson, NodeAuth, Operator, UuidPath};
use super::state::AppState;
use crate::error::Error;
use crate::path_map::{self, MapView, PeerPathView};
use crate::relay_health::RelayView;
use crate::store::paths::{self as rows, MapNode, PathRow};
use crate::store::{self, domains};

/// `PUT /v1/nodes/{id}/paths`: replaces the node's rows. Peers that are not live nodes of the
/// node's Domain (or the node itself) are left out and counted in `ignored`.
pub(crate) async fn report(
    State(st): State<Arc<AppState>>,
    NodeAuth { node }: NodeAuth,
    ApiJson(report): ApiJson<PathsReport, MAX_NODE_BODY>,
) -> Result<Json<PathsAck>, Error> {
    check_report(&report).map_err(|e| Error::Invalid(format!("path report refused: {e}")))?;
    st.paths
        .take_slot(node.id, Instant::now())
        .map_err(Error::PathsTooSoon)?;
    let now = store::unix(st.now());
    let ack = store::retry("path report", Error::is_lost_race, || async {
        let mut tx = st.store.begin().await?;
        let asked: Vec<Uuid> = report.peers.iter().map(|p| p.peer_node_id).collect();
        let live: HashSet<Uuid> = rows::live_in_domain(&mut tx, node.domain_id, &asked).await?;
        let keep: Vec<PathRow> = report
            .peers
            .iter()
            .filter(|p| p.peer_node_id != node.id && live.contains(&p.peer_node_id))
            .map(|p| PathRow {
                node_id: node.id,
                peer_node_id: p.peer_node_id,
                path: p.path.clone(),
                rtt_ms: p.rtt_ms,
                last_handshake_at: p.last_handshake_at,
                updated_at: now,
                seq: 0,
            })
            .collect();
        rows::replace(&mut tx, node.domain_id, node.id, &keep, now).await?;
        tx.commit().await.map_err(store::StoreError::from)?;
        Ok::<_, Error>(PathsAck {
            stored: u32::try_from(keep.len()).unwrap_or(u32::MAX),
            ignored: u32::try_from(report.peers.len() - keep.len()).unwrap_or(u32::MAX),
        })
    })
    .await?;
    if ack.ignored > 0 {
        tracing::debug!(node_id = %node.id, ignored = ack.ignored, "path report: peers outside the node's Domain left out");
    }
    Ok(Json(ack))
}

/// `GET /v1/nodes/{id}/paths`.
#[derive(Debug, Serialize)]
pub(crate) struct NodePathsView {
    pub node_id: Uuid,
    pub candidates: Vec<CandidateView>,
    pub nat: Option<NatView>,
    pub home_relay: Option<String>,
    pub peers: Vec<PeerPathView>,
}

/// `GET /v1/nodes/{id}/paths`: the node's candidates, NAT and each peer's path as the node
/// last reported it (peers in projects the caller does not see are left out).
pub(crate) async fn node_paths(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(id): UuidPath,
) -> Result<Json<NodePathsView>, Error> {
    let mut conn = st.store.acquire().await?;
    let row = super::operator::require_node(&mut conn, &op, id).await?;
    let reported = rows::of_node(&mut conn, id).await?;
    let ids: Vec<Uuid> = reported.iter().map(|r| r.peer_node_id).collect();
    let names: HashMap<Uuid, MapNode> = rows::map_nodes_by_id(&mut conn, &ids)
        .await?
        .into_iter()
        .map(|n| (n.id, n))
        .collect();
    let peers = reported
        .iter()
        .filter_map(|r| {
            let peer = names.get(&r.peer_node_id)?;
            op.sees(peer.project_id)
                .then(|| path_map::peer_view(r, Some(peer.name.clone())))
        })
        .collect();
    let now = store::unix(st.now());
    let view = crate::views::node_view(&row, now, st.config.offline_after_secs())?;
    Ok(Json(NodePathsView {
        node_id: id,
        candidates: view.candidates,
        nat: view.nat,
        home_relay: view.home_relay,
        peers,
    }))
}

#[derive(Debug, Deserialize)]
pub(crate) struct MapQuery {
    pub domain: Option<String>,
}

/// The Domains the caller may ask about: a project-bound caller its project's; others every
/// Domain (or the one asked for, 404 when missing or not seen).
pub(super) async fn seen_domains(
    conn: &mut sqlx::AnyConnection,
    op: &Operator,
    asked: Option<Uuid>,
) -> Result<Vec<Uuid>, Error> {
    let all = op.seen_domains(domains::list(conn).await?.iter().map(|d| d.id));
    match asked {
        None => Ok(all),
        Some(d) if all.contains(&d) => Ok(vec![d]),
        Some(d) => Err(Error::NotFound(format!(
            "no domain {d}; `plexctl domain list` shows the Domains this token sees"
        ))),
    }
}

/// `GET /v1/mesh/map?domain=`: the Domain's live nodes the caller sees and a link per pair
/// with a report from either side; without `domain`, every Domain the caller sees. Two
/// queries per Domain (nodes, paths), whatever its size.
pub(crate) async fn mesh_map(
    State(st): State<Arc<AppState>>,
    op: Operator,
    query: Result<Query<MapQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<MapView>, Error> {
    let Query(q) = query.map_err(|e| Error::BadRequest(format!("bad query string: {e}")))?;
    let asked = q
        .domain
        .map(|d| {
            Uuid::parse_str(&d)
                .map_err(|_| Error::BadRequest(format!("domain {d:?} is not a UUID")))
        })
        .transpose()?;
    let mut conn = st.store.acquire().await?;
    let now = store::unix(st.now());
    let hb = st.config.offline_after_secs();
    let mut out = MapView {
        nodes: vec![],
        links: vec![],
    };
    for d in seen_domains(&mut conn, &op, asked).await? {
        let seen: Vec<MapNode> = rows::map_nodes(&mut conn, d)
            .await?
            .into_iter()
            .filter(|n| op.sees(n.project_id))
            .collect();
        let paths = rows::in_domain(&mut conn, d, 0).await?;
        let m = path_map::map(&seen, &paths, now, hb);
        out.nodes.extend(m.nodes);
        out.links.extend(m.links);
    }
    Ok(Json(out))
}

/// `GET /v1/relays`: the relays this control plane hands out, with their health (probed on
/// demand, `crate::relay_health`).
pub(crate) async fn relays(
    State(st): State<Arc<AppState>>,
    _op: Operator,
) -> Result<Json<Vec<RelayView>>, Error> {
    let at = path_map::rfc3339(store::unix(st.now()));
    Ok(Json(st.paths.relays.views(&st.config.relays, at).await))
}
