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
use crate::error::Error;
use crate::operator_tokens::{self, Refusal};
use crate::ratelimit::{Decision, client_addr, client_key};
use crate::store::nodes::NodeRow;
use crate::store::{self, nodes, operators};

/// The body limit of every JSON endpoint but registration.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// A JSON body of at most `LIMIT` bytes, sent as `application/json`.
pub struct ApiJson<T, const LIMIT: usize = DEFAULT_BODY_LIMIT>(pub T);

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
pub struct UuidPath(pub Uuid);

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
pub struct TokenIdPath(pub String);

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

/// The scope a route requires of an operator token. The router (`api::routes`) attaches it
/// to every operator route from its one route table; a route without it is refused (500),
/// never served unscoped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteScope(pub OperatorScope);

/// An authenticated operator (`Authorization: Bearer pxop_...`) whose token's scope covers the
/// route's [`RouteScope`]. Refusals: missing, malformed, unknown, wrong or revoked 401
/// `unauthorized`; expired 401 `operator_token_expired`; a scope below the route's 403
/// `insufficient_scope`. Success records the token's last use (at most once a minute).
#[derive(Debug, Clone)]
pub struct Operator {
    pub id: String,
    /// The token's name (what audit records show with its id).
    pub name: String,
    pub scope: OperatorScope,
    /// The one project this token is limited to; `None`: every project.
    pub project_id: Option<Uuid>,
}

impl Operator {
    /// Whether the token may see the resources of `project`.
    pub fn sees(&self, project: Uuid) -> bool {
        self.project_id.is_none_or(|p| p == project)
    }

    /// `not_found` unless the token may see the resources of `project`: to a project-bound
    /// token another project's objects do not exist (404, the same answer as a missing id).
    pub fn require(&self, project: Uuid, not_found: impl FnOnce() -> Error) -> Result<(), Error> {
        if self.sees(project) {
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

const NO_OPERATOR: &str = "an operator token is required: send `Authorization: Bearer pxop_...` (create one with `plexsphere operator-token create`)";
const BAD_OPERATOR: &str = "the operator token is not valid (unknown, wrong or revoked); create a new one with `plexsphere operator-token create`";

impl FromRequestParts<Arc<AppState>> for Operator {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Error> {
        let text = bearer(parts).ok_or(Error::Unauthorized(NO_OPERATOR))?;
        let token = OperatorToken::parse(text).map_err(|_| Error::Unauthorized(BAD_OPERATOR))?;
        let mut conn = state.store.acquire().await?;
        let row = operators::get(&mut conn, &token.id)
            .await?
            .ok_or(Error::Unauthorized(BAD_OPERATOR))?;
        drop(conn);
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
        let Some(RouteScope(needed)) = parts.extensions.get::<RouteScope>().copied() else {
            return Err(Error::Internal(format!(
                "{} {} has no scope in the route table (api::routes); it is refused until it gets one",
                parts.method,
                parts.uri.path()
            )));
        };
        if grant.scope < needed {
            return Err(Error::InsufficientScope(format!(
                "this operator token ({}) has scope {}, and {} {} needs {}; use a token with that scope (`plexctl whoami` shows this one's)",
                row.id,
                grant.scope.as_str(),
                parts.method,
                parts.uri.path(),
                needed.as_str()
            )));
        }
        if grant.legacy {
            tracing::debug!(operator_token_id = %row.id, "a legacy operator token (admin, no expiry) was used; replace it with a scoped one");
        }
        Ok(Operator {
            id: row.id,
            name: row.name,
            scope: grant.scope,
            project_id: grant.project_id,
        })
    }
}

/// An authenticated node (`Authorization: Bearer pxnk_...`) calling about itself: the path's
/// `{node_id}` must be the credential's node. Refusals: a bad path id 400; a missing,
/// malformed, unknown (deleted) or wrong credential 401 `unauthorized`; a revoked node 403
/// `node_revoked`; another node's path 403 `forbidden`; a malformed `Plexd-Host` 400; another
/// host's (or no) fingerprint for a node bound to a host 409 `clone_refused` (`crate::clone`:
/// the copy is recorded, the node is not marked seen). Success marks the node as seen (the
/// first success ends its registration replay window). A rotated credential: the pending one
/// works (its first use makes it current; never from a clone), the replaced one works for its
/// grace (`node_rotation`). Every node route spends one request of the node's budget
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
        let matched = crate::node_rotation::credential_match(&node, &credential.secret, now);
        if matched == crate::node_rotation::CredentialMatch::None {
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
        crate::clone::check(
            &mut conn,
            node.id,
            node.host_fingerprint.as_ref(),
            host.as_ref(),
            client,
            now,
        )
        .await?;
        if matched == crate::node_rotation::CredentialMatch::Pending {
            crate::node_rotation::promote(&mut conn, &node, now).await?;
        }
        nodes::touch_last_seen(&mut conn, node.id, now).await?;
        Ok(NodeAuth { node })
    }
}

/// The address a request is accounted to (see [`client_addr`]).
pub fn request_client(parts: &Parts, state: &AppState) -> IpAddr {
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
pub struct ClientAddr(pub IpAddr);

impl FromRequestParts<Arc<AppState>> for ClientAddr {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Error> {
        Ok(ClientAddr(request_client(parts, state)))
    }
}

/// Takes one request from the client's registration budget (an IPv6 client's budget is its
/// /64's, see [`client_key`]), or refuses with 429.
pub struct RegisterBudget;

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
pub struct RegisterChallengeBudget;

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
