//! The ONE mapping from [`Error`] to an HTTP status, a stable machine code and a message.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use plexsphere_wire::policy_admin::{PolicyProblem, PolicyRefusal};
use plexsphere_wire::{ApiError, codes};

use crate::error::Error;
use crate::store::StorageFault;

/// The `Retry-After` of an answer that a full or failing database gave: long enough for an
/// operator's fix to matter, short enough that nodes come back soon after it.
pub(crate) const STORAGE_RETRY_AFTER_SECS: u64 = 30;
/// The `Retry-After` of a `503` for a database that is busy with other writers.
pub(crate) const BUSY_RETRY_AFTER_SECS: u64 = 2;
/// The `Retry-After` of a `503 unavailable` for a database server that does not answer (a
/// Postgres restarting): the pool reconnects by itself, so clients come back soon.
pub(crate) const UNREACHABLE_RETRY_AFTER_SECS: u64 = 5;

/// Status and code of an error; the message is its `Display` unless it is an internal fault.
pub(crate) fn classify(e: &Error) -> (StatusCode, &'static str) {
    match e {
        Error::InvalidJson(_) => (StatusCode::BAD_REQUEST, codes::INVALID_JSON),
        Error::UnsupportedMediaType => (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            codes::UNSUPPORTED_MEDIA_TYPE,
        ),
        Error::BodyTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, codes::BODY_TOO_LARGE),
        Error::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, codes::INVALID_REQUEST),
        Error::EndpointRefused(_) => (StatusCode::UNPROCESSABLE_ENTITY, codes::ENDPOINT_REFUSED),
        Error::InvalidParameters(_) => {
            (StatusCode::UNPROCESSABLE_ENTITY, codes::INVALID_PARAMETERS)
        }
        Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, codes::UNAVAILABLE),
        Error::BadRequest(_) => (StatusCode::BAD_REQUEST, codes::INVALID_REQUEST),
        Error::TokenUnknown => (StatusCode::UNAUTHORIZED, codes::TOKEN_UNKNOWN),
        Error::TokenExpired => (StatusCode::UNAUTHORIZED, codes::TOKEN_EXPIRED),
        Error::TokenRevoked => (StatusCode::FORBIDDEN, codes::TOKEN_REVOKED),
        Error::TokenKindMismatch => (StatusCode::FORBIDDEN, codes::TOKEN_KIND_MISMATCH),
        Error::ProjectMismatch => (StatusCode::FORBIDDEN, codes::PROJECT_MISMATCH),
        Error::TokenConsumed => (StatusCode::FORBIDDEN, codes::TOKEN_CONSUMED),
        Error::MeshRangeExhausted(_) => (StatusCode::CONFLICT, codes::MESH_RANGE_EXHAUSTED),
        Error::RateLimited(_)
        | Error::NodeRateLimited(_)
        | Error::RotationLimited(_)
        | Error::PathsTooSoon(_)
        | Error::TooManyConsoleStreams(_)
        | Error::TooManyStreams(_) => (StatusCode::TOO_MANY_REQUESTS, codes::RATE_LIMITED),
        Error::Unauthorized(_) => (StatusCode::UNAUTHORIZED, codes::UNAUTHORIZED),
        Error::Forbidden(_) => (StatusCode::FORBIDDEN, codes::FORBIDDEN),
        Error::OperatorTokenExpired(_) => (StatusCode::UNAUTHORIZED, codes::OPERATOR_TOKEN_EXPIRED),
        Error::InsufficientScope(_) => (StatusCode::FORBIDDEN, codes::INSUFFICIENT_SCOPE),
        Error::NodeRevoked => (StatusCode::FORBIDDEN, codes::NODE_REVOKED),
        Error::CloneRefused(_) => (StatusCode::CONFLICT, codes::CLONE_REFUSED),
        Error::ProofRequired(_) => (StatusCode::UNPROCESSABLE_ENTITY, codes::PROOF_REQUIRED),
        Error::ProofInvalid(_) => (StatusCode::FORBIDDEN, codes::PROOF_INVALID),
        Error::KeyInUse(_) => (StatusCode::CONFLICT, codes::KEY_IN_USE),
        Error::KeyPrefixInUse(_) => (StatusCode::CONFLICT, codes::KEY_PREFIX_IN_USE),
        Error::PolicyInvalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, codes::POLICY_INVALID),
        Error::NotFound(_) => (StatusCode::NOT_FOUND, codes::NOT_FOUND),
        Error::CsrfRequired(_) => (StatusCode::FORBIDDEN, codes::CSRF_REQUIRED),
        Error::SignInFailed(_) => (StatusCode::BAD_REQUEST, codes::SIGN_IN_FAILED),
        Error::SessionExpired(_) => (StatusCode::UNAUTHORIZED, codes::SESSION_EXPIRED),
        Error::SignInDisabled => (StatusCode::NOT_FOUND, codes::SIGN_IN_DISABLED),
        Error::Conflict(_) => (StatusCode::CONFLICT, codes::CONFLICT),
        Error::NameTaken(_) => (StatusCode::CONFLICT, codes::NAME_TAKEN),
        Error::RouteRefused(_) => (StatusCode::BAD_REQUEST, codes::ROUTE_REFUSED),
        Error::Store(s) if s.is_unreachable() => {
            (StatusCode::SERVICE_UNAVAILABLE, codes::UNAVAILABLE)
        }
        Error::Store(s) if s.fault() == Some(StorageFault::Full) => {
            (StatusCode::INSUFFICIENT_STORAGE, codes::STORAGE_FULL)
        }
        Error::Store(s) if s.fault().is_some() => {
            (StatusCode::SERVICE_UNAVAILABLE, codes::STORAGE_UNAVAILABLE)
        }
        Error::Store(s) if s.is_busy() => (StatusCode::SERVICE_UNAVAILABLE, codes::UNAVAILABLE),
        Error::Store(_) | Error::Key(_) | Error::Internal(_) => {
            (StatusCode::INTERNAL_SERVER_ERROR, codes::INTERNAL)
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, code) = classify(&self);
        let unreachable = matches!(&self, Error::Store(s) if s.is_unreachable());
        let fault = match &self {
            Error::Store(s) if !unreachable => s.fault(),
            _ => None,
        };
        let message = if status.is_server_error() {
            tracing::error!(error = %self, code, "request failed");
            match (status, fault) {
                _ if unreachable => format!(
                    "the control plane's database server does not answer (down, restarting or cut off); nothing of this request was stored, retry after {UNREACHABLE_RETRY_AFTER_SECS} s (the server reconnects by itself once the database is back)"
                ),
                (_, Some(fault)) => format!(
                    "the control plane's database could not store this request: {}; nothing of it was stored, retry after {STORAGE_RETRY_AFTER_SECS} s (an operator must {})",
                    fault.describe(),
                    fault.remedy()
                ),
                (StatusCode::SERVICE_UNAVAILABLE, _) if matches!(self, Error::Unavailable(_)) => {
                    self.to_string()
                }
                (StatusCode::SERVICE_UNAVAILABLE, _) => {
                    "the database is busy; retry shortly".to_owned()
                }
                _ => "an internal error occurred; the server log has the detail".to_owned(),
            }
        } else {
            self.to_string()
        };
        let retry_after = match (&self, fault) {
            (
                Error::RateLimited(secs)
                | Error::NodeRateLimited(secs)
                | Error::RotationLimited(secs)
                | Error::PathsTooSoon(secs),
                _,
            ) => Some(*secs),
            _ if unreachable => Some(UNREACHABLE_RETRY_AFTER_SECS),
            (Error::TooManyStreams(_) | Error::TooManyConsoleStreams(_), _) => {
                Some(crate::error::STREAM_RETRY_AFTER_SECS)
            }
            (_, Some(_)) => Some(STORAGE_RETRY_AFTER_SECS),
            (Error::Store(s), None) if s.is_busy() => Some(BUSY_RETRY_AFTER_SECS),
            _ => None,
        };
        let mut resp = match &self {
            Error::PolicyInvalid(errors) => (
                status,
                Json(PolicyRefusal {
                    code: code.to_owned(),
                    message,
                    errors: policy_problems(errors),
                }),
            )
                .into_response(),
            _ => (status, Json(ApiError::new(code, message))).into_response(),
        };
        if let Some(secs) = retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

/// A document's problems as the API lists them (line and column 1-based; column 0 = the line).
pub(crate) fn policy_problems(errors: &plexsphere_policy::PolicyErrors) -> Vec<PolicyProblem> {
    use plexsphere_policy::ErrorKind;
    errors
        .0
        .iter()
        .map(|e| PolicyProblem {
            kind: match e.kind {
                ErrorKind::Syntax => "syntax",
                ErrorKind::Invalid => "invalid",
                ErrorKind::Unknown => "unknown",
                ErrorKind::Limit => "limit",
                ErrorKind::TestFailed => "test_failed",
            }
            .to_owned(),
            line: e.location.line,
            column: e.location.column,
            message: e.message.clone(),
        })
        .collect()
}
