//! Extractors whose refusals are JSON `ApiError`s, never axum's plain-text defaults.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Path, Request};
use axum::http::header;
use axum::http::request::Parts;
use plexsphere_wire::secret::{OperatorToken, constant_time_eq};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::AppState;
use crate::error::Error;
use crate::ratelimit::{Decision, client_addr};
use crate::store::{StoreError, operators};

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

/// An authenticated operator (`Authorization: Bearer pxop_...`).
#[derive(Debug, Clone)]
pub struct Operator {
    pub id: String,
}

const NO_OPERATOR: &str = "an operator token is required: send `Authorization: Bearer pxop_...` (create one with `plexsphere operator-token create`)";
const BAD_OPERATOR: &str = "the operator token is not valid (unknown, wrong or revoked); create a new one with `plexsphere operator-token create`";

impl FromRequestParts<Arc<AppState>> for Operator {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Error> {
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or(Error::Unauthorized(NO_OPERATOR))?;
        let text = header
            .strip_prefix("Bearer ")
            .ok_or(Error::Unauthorized(NO_OPERATOR))?;
        let token = OperatorToken::parse(text).map_err(|_| Error::Unauthorized(BAD_OPERATOR))?;
        let mut conn = state
            .store
            .pool()
            .acquire()
            .await
            .map_err(StoreError::from)?;
        let row = operators::get(&mut conn, &token.id)
            .await?
            .ok_or(Error::Unauthorized(BAD_OPERATOR))?;
        let stored = hex::decode(&row.secret_sha256).unwrap_or_default();
        if !constant_time_eq(&token.secret.digest(), &stored) || row.revoked_at.is_some() {
            return Err(Error::Unauthorized(BAD_OPERATOR));
        }
        Ok(Operator { id: row.id })
    }
}

/// The address a request is accounted to (see [`client_addr`]).
pub fn request_client(parts: &Parts, state: &AppState) -> IpAddr {
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |ci| ci.0.ip());
    let xff = parts
        .headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok());
    client_addr(peer, xff, &state.config.trusted_proxies)
}

/// Takes one request from the client's registration budget, or refuses with 429.
pub struct RegisterBudget;

impl FromRequestParts<Arc<AppState>> for RegisterBudget {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Error> {
        let client = request_client(parts, state);
        let decision = state
            .register_limiter
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .check(client, Instant::now());
        match decision {
            Decision::Allow => Ok(RegisterBudget),
            Decision::Limited { retry_after } => {
                tracing::warn!(client = %client, "registration rate limit reached");
                Err(Error::RateLimited(Decision::retry_after_secs(retry_after)))
            }
        }
    }
}
