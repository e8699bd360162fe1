//! `/v1/role-bindings`: roles bound to the issuer's subjects, e-mail addresses or groups.
//! Only a platform admin (or a Domain admin for its Domain and its projects) binds and
//! unbinds; a listing shows the bindings on scopes the caller reaches.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::extract::{ApiJson, Operator};
use super::state::AppState;
use crate::auth::roles::{Role, RoleScope, may_bind};
use crate::error::Error;
use crate::store::{self, domains, projects, roles as role_store};

/// The longest subject, e-mail address or group name a binding takes.
pub(crate) const MAX_PRINCIPAL: usize = 255;

/// The body of `POST /v1/role-bindings`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BindRequest {
    /// `admin`, `auditor` or `member`.
    pub role: String,
    /// `platform`, `domain` or `project`.
    pub scope: String,
    /// The Domain's or Project's id (absent for the platform).
    #[serde(default)]
    pub scope_id: Option<Uuid>,
    /// `subject`, `email` or `group`.
    pub principal_kind: String,
    pub principal: String,
}

fn view(b: &role_store::BindingRow) -> Value {
    json!({
        "id": b.id,
        "role": b.role,
        "scope": { "kind": b.scope_kind, "id": if b.scope_id.is_empty() { None } else { Some(&b.scope_id) } },
        "principal_kind": b.principal_kind,
        "principal": b.principal,
        "created_at": b.created_at,
        "created_by": b.created_by,
    })
}

fn actor(op: &Operator) -> String {
    match &op.via {
        super::extract::Via::Token => format!("token:{}", op.id),
        super::extract::Via::Session { session_id } => format!("session:{session_id}"),
    }
}

/// The Domain a scope belongs to (a project's Domain), or 404 for a scope that does not exist.
async fn scope_domain(conn: &mut store::Conn, scope: RoleScope) -> Result<Option<Uuid>, Error> {
    match scope {
        RoleScope::Platform => Ok(None),
        RoleScope::Domain(d) => match domains::get(conn, d).await? {
            Some(_) => Ok(Some(d)),
            None => Err(Error::NotFound(format!(
                "no Domain with id {d}; `plexctl domain list` shows them"
            ))),
        },
        RoleScope::Project(p) => match projects::get(conn, p).await? {
            Some(row) => Ok(Some(row.domain_id)),
            None => Err(Error::NotFound(format!(
                "no project with id {p}; `plexctl project list` shows them"
            ))),
        },
    }
}

/// `GET /v1/role-bindings`: the bindings on scopes the caller reaches.
pub async fn list(State(st): State<Arc<AppState>>, op: Operator) -> Result<Json<Value>, Error> {
    let mut conn = st.store.acquire().await?;
    let rows = role_store::list(&mut conn).await?;
    let items: Vec<Value> = rows
        .iter()
        .filter(|b| match RoleScope::parse(&b.scope_kind, &b.scope_id) {
            Some(RoleScope::Platform) => op.reach.all,
            Some(RoleScope::Domain(d)) => op.sees_domain(d),
            Some(RoleScope::Project(p)) => op.sees(p),
            None => false,
        })
        .map(view)
        .collect();
    Ok(Json(json!({ "items": items })))
}

/// `POST /v1/role-bindings`: 201 with the binding; 409 if the same binding exists.
pub(crate) async fn bind(
    State(st): State<Arc<AppState>>,
    op: Operator,
    ApiJson(req): ApiJson<BindRequest>,
) -> Result<(StatusCode, Json<Value>), Error> {
    let role = Role::parse(&req.role).ok_or_else(|| {
        Error::Invalid(format!(
            "role {:?} is not one of admin, auditor, member",
            req.role
        ))
    })?;
    let scope = match (req.scope.as_str(), req.scope_id) {
        ("platform", None) => RoleScope::Platform,
        ("domain", Some(d)) => RoleScope::Domain(d),
        ("project", Some(p)) => RoleScope::Project(p),
        _ => {
            return Err(Error::Invalid(
                "scope is `platform` (no scope_id), or `domain` or `project` with its scope_id"
                    .into(),
            ));
        }
    };
    if !matches!(req.principal_kind.as_str(), "subject" | "email" | "group") {
        return Err(Error::Invalid(format!(
            "principal_kind {:?} is not one of subject, email, group",
            req.principal_kind
        )));
    }
    let principal = req.principal.trim();
    if principal.is_empty()
        || principal.len() > MAX_PRINCIPAL
        || principal.chars().any(char::is_control)
    {
        return Err(Error::Invalid(format!(
            "principal must be 1-{MAX_PRINCIPAL} characters without control characters"
        )));
    }
    let principal = if req.principal_kind == "email" {
        principal.to_ascii_lowercase()
    } else {
        principal.to_owned()
    };
    let mut conn = st.store.acquire().await?;
    let domain = scope_domain(&mut conn, scope).await?;
    if !may_bind(&op.roles, scope, domain) {
        return Err(Error::InsufficientScope(
            "binding roles needs the admin role on the platform, or on the Domain of the scope"
                .into(),
        ));
    }
    if role_store::count(&mut conn).await? >= role_store::MAX_ROLE_BINDINGS {
        return Err(Error::Conflict(format!(
            "this server holds the most role bindings it keeps ({}); unbind some, or bind groups instead of people",
            role_store::MAX_ROLE_BINDINGS
        )));
    }
    let id = crate::auth::session::random_hex(8).map_err(|e| Error::Internal(e.to_string()))?;
    let row = role_store::BindingRow {
        id,
        role: role.as_str().into(),
        scope_kind: scope.kind().into(),
        scope_id: scope.id().map(|u| u.to_string()).unwrap_or_default(),
        principal_kind: req.principal_kind.clone(),
        principal,
        created_at: store::unix(st.now()),
        created_by: actor(&op),
    };
    match role_store::insert(&mut conn, &row).await {
        Ok(()) => {}
        Err(e) if e.is_unique_violation() => {
            return Err(Error::Conflict(
                "this role binding exists already; `plexctl role list` shows it".into(),
            ));
        }
        Err(e) => return Err(e.into()),
    }
    st.audit(super::audit_record::by(
        &op,
        domain,
        "role.bind",
        format!("role-binding/{}", row.id),
        binding_detail(&row),
    ))
    .await;
    tracing::info!(binding = %row.id, role = %row.role, scope = %row.scope_kind, operator = %op.id, "role bound");
    Ok((StatusCode::CREATED, Json(view(&row))))
}

/// `POST /v1/role-bindings/{id}/delete`: removes a binding; the sessions it carried lose
/// the role at their next request (and end if it was their last).
pub(crate) async fn unbind(
    State(st): State<Arc<AppState>>,
    op: Operator,
    Path(id): Path<String>,
) -> Result<Json<Value>, Error> {
    let not_found = || {
        Error::NotFound(format!(
            "no role binding {id:?}; `plexctl role list` shows them"
        ))
    };
    if id.len() > 64 {
        return Err(not_found());
    }
    let mut conn = st.store.acquire().await?;
    let row = role_store::get(&mut conn, &id)
        .await?
        .ok_or_else(not_found)?;
    let scope = RoleScope::parse(&row.scope_kind, &row.scope_id).unwrap_or(RoleScope::Platform);
    let domain = scope_domain(&mut conn, scope).await.unwrap_or(None);
    if !may_bind(&op.roles, scope, domain) {
        return Err(Error::InsufficientScope(
            "unbinding roles needs the admin role on the platform, or on the Domain of the scope"
                .into(),
        ));
    }
    role_store::delete(&mut conn, &id).await?;
    st.audit(super::audit_record::by(
        &op,
        domain,
        "role.unbind",
        format!("role-binding/{id}"),
        binding_detail(&row),
    ))
    .await;
    tracing::info!(binding = %id, operator = %op.id, "role unbound");
    Ok(Json(view(&row)))
}

/// A binding in the audit log: its role and scope, and its principal only when that is a
/// group (a person's subject or e-mail stays out of the log's clear text).
fn binding_detail(row: &role_store::BindingRow) -> Value {
    let principal = (row.principal_kind == "group").then(|| row.principal.clone());
    json!({
        "role": row.role,
        "scope": {"kind": row.scope_kind, "id": row.scope_id},
        "principal_kind": row.principal_kind,
        "principal": principal,
    })
}
