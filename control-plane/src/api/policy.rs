//! The access policy routes (issue 25, docs/api.md "Access policy"): a Domain's document,
//! its validation, changes and rollbacks (admin), history, explain, and node tags.
//!
//! Who may do what: every token that sees the Domain (read-only and up; a project-limited
//! token sees its Project's Domain) may get the document, its history, explain and validate
//! (validate is a POST that stores nothing). Changing or rolling back the policy needs an
//! admin token not limited to a Project: the policy governs every Project of the Domain.
//! Tagging a node needs an operator or admin token not limited to a Project: a tag's reach
//! is what the Domain's policy grants it, across Projects.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use plexsphere_wire::admin::{List, NodeView};
use plexsphere_wire::policy_admin::{
    PolicyChange, PolicyExplanation, PolicyValidation, PolicyVersionView, PolicyView,
    RollbackPolicyRequest, SetPolicyRequest, SetTagsRequest, ValidatePolicyRequest,
};
use serde::Deserialize;

use super::extract::{ApiJson, Operator, UuidPath};
use super::signing_keys::visible_domain;
use super::state::AppState;
use crate::error::Error;
use crate::policy::ops::{ChangeRequest, POLICY_BODY_LIMIT};
use crate::store::policies::{self, MAX_HISTORY_PAGE, PolicyRow};
use crate::store::{self, StoreError, from_unix};
use crate::views::node_view;

/// How many versions `policy/history` lists when `?limit=` is absent.
pub(crate) const DEFAULT_HISTORY_PAGE: u32 = 20;

fn author(op: &Operator) -> String {
    format!("{} ({})", op.name, op.id)
}

fn view(row: &PolicyRow) -> Result<PolicyView, StoreError> {
    Ok(PolicyView {
        domain_id: row.domain_id,
        version: row.version,
        document: row.document.clone(),
        author: row.author.clone(),
        created_at: from_unix("policies.created_at", row.created_at)?,
        summary: row.summary.clone(),
    })
}

/// `GET /v1/domains/{domain}/policy`: the document in force.
pub async fn get(
    State(st): State<Arc<AppState>>,
    op: Operator,
    Path(domain): Path<String>,
) -> Result<Json<PolicyView>, Error> {
    let domain = visible_domain(&st, &op, &domain).await?;
    let row = policies::current_or_default(&mut *st.store.acquire().await?, domain.id).await?;
    Ok(Json(view(&row)?))
}

/// `POST /v1/domains/{domain}/policy/validate`: parse, names against the Domain, the
/// document's tests. 200 either way; stores nothing.
pub(crate) async fn validate(
    State(st): State<Arc<AppState>>,
    op: Operator,
    Path(domain): Path<String>,
    ApiJson(req): ApiJson<ValidatePolicyRequest, POLICY_BODY_LIMIT>,
) -> Result<Json<PolicyValidation>, Error> {
    let domain = visible_domain(&st, &op, &domain).await?;
    let now = store::unix(st.now());
    let inv = policies::inventory(&mut *st.store.acquire().await?, domain.id, now).await?;
    Ok(Json(
        match plexsphere_policy::validate(&req.document, &inv) {
            Ok(_) => PolicyValidation {
                valid: true,
                errors: Vec::new(),
            },
            Err(errs) => PolicyValidation {
                valid: false,
                errors: super::error::policy_problems(&errs),
            },
        },
    ))
}

/// `PUT /v1/domains/{domain}/policy` (admin): 200 with the diff, applied unless `dry_run`;
/// 422 `policy_invalid` with the problems; 409 when the version moved.
pub(crate) async fn set(
    State(st): State<Arc<AppState>>,
    op: Operator,
    Path(domain): Path<String>,
    ApiJson(req): ApiJson<SetPolicyRequest, POLICY_BODY_LIMIT>,
) -> Result<Json<PolicyChange>, Error> {
    let domain = visible_domain(&st, &op, &domain).await?;
    op.domain_wide(
        domain.id,
        "a Domain's access policy governs every project of the Domain",
    )?;
    let author = author(&op);
    let change = st
        .policy_ops()
        .change(ChangeRequest {
            domain_id: domain.id,
            document: &req.document,
            expected_version: req.expected_version,
            dry_run: req.dry_run,
            author: &author,
            note: None,
            now: store::unix(st.now()),
        })
        .await?;
    if change.applied {
        let detail = serde_json::json!({"previous_version": change.previous_version, "version": change.version, "diff": change.diff});
        st.audit(super::audit_record::by(
            &op,
            Some(domain.id),
            "policy.set",
            format!("domain/{}", domain.id),
            detail,
        ))
        .await;
    }
    Ok(Json(change))
}

#[derive(Debug, Deserialize)]
pub(crate) struct HistoryQuery {
    limit: Option<u32>,
    before: Option<u64>,
}

/// `GET /v1/domains/{domain}/policy/history?limit=&before=`: newest first.
pub async fn history(
    State(st): State<Arc<AppState>>,
    op: Operator,
    Path(domain): Path<String>,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<List<PolicyVersionView>>, Error> {
    let domain = visible_domain(&st, &op, &domain).await?;
    let Query(q) = query.map_err(|e| Error::BadRequest(format!("bad query string: {e}")))?;
    let limit = q.limit.unwrap_or(DEFAULT_HISTORY_PAGE);
    if !(1..=MAX_HISTORY_PAGE).contains(&limit) {
        return Err(Error::BadRequest(format!(
            "limit must be between 1 and {MAX_HISTORY_PAGE}; page with ?before=VERSION"
        )));
    }
    let rows =
        policies::history(&mut *st.store.acquire().await?, domain.id, limit, q.before).await?;
    let items = rows
        .iter()
        .map(|r| {
            Ok(PolicyVersionView {
                version: r.version,
                author: r.author.clone(),
                created_at: from_unix("policies.created_at", r.created_at)?,
                summary: r.summary.clone(),
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Json(List { items }))
}

/// `POST /v1/domains/{domain}/policy/rollback` (admin): version `version`'s document again,
/// as a new version, validated against the Domain as it is today.
pub(crate) async fn rollback(
    State(st): State<Arc<AppState>>,
    op: Operator,
    Path(domain): Path<String>,
    ApiJson(req): ApiJson<RollbackPolicyRequest>,
) -> Result<Json<PolicyChange>, Error> {
    let domain = visible_domain(&st, &op, &domain).await?;
    op.domain_wide(
        domain.id,
        "a Domain's access policy governs every project of the Domain",
    )?;
    let old = policies::get(&mut *st.store.acquire().await?, domain.id, req.version)
        .await?
        .ok_or_else(|| {
            Error::NotFound(format!(
                "no version {} of Domain {}'s policy; `plexctl policy history` lists them",
                req.version, domain.slug
            ))
        })?;
    let author = author(&op);
    let note = format!("rollback to version {}", req.version);
    let change = st
        .policy_ops()
        .change(ChangeRequest {
            domain_id: domain.id,
            document: &old.document,
            expected_version: req.expected_version,
            dry_run: req.dry_run,
            author: &author,
            note: Some(&note),
            now: store::unix(st.now()),
        })
        .await?;
    if change.applied {
        let detail = serde_json::json!({"to_version": req.version, "previous_version": change.previous_version, "version": change.version, "diff": change.diff});
        st.audit(super::audit_record::by(
            &op,
            Some(domain.id),
            "policy.rollback",
            format!("domain/{}", domain.id),
            detail,
        ))
        .await;
    }
    Ok(Json(change))
}

#[derive(Debug, Deserialize)]
pub(crate) struct ExplainQuery {
    src: String,
    dst: String,
    what: Option<String>,
}

/// `GET /v1/domains/{domain}/policy/explain?src=&dst=&what=5432/tcp`: the rule and line that
/// lets `src` reach `dst` (node names or ids), or "no rule allows it" and a rule that would.
pub(crate) async fn explain(
    State(st): State<Arc<AppState>>,
    op: Operator,
    Path(domain): Path<String>,
    query: Result<Query<ExplainQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<PolicyExplanation>, Error> {
    let domain = visible_domain(&st, &op, &domain).await?;
    let Query(q) = query.map_err(|e| {
        Error::BadRequest(format!(
            "bad query string: {e}; give ?src=NODE&dst=NODE and optionally &what=5432/tcp"
        ))
    })?;
    let what = q
        .what
        .as_deref()
        .filter(|w| !w.is_empty())
        .map(plexsphere_policy::parse_what)
        .transpose()
        .map_err(Error::BadRequest)?;
    let now = store::unix(st.now());
    let mut c = st.store.acquire().await?;
    let row = policies::current_or_default(&mut c, domain.id).await?;
    let inv = policies::inventory(&mut c, domain.id, now).await?;
    drop(c);
    let find = |name: &str| {
        inv.find_node(name).ok_or_else(|| {
            Error::NotFound(format!(
                "no live node {name:?} in Domain {}; `plexctl node list` shows them",
                domain.slug
            ))
        })
    };
    let src = find(&q.src)?;
    let policy = plexsphere_policy::parse(&row.document).map_err(|e| {
        Error::Internal(format!(
            "the stored policy version {} does not parse: {e}",
            row.version
        ))
    })?;
    // An address outside the mesh (a host behind a subnet router or an exit): the rules,
    // then which router carries it now (issue 27).
    let addr = q
        .dst
        .parse::<std::net::IpAddr>()
        .ok()
        .filter(|a| !inv.nodes.iter().any(|n| n.addrs().any(|m| m == *a)));
    let e = match addr {
        Some(a) => {
            let mut e = plexsphere_policy::explain_address(&policy, src, a, what);
            let mut c = st.store.acquire().await?;
            let routes = crate::routes::ops::route_inventory(&mut c, domain.id).await?;
            drop(c);
            e.lines.push(carried_by(&routes, &inv, src.id, a));
            e
        }
        None => plexsphere_policy::explain(&policy, src, find(&q.dst)?, what),
    };
    Ok(Json(PolicyExplanation {
        version: row.version,
        allowed: e.allowed,
        lines: e.lines,
    }))
}

/// `PUT /v1/nodes/{node_id}/tags` (operator): replaces the node's tags; every node of the
/// Domain pulls its new state (one `resync` event) when the set changed.
pub(crate) async fn set_node_tags(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(id): UuidPath,
    ApiJson(req): ApiJson<SetTagsRequest>,
) -> Result<Json<NodeView>, Error> {
    let tags = crate::tags::normalize(&req.tags).map_err(|e| Error::Invalid(e.to_string()))?;
    let node = super::operator::require_node(&mut st.store.acquire().await?, &op, id).await?;
    op.domain_wide(
        node.domain_id,
        "what a tag reaches is set by the Domain's policy, across projects",
    )?;
    let now = store::unix(st.now());
    let row = st
        .policy_ops()
        .set_tags(id, &tags, now)
        .await?
        .ok_or_else(|| {
            Error::NotFound(format!(
                "no live node with id {id}; `plexctl node list` shows them"
            ))
        })?;
    tracing::info!(node_id = %id, operator = %op.id, tags = ?row.tags, "node tags set by an operator");
    let detail = serde_json::json!({"tags": row.tags, "name": row.dns_name});
    st.audit(super::audit_record::by(
        &op,
        Some(row.domain_id),
        "node.tag",
        format!("node/{id}"),
        detail,
    ))
    .await;
    Ok(Json(node_view(&row, now, st.config.offline_after_secs())?))
}

/// Which router carries `addr` for `src` now: the most specific subnet route in service that
/// holds it, else the exit `src` uses, else none.
fn carried_by(
    routes: &plexsphere_policy::RouteInventory,
    inv: &plexsphere_policy::Inventory,
    src: uuid::Uuid,
    addr: std::net::IpAddr,
) -> String {
    let name = |id: uuid::Uuid| {
        inv.nodes
            .iter()
            .find(|n| n.id == id)
            .map_or_else(|| id.to_string(), |n| n.name.clone())
    };
    let route = routes
        .routes
        .iter()
        .filter(|r| !r.exit && r.cidr.contains(&addr))
        .max_by_key(|r| r.cidr.prefix_len());
    if let Some(r) = route {
        return format!(
            "{addr} is in route {} carried by {} (its primary router now)",
            r.cidr,
            name(r.router)
        );
    }
    match routes
        .routes
        .iter()
        .find(|r| r.exit && r.users.contains(&src))
    {
        Some(r) => format!(
            "{addr} is outside every route: it goes through the exit {}",
            name(r.router)
        ),
        None => format!(
            "no approved route in service holds {addr} and the node uses no exit: nothing carries it (`plexctl route list`)"
        ),
    }
}
