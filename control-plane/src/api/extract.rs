//! Extractors whose refusals are JSON `ApiError`s, never axum's plain-text defaults.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Path, Request};
use axum::http::header;
use axum::http::request::Parts;
use plexsphere_wire::admin::OperatorScope;
use plexsphere_wire::host::{BadFingerprint, HOST_HEADER, HostFingerprint};
use plexsphere_wire::secret::{NodeCredential, OperatorToken};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::state::AppState;
use crate::auth::roles::{Need, Reach, Role, RoleGrant};
use crate::auth::session::{self, SessionSecret};
use crate::error::Error;
use crate::operator_tokens::{self, Refusal};
use crate::ratelimit::{Decision, client_addr, client_key};
use crate::store::nodes::NodeRow;
use crate::store::{self, nodes, operators, projects};

/// The body limit of every JSON endpoint but registration.
pub(crate) const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// A JSON body of at most `LIMIT` bytes, sent as `application/json`.
pub(crate) struct ApiJson<T, const LIMIT: usize = DEFAULT_BODY_LIMIT>(pub T);

impl<S: Send + Sync, T: DeserializeOwned, const LIMIT: usize> FromRequest<S> for ApiJson<T, LIMIT> {
    type Rejection = Error;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Error> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"));
        if !is_json {
            return Err(Error::UnsupportedMediaType);
        }
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > LIMIT as u64) {
            return Err(Error::BodyTooLarge(LIMIT));
        }
        let bytes = axum::body::to_bytes(req.into_body(), LIMIT)
            .await
            .map_err(|_| Error::BodyTooLarge(LIMIT))?;
        serde_json::from_slice(&bytes)
            .map(ApiJson)
            .map_err(|e| Error::InvalidJson(e.to_string()))
    }
}

/// A UUID path parameter; anything else is `400 invalid_request`.
pub(crate) struct UuidPath(pub Uuid);

impl<S: Send + Sync> FromRequestParts<S> for UuidPath {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| Error::BadRequest(format!("bad path parameter: {e}")))?;
        Uuid::parse_str(&raw)
            .map(UuidPath)
            .map_err(|_| Error::BadRequest(format!("{raw:?} is not a UUID")))
    }
}

/// A bootstrap-token id path parameter (16 lowercase hex characters).
pub(crate) struct TokenIdPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for TokenIdPath {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| Error::BadRequest(format!("bad path parameter: {e}")))?;
        let ok = raw.len() == 16
            && raw
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if ok {
            Ok(TokenIdPath(raw))
        } else {
            Err(Error::BadRequest(format!(
                "{raw:?} is not a bootstrap token id (16 hex characters)"
            )))
        }
    }
}

/// What a route needs of its caller ([`Need`]). The router (`api::routes`) attaches it to
/// every operator route from its one route table; a route without it is refused (500),
/// never served unchecked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteScope(pub Need);

/// How the caller authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// An operator token (`pxop_...`).
    Token,
    /// A person's session (cookie or `pxss_...`); `session_id` is the public id.
    Session { session_id: String },
}

/// The person behind a session, as the issuer's ID token named them at sign-in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    pub issuer: String,
    pub subject: String,
    pub email: Option<String>,
    pub name: Option<String>,
}

/// An authenticated operator: an operator token (`Authorization: Bearer pxop_...`), a
/// person's bearer session (`Authorization: Bearer pxss_...`, what `plexctl login` keeps) or
/// the console's session cookie, whose roles allow the route's [`RouteScope`]. ONE check for
/// both: a token is a role on its project or the platform (`auth::roles`), a person has the
/// roles their bindings give them NOW (computed at every request; a session left with no role
/// is revoked). A cookie-authenticated write needs the CSRF header and our `Origin`
/// (`auth::session::check_write`).
///
/// Refusals: missing, malformed, unknown, wrong or revoked 401 `unauthorized`; an expired
/// token 401 `operator_token_expired`; an expired, idle or signed-out session 401
/// `session_expired`; a role below the route's need 403 `insufficient_scope`; a cookie write
/// without CSRF or from another origin 403 `csrf_required`. Success records the last use.
#[derive(Debug, Clone)]
pub struct Operator {
    /// The token's id, or the session's public id.
    pub id: String,
    /// The token's name, or the person's e-mail address (else subject).
    pub name: String,
    /// A token's scope; for a session the scope its best role corresponds to.
    pub scope: OperatorScope,
    /// The one project this caller is limited to; `None`: not limited to one project (a
    /// token of every project, or a person with a platform role for this need). A person
    /// whose reach is some Domains or several projects is answered as limited (the first of
    /// them) by handlers that read this field; [`Operator::sees`] knows the whole reach.
    pub project_id: Option<Uuid>,
    pub via: Via,
    /// `Some` for sessions.
    pub person: Option<Person>,
    /// Every role the caller holds (a token: exactly one).
    pub roles: Vec<RoleGrant>,
    /// The route's need.
    pub need: Need,
    /// What the roles reach for the need.
    pub reach: Reach,
    /// `(project, its Domain)` of every project the caller reaches for the need, when the
    /// reach is not everything.
    pub reached_projects: Vec<(Uuid, Uuid)>,
}

impl Operator {
    /// Whether the caller may see the resources of `project`.
    pub(crate) fn sees(&self, project: Uuid) -> bool {
        self.reach.all || self.reached_projects.iter().any(|(p, _)| *p == project)
    }

    /// `not_found` unless the caller may see the resources of `project`: to a caller limited
    /// to some projects, another project's objects do not exist (404, the same answer as a
    /// missing id).
    pub(crate) fn require(
        &self,
        project: Uuid,
        not_found: impl FnOnce() -> Error,
    ) -> Result<(), Error> {
        if self.sees(project) {
            Ok(())
        } else {
            Err(not_found())
        }
    }

    /// Whether the caller reaches `domain` for the route's need: a platform role, a role on
    /// the Domain, or (for reads) a role on one of its projects.
    pub(crate) fn sees_domain(&self, domain: Uuid) -> bool {
        self.reach.all
            || self.reach.domains.contains(&domain)
            || (matches!(self.need, Need::Read | Need::Audit)
                && self.reached_projects.iter().any(|(_, d)| *d == domain))
    }

    /// For changes that reach a whole Domain (its policy, DNS suffix, signing key, names,
    /// tags, routes): a platform role, or a role on that Domain, for the route's need; a
    /// caller limited to projects is refused (403) with `what` saying why.
    pub(crate) fn domain_wide(&self, domain: Uuid, what: &str) -> Result<(), Error> {
        if self.reach.all || self.reach.domains.contains(&domain) {
            return Ok(());
        }
        Err(Error::Forbidden(format!(
            "{what}; {} reaches only some projects of this Domain: it needs this role on the Domain or the platform (a token not limited to a project)",
            self.describe()
        )))
    }

    /// For what belongs to no Domain (the platform's audit chain): a platform role.
    pub(crate) fn platform_wide(&self, what: &str) -> Result<(), Error> {
        if self.reach.all {
            return Ok(());
        }
        Err(Error::Forbidden(format!(
            "{what}; {} has no platform role for it (a token not limited to a project, or a platform role binding)",
            self.describe()
        )))
    }

    /// The Domains the caller reaches for the route's need ([`Operator::sees_domain`]) of
    /// `all` (every Domain's id).
    pub(crate) fn seen_domains(&self, all: impl IntoIterator<Item = Uuid>) -> Vec<Uuid> {
        all.into_iter().filter(|d| self.sees_domain(*d)).collect()
    }

    /// "this token (ID)" or "this session (ID)", for messages.
    fn describe(&self) -> String {
        match &self.via {
            Via::Token => format!("this token ({})", self.id),
            Via::Session { session_id } => format!("this session ({session_id})"),
        }
    }

    /// `not_found` unless the caller reaches `domain` ([`Operator::sees_domain`]).
    pub(crate) fn require_domain(
        &self,
        domain: Uuid,
        not_found: impl FnOnce() -> Error,
    ) -> Result<(), Error> {
        if self.sees_domain(domain) {
            Ok(())
        } else {
            Err(not_found())
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header, if the request carries one.
fn bearer(parts: &Parts) -> Option<&str> {
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

/// An authenticated node (`Authorization: Bearer pxnk_...`) calling about itself: the path's
/// `{node_id}` must be the credential's node. Refusals: a bad path id 400; a missing,
/// malformed, unknown (deleted) or wrong credential 401 `unauthorized`; a revoked node 403
/// `node_revoked`; another node's path 403 `forbidden`; a malformed `Plexd-Host` 400; another
/// host's (or no) fingerprint for a node bound to a host 409 `clone_refused` (`crate::node::clone`:
/// the copy is recorded, the node is not marked seen). Success marks the node as seen (the
/// first success ends its registration replay window). A rotated credential: the pending one
/// works (its first use makes it current; never from a clone), the replaced one works for its
/// grace (`node::rotation`). Every node route spends one request of the node's budget
/// (`ApiConfig::node_rate_limit`); past it: 429 `rate_limited` with `Retry-After`.
pub struct NodeAuth {
    pub node: NodeRow,
}

const NO_NODE: &str = "a node credential is required: send `Authorization: Bearer pxnk_...` (the credential registration handed out)";
const BAD_NODE: &str = "the node credential is not valid (unknown or deleted node, or a wrong secret); register the node again with a fresh bootstrap token";

impl FromRequestParts<Arc<AppState>> for NodeAuth {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Error> {
        let UuidPath(path_id) = UuidPath::from_request_parts(parts, state).await?;
        let text = bearer(parts).ok_or(Error::Unauthorized(NO_NODE))?;
        let credential =
            NodeCredential::parse(text.trim()).map_err(|_| Error::Unauthorized(BAD_NODE))?;
        let mut conn = state.store.acquire().await?;
        let node = nodes::get(&mut conn, credential.node_id)
            .await?
            .ok_or(Error::Unauthorized(BAD_NODE))?;
        let now = store::unix(state.now());
        let matched = crate::node::rotation::credential_match(&node, &credential.secret, now);
        if matched == crate::node::rotation::CredentialMatch::None {
            return Err(Error::Unauthorized(BAD_NODE));
        }
        if node.revoked_at.is_some() {
            return Err(Error::NodeRevoked);
        }
        if node.id != path_id {
            return Err(Error::Forbidden(format!(
                "this credential belongs to node {}, not {path_id}; a node may only call about itself",
                node.id
            )));
        }
        // Counted only once the credential matched: nobody can spend another node's budget.
        let decision = state
            .node_limiter
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .check(node.id, Instant::now());
        if let Decision::Limited { retry_after } = decision {
            tracing::warn!(node_id = %node.id, "node rate limit reached");
            return Err(Error::NodeRateLimited(Decision::retry_after_secs(
                retry_after,
            )));
        }
        let host = parts
            .headers
            .get(HOST_HEADER)
            .map(|v| {
                v.to_str()
                    .ok()
                    .and_then(|t| HostFingerprint::parse(t).ok())
                    .ok_or_else(|| Error::BadRequest(BadFingerprint.to_string()))
            })
            .transpose()?;
        let client = request_client(parts, state);
        crate::node::clone::check(
            &mut conn,
            node.id,
            node.host_fingerprint.as_ref(),
            host.as_ref(),
            client,
            now,
        )
        .await?;
        if matched == crate::node::rotation::CredentialMatch::Pending {
            crate::node::rotation::promote(&mut conn, &node, now).await?;
        }
        nodes::touch_last_seen(&mut conn, node.id, now).await?;
        Ok(NodeAuth { node })
    }
}

/// The address a request is accounted to (see [`client_addr`]).
pub(crate) fn request_client(parts: &Parts, state: &AppState) -> IpAddr {
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |ci| ci.0.ip());
    // Every header line, in order: a proxy may append a line of its own (RFC 9110 5.3). A
    // line that is not text makes the list malformed, so the peer is the client.
    let lines: Option<Vec<&str>> = parts
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .map(|v| v.to_str().ok())
        .collect();
    match lines {
        Some(lines) => client_addr(peer, lines, &state.config.trusted_proxies),
        None => client_addr(peer, ["not text"], &state.config.trusted_proxies),
    }
}

/// The client address of a request (the rate limiter's rule: a trusted proxy's
/// `X-Forwarded-For` is believed).
pub(crate) struct ClientAddr(pub IpAddr);

impl FromRequestParts<Arc<AppState>> for ClientAddr {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Error> {
        Ok(ClientAddr(request_client(parts, state)))
    }
}

/// Takes one request from the client's registration budget (an IPv6 client's budget is its
/// /64's, see [`client_key`]), or refuses with 429.
pub(crate) struct RegisterBudget;

impl FromRequestParts<Arc<AppState>> for RegisterBudget {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Error> {
        let client = request_client(parts, state);
        let decision = state
            .register_limiter
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .check(client_key(client), Instant::now());
        match decision {
            Decision::Allow => Ok(RegisterBudget),
            Decision::Limited { retry_after } => {
                tracing::warn!(client = %client, "registration rate limit reached");
                Err(Error::RateLimited(Decision::retry_after_secs(retry_after)))
            }
        }
    }
}

/// Takes one request from the client's budget of registration challenges (the same limit as
/// registrations, a bucket of its own), or refuses with 429.
pub(crate) struct RegisterChallengeBudget;

impl FromRequestParts<Arc<AppState>> for RegisterChallengeBudget {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Error> {
        let client = request_client(parts, state);
        let decision = state
            .register_challenge_limiter
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .check(client_key(client), Instant::now());
        match decision {
            Decision::Allow => Ok(RegisterChallengeBudget),
            Decision::Limited { retry_after } => {
                tracing::warn!(client = %client, "registration challenge rate limit reached");
                Err(Error::RateLimited(Decision::retry_after_secs(retry_after)))
            }
        }
    }
}
