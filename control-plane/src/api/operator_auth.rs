//! The operator extractor: authenticates who calls an operator route (an operator token, or a
//! person's session by bearer or cookie, with the CSRF check on a cookie's writes) into an
//! [`Operator`] with what the route needs of it and the projects its roles reach.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use plexsphere_wire::admin::OperatorScope;
use plexsphere_wire::secret::OperatorToken;
use uuid::Uuid;

use super::operator_reach::{Operator, Person, RouteScope, Via};
use super::state::AppState;
use crate::auth::roles::{Need, Reach, Role, RoleGrant};
use crate::auth::session::{self, SessionSecret};
use crate::error::Error;
use crate::operator_tokens::{self, Refusal};
use crate::store::{self, operators, projects};

/// The token of an `Authorization: Bearer <token>` header, if the request carries one.
pub(super) fn bearer(parts: &Parts) -> Option<&str> {
    parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

const NO_OPERATOR: &str = "an operator token or a session is required: send `Authorization: Bearer pxop_...` (create one with `plexsphere operator-token create`), sign in with `plexctl login`, or sign in to the console";
const BAD_OPERATOR: &str = "the operator token is not valid (unknown, wrong or revoked); create a new one with `plexsphere operator-token create`";
const BAD_SESSION: &str = "the session is not valid (unknown or wrong secret); sign in again (`plexctl login`, or the console's Sign in)";

fn route_need(parts: &Parts) -> Result<Need, Error> {
    match parts.extensions.get::<RouteScope>().copied() {
        Some(RouteScope(need)) => Ok(need),
        None => Err(Error::Internal(format!(
            "{} {} has no scope in the route table (api::routes); it is refused until it gets one",
            parts.method,
            parts.uri.path()
        ))),
    }
}

/// The projects `reach` covers, with their Domains (nothing to look up for a full reach).
async fn reached_projects(
    conn: &mut store::Conn,
    reach: &Reach,
) -> Result<Vec<(Uuid, Uuid)>, Error> {
    if reach.all {
        return Ok(Vec::new());
    }
    let rows = projects::list(conn).await?;
    Ok(rows
        .into_iter()
        .filter(|p| reach.projects.contains(&p.id) || reach.domains.contains(&p.domain_id))
        .map(|p| (p.id, p.domain_id))
        .collect())
}

impl FromRequestParts<Arc<AppState>> for Operator {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Error> {
        match bearer(parts) {
            Some(text) if text.trim_start().starts_with(session::SESSION_PREFIX) => {
                let secret = SessionSecret::parse(text).ok_or(Error::Unauthorized(BAD_SESSION))?;
                session_operator(parts, state, &secret, session::Kind::Bearer).await
            }
            Some(text) => token_operator(parts, state, text).await,
            None => {
                let cookies = parts
                    .headers
                    .get_all(header::COOKIE)
                    .iter()
                    .filter_map(|v| v.to_str().ok());
                match session::cookie(cookies, session::SESSION_COOKIE) {
                    Some(value) => {
                        let secret =
                            SessionSecret::parse(value).ok_or(Error::Unauthorized(BAD_SESSION))?;
                        session_operator(parts, state, &secret, session::Kind::Cookie).await
                    }
                    None => Err(Error::Unauthorized(NO_OPERATOR)),
                }
            }
        }
    }
}

async fn token_operator(
    parts: &Parts,
    state: &Arc<AppState>,
    text: &str,
) -> Result<Operator, Error> {
    let token = OperatorToken::parse(text).map_err(|_| Error::Unauthorized(BAD_OPERATOR))?;
    let mut conn = state.store.acquire().await?;
    let row = operators::get(&mut conn, &token.id)
        .await?
        .ok_or(Error::Unauthorized(BAD_OPERATOR))?;
    if !store::secret_matches(&token.secret, &row.secret_sha256) {
        return Err(Error::Unauthorized(BAD_OPERATOR));
    }
    let now = store::unix(state.now());
    let grant = match operator_tokens::grant(&row, now)? {
        Ok(grant) => grant,
        Err(Refusal::Revoked) => return Err(Error::Unauthorized(BAD_OPERATOR)),
        Err(Refusal::Expired { at }) => {
            let when = store::from_unix("operator_tokens.expires_at", at)?
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_else(|_| at.to_string());
            return Err(Error::OperatorTokenExpired(format!(
                "the operator token {} ({}) expired at {when}; create a new one with `plexsphere operator-token create --scope ... --expires-in ...` on the server host, or `plexctl operator-token create` with an admin token",
                row.id, row.name
            )));
        }
    };
    operator_tokens::record_use(&state.store, &row.id, row.last_used_at, now);
    let need = route_need(parts)?;
    let role = RoleGrant::of_token(grant.scope, grant.project_id);
    if !role.role.allows(need) {
        let needs = match need {
            Need::Audit => "a read-only or admin token (the audit log)".to_owned(),
            other => other.token_scope().as_str().to_owned(),
        };
        return Err(Error::InsufficientScope(format!(
            "this operator token ({}) has scope {}, and {} {} needs {needs}; use a token with that scope (`plexctl whoami` shows this one's)",
            row.id,
            grant.scope.as_str(),
            parts.method,
            parts.uri.path(),
        )));
    }
    if grant.legacy {
        tracing::debug!(operator_token_id = %row.id, "a legacy operator token (admin, no expiry) was used; replace it with a scoped one");
    }
    let reach = Reach::of(&[role], need);
    let reached = reached_projects(&mut conn, &reach).await?;
    Ok(Operator {
        id: row.id,
        name: row.name,
        scope: grant.scope,
        project_id: grant.project_id,
        via: Via::Token,
        person: None,
        roles: vec![role],
        need,
        reach,
        reached_projects: reached,
    })
}

/// The operator-token scope a person's best role corresponds to (for handlers that show it).
fn scope_of(roles: &[RoleGrant]) -> OperatorScope {
    if roles.iter().any(|g| g.role == Role::Admin) {
        OperatorScope::Admin
    } else if roles.iter().any(|g| g.role == Role::Member) {
        OperatorScope::Operator
    } else {
        OperatorScope::ReadOnly
    }
}

async fn session_operator(
    parts: &Parts,
    state: &Arc<AppState>,
    secret: &SessionSecret,
    kind: session::Kind,
) -> Result<Operator, Error> {
    let (row, roles) = super::session_check::live_session(state, secret, kind).await?;
    let need = route_need(parts)?;
    if kind == session::Kind::Cookie && !is_safe(&parts.method) {
        let auth = state
            .auth
            .as_ref()
            .ok_or(Error::Unauthorized(BAD_SESSION))?;
        let origin = parts
            .headers
            .get(header::ORIGIN)
            .and_then(|v| v.to_str().ok());
        let csrf = parts
            .headers
            .get(session::CSRF_HEADER)
            .and_then(|v| v.to_str().ok());
        match session::check_write(
            origin,
            &auth.config.public_origin,
            csrf,
            row.csrf_sha256.as_deref(),
        ) {
            Ok(()) => {}
            Err(session::CsrfRefusal::Origin(o)) => {
                return Err(Error::CsrfRequired(format!(
                    "a cookie-authenticated write from origin {o:?} is refused: only the console on {} may write with this session",
                    auth.config.public_origin
                )));
            }
            Err(session::CsrfRefusal::Token) => {
                return Err(Error::CsrfRequired(format!(
                    "a cookie-authenticated write needs the header {} with the value of the {} cookie; nothing was changed",
                    "X-Plexsphere-CSRF",
                    session::CSRF_COOKIE
                )));
            }
        }
    }
    let reach = Reach::of(&roles, need);
    if reach.is_empty() {
        let held = roles
            .iter()
            .map(|g| match g.scope.id() {
                Some(id) => format!("{} on {} {id}", g.role.as_str(), g.scope.kind()),
                None => format!("{} on the platform", g.role.as_str()),
            })
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Error::InsufficientScope(format!(
            "your roles ({held}) do not allow {} {} (it needs {}); ask an admin to bind you a role that does (`plexctl role bind`)",
            parts.method,
            parts.uri.path(),
            need.as_str()
        )));
    }
    let mut conn = state.store.acquire().await?;
    let reached = reached_projects(&mut conn, &reach).await?;
    let project_id = if reach.all {
        None
    } else {
        reached.first().map(|(p, _)| *p).or(Some(Uuid::nil()))
    };
    let name = row.email.clone().unwrap_or_else(|| row.subject.clone());
    Ok(Operator {
        id: row.id.clone(),
        name,
        scope: scope_of(&roles),
        project_id,
        via: Via::Session {
            session_id: row.id.clone(),
        },
        person: Some(Person {
            issuer: row.issuer.clone(),
            subject: row.subject.clone(),
            email: row.email.clone(),
            name: row.name.clone(),
        }),
        roles,
        need,
        reach,
        reached_projects: reached,
    })
}

fn is_safe(method: &axum::http::Method) -> bool {
    matches!(
        *method,
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS
    )
}
