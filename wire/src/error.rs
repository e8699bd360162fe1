//! The one error body every plexsphere endpoint answers with, and its stable machine codes.

use serde::{Deserialize, Serialize};

/// The JSON body of every 4xx/5xx answer: a stable machine `code` and a human `message`.
///
/// ```json
/// {"code":"token_consumed","message":"the bootstrap token was already used"}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    pub code: String,
    pub message: String,
}

impl ApiError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

/// Stable machine codes. Clients match on these strings; never rename one.
pub mod codes {
    /// 403: the bootstrap token was already used by another node key.
    pub const TOKEN_CONSUMED: &str = "token_consumed";
    /// 401: no bootstrap token with this text exists.
    pub const TOKEN_UNKNOWN: &str = "token_unknown";
    /// 401: the bootstrap token's lifetime has passed.
    pub const TOKEN_EXPIRED: &str = "token_expired";
    /// 403: an operator revoked the bootstrap token.
    pub const TOKEN_REVOKED: &str = "token_revoked";
    /// 403: the token is not of kind `node`.
    pub const TOKEN_KIND_MISMATCH: &str = "token_kind_mismatch";
    /// 403: the node's configured project differs from the token's project.
    pub const PROJECT_MISMATCH: &str = "project_mismatch";
    /// 409: no free mesh address is left in the range the node would get one from.
    pub const MESH_RANGE_EXHAUSTED: &str = "mesh_range_exhausted";
    /// 409: the request conflicts with existing state (a duplicate, a changed mesh CIDR...).
    pub const CONFLICT: &str = "conflict";
    /// 429: too many requests from this client; see `Retry-After`.
    pub const RATE_LIMITED: &str = "rate_limited";
    /// 422: a resource's parameters do not fit its blueprint (unknown, missing, mistyped or
    /// pattern-violating); the message names each parameter.
    pub const INVALID_PARAMETERS: &str = "invalid_parameters";
    /// 422: an endpoint report names an address peers must not be sent to (loopback,
    /// link-local, multicast, broadcast, unspecified, the mesh range, port 0), an unknown home
    /// relay, or too many candidates; the message names the field, the address and why.
    pub const ENDPOINT_REFUSED: &str = "endpoint_refused";
    /// 400: the body is not valid JSON of the expected shape.
    pub const INVALID_JSON: &str = "invalid_json";
    /// 400/422: a field has a bad value (a bad UUID, CIDR, key, name...).
    pub const INVALID_REQUEST: &str = "invalid_request";
    /// 413: the body is larger than the endpoint accepts.
    pub const BODY_TOO_LARGE: &str = "body_too_large";
    /// 415: the body is not `application/json`.
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "unsupported_media_type";
    /// 401: missing or bad credentials.
    pub const UNAUTHORIZED: &str = "unauthorized";
    /// 403: the credentials are valid but do not allow this.
    pub const FORBIDDEN: &str = "forbidden";
    /// 401: the operator token's expiry has passed; create a new one.
    pub const OPERATOR_TOKEN_EXPIRED: &str = "operator_token_expired";
    /// 403: the operator token's scope does not allow this route (read-only on a write...).
    pub const INSUFFICIENT_SCOPE: &str = "insufficient_scope";
    /// 403: a cookie-authenticated write without the CSRF header (`X-Plexsphere-CSRF`) equal to
    /// the CSRF cookie, or from another origin; nothing changed.
    pub const CSRF_REQUIRED: &str = "csrf_required";
    /// 400: an OpenID sign-in was refused (wrong state, expired or replayed attempt, an ID token
    /// that failed a check); nothing changed, sign in again.
    pub const SIGN_IN_FAILED: &str = "sign_in_failed";
    /// 401: the session expired (lifetime or idle timeout) or was signed out; sign in again.
    pub const SESSION_EXPIRED: &str = "session_expired";
    /// 404: sign-in is not configured on this server (no `--oidc-issuer`).
    pub const SIGN_IN_DISABLED: &str = "sign_in_disabled";
    /// 403: the node was revoked by an operator; its credential no longer works.
    pub const NODE_REVOKED: &str = "node_revoked";
    /// 409: the node's credential came with another host's fingerprint (or none) than the
    /// one bound to the node: its state directory was copied to another host. Final: the
    /// copy must be removed and enrolled with its own token.
    pub const CLONE_REFUSED: &str = "clone_refused";
    /// 422: the request carries no proof of possession of the node's WireGuard private key
    /// (registration, credential rotation): the plexd is older than this control plane;
    /// upgrade it.
    pub const PROOF_REQUIRED: &str = "proof_required";
    /// 403: the proof of possession does not match the key (made without its private key), or
    /// its nonce is unknown or expired; ask for a fresh challenge.
    pub const PROOF_INVALID: &str = "proof_invalid";
    /// 409: another live node of the Domain has this WireGuard public key; the message names it.
    pub const KEY_IN_USE: &str = "key_in_use";
    /// 409: another live node of the Domain has a WireGuard public key with the same first 8
    /// bytes (the prefix relay frames name nodes by); the message names it.
    pub const KEY_PREFIX_IN_USE: &str = "key_prefix_in_use";
    /// 409: another live node of the Domain holds this DNS name (`PUT /v1/nodes/{id}/name`);
    /// the message names it.
    pub const NAME_TAKEN: &str = "name_taken";
    /// 400: a route report names a route that cannot be one (reserved, too large, the mesh
    /// range, a probe outside it, a duplicate, too many); the message names every refused
    /// route and nothing is stored.
    pub const ROUTE_REFUSED: &str = "route_refused";
    /// 404: the addressed object does not exist.
    pub const NOT_FOUND: &str = "not_found";
    /// 422: an access policy document that does not parse, names what the Domain does not
    /// know, breaks a limit or fails one of its tests; the body lists each problem with line
    /// and column (`policy_admin::PolicyRefusal`). The policy in force is unchanged.
    pub const POLICY_INVALID: &str = "policy_invalid";
    /// 404: no plexd build for the requested platform.
    pub const UNKNOWN_PLATFORM: &str = "unknown_platform";
    /// 502: the upstream plexd mirror is unreachable and nothing is cached.
    pub const PLEXD_DOWNLOAD_UPSTREAM_UNAVAILABLE: &str = "plexd_download_upstream_unavailable";
    /// 500: an unexpected server fault; the server log has the detail.
    pub const INTERNAL: &str = "internal";
    /// 503: a dependency of the server (its database) is unavailable.
    pub const UNAVAILABLE: &str = "unavailable";
    /// 507: the control plane's database has no space left; nothing of the request was
    /// stored. Retryable (`Retry-After`) once an operator frees space.
    pub const STORAGE_FULL: &str = "storage_full";
    /// 503: the control plane's database cannot be written (read-only, I/O error) or reached;
    /// nothing of the request was stored. Retryable (`Retry-After`).
    pub const STORAGE_UNAVAILABLE: &str = "storage_unavailable";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_is_pinned() {
        let e = ApiError::new(
            codes::TOKEN_CONSUMED,
            "the bootstrap token was already used",
        );
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"code":"token_consumed","message":"the bootstrap token was already used"}"#
        );
        let back: ApiError = serde_json::from_str(
            r#"{"code":"plexd_download_upstream_unavailable","message":"upstream down"}"#,
        )
        .unwrap();
        assert_eq!(back.code, codes::PLEXD_DOWNLOAD_UPSTREAM_UNAVAILABLE);
    }
}
