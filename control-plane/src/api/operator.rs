//! The operator endpoints (`Authorization: Bearer pxop_...`).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use plexsphere_wire::admin::{
    CreateOperatorToken, CreatedOperatorToken, DomainView, IssueTokenRequest, IssuedToken, List,
    NodeView, OperatorTokenView, ProjectView, TokenView,
};
use plexsphere_wire::secret::{BootstrapToken, valid_env_prefix};
use serde::Deserialize;
use uuid::Uuid;

use super::extract::{ApiJson, Operator, TokenIdPath, UuidPath};
use super::state::AppState;
use crate::audit;
use crate::error::Error;
use crate::operator_tokens::{self, OperatorTokenError, TokenSpec};
use crate::store::nodes::NodeRow;
use crate::store::tokens::{TokenRow, TokenUsage};
use crate::store::{self, Conn, StoreError, domains, nodes, operators, projects, tokens};
use crate::views::{clone_view, node_view, token_view};

const MIN_TTL_SECS: u64 = 60;
const MAX_TTL_SECS: u64 = 30 * 24 * 3600;

/// A project-bound token sees the Domain of its project only.
pub(crate) async fn list_domains(
    State(st): State<Arc<AppState>>,
    op: Operator,
) -> Result<Json<List<DomainView>>, Error> {
    let mut c = st.store.acquire().await?;
    let rows = domains::list(&mut c).await?;
    let mut items = Vec::with_capacity(rows.len());
    for d in rows {
        if !op.sees_domain(d.id) {
            continue;
        }
        items.push(DomainView {
            id: d.id,
            signing_public_key: st.keys.signer(&d).await?.public_key_b64(),
            slug: d.slug,
            mesh_cidr: d.mesh_cidr,
        });
    }
    Ok(Json(List { items }))
}

pub(crate) async fn list_projects(
    State(st): State<Arc<AppState>>,
    op: Operator,
) -> Result<Json<List<ProjectView>>, Error> {
    let rows = projects::list(&mut *st.store.acquire().await?).await?;
    let items = rows
        .into_iter()
        .filter(|p| op.sees(p.id))
        .map(|p| ProjectView {
            id: p.id,
            domain_id: p.domain_id,
            slug: p.slug,
            display_name: p.display_name,
            sub_range_cidr: p.sub_range_cidr,
        })
        .collect();
    Ok(Json(List { items }))
}

fn no_project(id: Uuid) -> Error {
    Error::NotFound(format!(
        "no project with id {id}; `plexctl project list` shows them"
    ))
}

fn no_node(id: Uuid) -> Error {
    Error::NotFound(format!(
        "no node with id {id}; `plexctl node list` shows them"
    ))
}

/// Not found (404) unless the Project exists and the operator's token may see it (to a
/// project-bound token, other projects do not exist).
/// The project's Domain, or 404 when there is no such project or the caller may not see it.
pub(super) async fn require_project(c: &mut Conn, op: &Operator, id: Uuid) -> Result<Uuid, Error> {
    op.require(id, || no_project(id))?;
    match projects::get(c, id).await? {
        Some(p) => Ok(p.domain_id),
        None => Err(no_project(id)),
    }
}

/// The node, or 404 when there is none or it is in a project the token may not see.
pub(super) async fn require_node(c: &mut Conn, op: &Operator, id: Uuid) -> Result<NodeRow, Error> {
    let row = nodes::get(c, id).await?.ok_or_else(|| no_node(id))?;
    op.require(row.project_id, || no_node(id))?;
    Ok(row)
}

pub(crate) async fn issue_token(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(project_id): UuidPath,
    ApiJson(req): ApiJson<IssueTokenRequest>,
) -> Result<(StatusCode, Json<IssuedToken>), Error> {
    if !valid_env_prefix(&req.env_prefix) {
        return Err(Error::Invalid(
            "env_prefix must be 1-16 characters of a-z and 0-9".into(),
        ));
    }
    if !(MIN_TTL_SECS..=MAX_TTL_SECS).contains(&req.ttl_secs) {
        return Err(Error::Invalid(format!(
            "ttl_secs must be between {MIN_TTL_SECS} (1 minute) and {MAX_TTL_SECS} (30 days)"
        )));
    }
    let usage = TokenUsage::checked(req.max_uses.unwrap_or(1), req.ephemeral_offline_secs)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let tags = crate::tags::normalize(&req.tags).map_err(|e| Error::Invalid(e.to_string()))?;
    let mut c = st.store.acquire().await?;
    let domain = require_project(&mut c, &op, project_id).await?;
    if !tags.is_empty() {
        op.domain_wide(
            domain,
            "issuing a bootstrap token with tags: every node the token makes gets those tags, and what a tag reaches is set by the Domain's policy, across projects",
        )?;
    }
    let token = BootstrapToken::generate(&req.env_prefix, req.kind)
        .map_err(|e| Error::Internal(e.to_string()))?;
    let row = TokenRow::issued(&token, project_id, st.now(), req.ttl_secs, None)
        .with_usage(usage)
        .with_tags(tags);
    // The token and its audit row commit together.
    let domain = projects::get(&mut c, project_id)
        .await?
        .map(|p| p.domain_id);
    drop(c);
    let pepper = st
        .pepper_key()
        .map_err(|e| Error::Internal(e.to_string()))?;
    let detail = serde_json::json!({"project_id": project_id, "kind": req.kind, "max_uses": usage.max_uses,
        "ephemeral_offline_secs": usage.ephemeral_offline_secs, "tags": row.tags, "expires_at": row.expires_at});
    let entry = super::audit_record::by(
        &op,
        domain,
        "token.issue",
        format!("bootstrap-token/{}", row.id),
        detail,
    );
    let mut tx = st.store.begin().await?;
    tokens::insert(&mut tx, &row).await?;
    audit::record(&mut tx, &pepper, &entry, row.created_at).await?;
    tx.commit().await.map_err(StoreError::from)?;
    tracing::info!(
        token_id = %row.id, project_id = %project_id, operator = %op.id,
        max_uses = usage.max_uses, ephemeral_offline_secs = ?usage.ephemeral_offline_secs,
        tags = ?row.tags, "bootstrap token issued"
    );
    let view = token_view(&row, row.created_at)?;
    Ok((
        StatusCode::CREATED,
        Json(IssuedToken {
            id: row.id,
            token: token.expose(),
            project_id,
            kind: req.kind,
            env_prefix: req.env_prefix,
            created_at: view.created_at,
            expires_at: view.expires_at,
            max_uses: usage.max_uses,
            ephemeral_offline_secs: usage.ephemeral_offline_secs,
            tags: row.tags.clone(),
        }),
    ))
}

pub(crate) async fn list_tokens(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(project_id): UuidPath,
) -> Result<Json<List<TokenView>>, Error> {
    let mut c = st.store.acquire().await?;
    require_project(&mut c, &op, project_id).await?;
    let now = store::unix(st.now());
    let mut made = nodes::made_by_tokens_of_project(&mut c, project_id).await?;
    let items = tokens::list_for_project(&mut c, project_id)
        .await?
        .iter()
        .map(|r| {
            let mut v = token_view(r, now)?;
            v.nodes = made.remove(&r.id).unwrap_or_default();
            Ok(v)
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Json(List { items }))
}

pub(crate) async fn revoke_token(
    State(st): State<Arc<AppState>>,
    op: Operator,
    TokenIdPath(id): TokenIdPath,
) -> Result<Json<TokenView>, Error> {
    let mut c = st.store.acquire().await?;
    let now = store::unix(st.now());
    if !op.reach.all {
        let project = tokens::get(&mut c, &id).await?.map(|t| t.project_id);
        if !project.is_some_and(|p| op.sees(p)) {
            return Err(Error::NotFound(format!("no bootstrap token with id {id}")));
        }
    }
    if !tokens::revoke(&mut c, &id, now).await? {
        return match tokens::get(&mut c, &id).await? {
            None => Err(Error::NotFound(format!("no bootstrap token with id {id}"))),
            Some(_) => Err(Error::Conflict(format!(
                "bootstrap token {id} is used up (every use it allows was taken); revoke its nodes instead"
            ))),
        };
    }
    let row = tokens::get(&mut c, &id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no bootstrap token with id {id}")))?;
    tracing::info!(token_id = %id, operator = %op.id, "bootstrap token revoked");
    let detail = serde_json::json!({"project_id": row.project_id});
    st.audit_in_project(
        row.project_id,
        super::audit_record::by(
            &op,
            None,
            "token.revoke",
            format!("bootstrap-token/{id}"),
            detail,
        ),
    )
    .await;
    Ok(Json(token_view(&row, now)?))
}

#[derive(Debug, Deserialize)]
pub(crate) struct NodeQuery {
    project_id: Option<String>,
}

/// A project-bound token lists its project's nodes (none when `?project_id=` names another).
pub(crate) async fn list_nodes(
    State(st): State<Arc<AppState>>,
    op: Operator,
    query: Result<Query<NodeQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<List<NodeView>>, Error> {
    let Query(q) = query.map_err(|e| Error::BadRequest(format!("bad query string: {e}")))?;
    let project_id = q
        .project_id
        .map(|p| {
            Uuid::parse_str(&p)
                .map_err(|_| Error::BadRequest(format!("project_id {p:?} is not a UUID")))
        })
        .transpose()?;
    if let Some(p) = project_id
        && !op.sees(p)
    {
        return Ok(Json(List { items: Vec::new() }));
    }
    // One reached project: the store filters; a person reaching several (or Domains): every
    // node, filtered to what they see.
    let project_id = project_id.or(match op.reached_projects.as_slice() {
        [(only, _)] => Some(*only),
        _ => op
            .project_id
            .filter(|_| op.reached_projects.is_empty() && !op.reach.all),
    });
    let now = store::unix(st.now());
    let hb = st.config.offline_after_secs();
    let mut conn = st.store.acquire().await?;
    let clones = nodes::hosts::clones(&mut conn).await?;
    let items = nodes::list(&mut conn, project_id)
        .await?
        .iter()
        .filter(|n| op.sees(n.project_id))
        .map(|n| {
            let mut v = node_view(n, now, hb)?;
            v.clone = clones.get(&n.id).map(clone_view).transpose()?;
            Ok(v)
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Json(List { items }))
}

pub(crate) async fn get_node(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(id): UuidPath,
) -> Result<Json<NodeView>, Error> {
    let mut conn = st.store.acquire().await?;
    let row = require_node(&mut conn, &op, id).await?;
    let now = store::unix(st.now());
    let mut view = node_view(&row, now, st.config.offline_after_secs())?;
    view.clone = nodes::hosts::clone_of(&mut conn, id)
        .await?
        .as_ref()
        .map(clone_view)
        .transpose()?;
    Ok(Json(view))
}

/// `POST /v1/nodes/{id}/revoke`: idempotent; the node hears `node_revoked` on its stream and
/// its peers `peer_removed`; its credential stops working.
pub(crate) async fn revoke_node(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(id): UuidPath,
) -> Result<Json<NodeView>, Error> {
    require_node(&mut st.store.acquire().await?, &op, id).await?;
    let now = store::unix(st.now());
    let row = st
        .node_ops()
        .revoke(id, now)
        .await?
        .ok_or_else(|| no_node(id))?;
    tracing::info!(node_id = %id, operator = %op.id, "node revocation requested by an operator");
    let detail = serde_json::json!({"project_id": row.project_id, "name": row.dns_name});
    st.audit(super::audit_record::by(
        &op,
        Some(row.domain_id),
        "node.revoke",
        format!("node/{id}"),
        detail,
    ))
    .await;
    Ok(Json(node_view(&row, now, st.config.offline_after_secs())?))
}

/// `GET /v1/operator-tokens/self`: the calling token (scope, project, expiry, last use).
pub(crate) async fn whoami(
    State(st): State<Arc<AppState>>,
    op: Operator,
) -> Result<Json<OperatorTokenView>, Error> {
    let row = operators::get(&mut *st.store.acquire().await?, &op.id)
        .await?
        .ok_or(Error::Unauthorized(
            "the operator token was deleted while this request ran",
        ))?;
    Ok(Json(operator_tokens::view(&row, store::unix(st.now()))?))
}

/// `GET /v1/operator-tokens` (admin): every operator token, never a secret.
pub(crate) async fn list_operator_tokens(
    State(st): State<Arc<AppState>>,
    _op: Operator,
) -> Result<Json<List<OperatorTokenView>>, Error> {
    let now = store::unix(st.now());
    let items = operator_tokens::list(&st.store)
        .await?
        .iter()
        .map(|r| operator_tokens::view(r, now))
        .collect::<Result<_, _>>()?;
    Ok(Json(List { items }))
}

fn token_error(e: OperatorTokenError) -> Error {
    match e {
        OperatorTokenError::Store(s) => Error::Store(s),
        OperatorTokenError::Random => Error::Internal(e.to_string()),
        OperatorTokenError::UnknownProject(_) => Error::NotFound(e.to_string()),
        other => Error::Invalid(other.to_string()),
    }
}

/// `POST /v1/operator-tokens` (admin): 201 with the token's text, shown this once.
pub(crate) async fn create_operator_token(
    State(st): State<Arc<AppState>>,
    op: Operator,
    ApiJson(req): ApiJson<CreateOperatorToken>,
) -> Result<(StatusCode, Json<CreatedOperatorToken>), Error> {
    let expiry = operator_tokens::parse_expires_in(
        req.expires_in
            .as_deref()
            .unwrap_or(operator_tokens::DEFAULT_EXPIRES_IN),
    )
    .map_err(token_error)?;
    let spec = TokenSpec {
        name: req.name,
        scope: req.scope,
        project_id: req.project_id,
        expiry,
    };
    let now = st.now();
    let (token, row) = operator_tokens::create_scoped(&st.store, &spec, now)
        .await
        .map_err(token_error)?;
    tracing::info!(operator_token_id = %row.id, operator = %op.id, "operator token created through the API");
    let detail = serde_json::json!({"name": row.name, "scope": row.scope, "project_id": row.project_id, "expires_at": row.expires_at});
    st.audit(super::audit_record::by(
        &op,
        None,
        "operator-token.create",
        format!("operator-token/{}", row.id),
        detail,
    ))
    .await;
    Ok((
        StatusCode::CREATED,
        Json(CreatedOperatorToken {
            token: token.expose(),
            view: operator_tokens::view(&row, store::unix(now))?,
        }),
    ))
}

/// `POST /v1/operator-tokens/{id}/revoke` (admin): idempotent.
pub(crate) async fn revoke_operator_token(
    State(st): State<Arc<AppState>>,
    op: Operator,
    TokenIdPath(id): TokenIdPath,
) -> Result<Json<OperatorTokenView>, Error> {
    let now = st.now();
    let not_found = || {
        Error::NotFound(format!(
            "no operator token with id {id}; `plexctl operator-token list` shows them"
        ))
    };
    if !operator_tokens::revoke(&st.store, &id, now).await? {
        return Err(not_found());
    }
    let row = operators::get(&mut *st.store.acquire().await?, &id)
        .await?
        .ok_or_else(not_found)?;
    tracing::info!(operator_token_id = %id, operator = %op.id, "operator token revoked through the API");
    let detail = serde_json::json!({"name": row.name});
    st.audit(super::audit_record::by(
        &op,
        None,
        "operator-token.revoke",
        format!("operator-token/{id}"),
        detail,
    ))
    .await;
    Ok(Json(operator_tokens::view(&row, store::unix(now))?))
}
