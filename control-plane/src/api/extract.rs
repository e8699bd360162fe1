//! Extractors whose refusals are JSON `ApiError`s, never axum's plain-text defaults.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Path, Request};
use axum::http::header;
use axum::http::request::Parts;
use plexsphere_wire::host::{BadFingerprint, HOST_HEADER, HostFingerprint};
use plexsphere_wire::secret::NodeCredential;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::operator_auth::bearer;
pub use super::operator_reach::{Operator, Person, RouteScope, Via};
use super::state::AppState;
use crate::error::Error;
use crate::ratelimit::{Decision, client_addr, client_key};
use crate::store::nodes::NodeRow;
use crate::store::{self, nodes};

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
