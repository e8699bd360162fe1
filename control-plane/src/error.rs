//! The error every API operation answers with. `api::error` is the ONE place that maps it to
//! an HTTP status and a stable machine code.

use ipnet::IpNet;

use crate::keys::KeyError;
use crate::store::StoreError;

/// The `Retry-After` of a `429` for one event stream too many of a node
/// ([`Error::TooManyStreams`]): about the time a dropped connection takes to be noticed.
pub(crate) const STREAM_RETRY_AFTER_SECS: u64 = 5;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// 400 `invalid_json`: not JSON, wrong shape, unknown field.
    #[error("the body is not valid JSON for this endpoint: {0}")]
    InvalidJson(String),
    /// 415 `unsupported_media_type`.
    #[error("the body must be sent with Content-Type: application/json")]
    UnsupportedMediaType,
    /// 413 `body_too_large`.
    #[error("the body is larger than the {0} bytes this endpoint accepts")]
    BodyTooLarge(usize),
    /// 422 `invalid_request`: a field of a well-formed body has a bad value.
    #[error("{0}")]
    Invalid(String),
    /// 422 `endpoint_refused`: an endpoint report names an address peers must not be sent
    /// to, an unknown home relay, or too many candidates.
    #[error(transparent)]
    EndpointRefused(#[from] crate::candidates::Refusal),
    /// 422 `invalid_parameters`: a resource's parameters do not fit its blueprint.
    #[error("{0}")]
    InvalidParameters(String),
    /// 503 `unavailable`: a substrate this server cannot use now (not root, tools missing...).
    #[error("{0}")]
    Unavailable(String),
    /// 400 `invalid_request`: a bad path or query parameter (a malformed UUID...).
    #[error("{0}")]
    BadRequest(String),
    #[error(
        "the bootstrap token is not known to this control plane; ask an operator for a fresh token"
    )]
    TokenUnknown,
    #[error("the bootstrap token has expired; ask an operator for a fresh token")]
    TokenExpired,
    #[error("the bootstrap token was revoked by an operator; ask an operator for a fresh token")]
    TokenRevoked,
    #[error("the bootstrap token is not a node token; issue one with --kind node")]
    TokenKindMismatch,
    #[error(
        "the bootstrap token belongs to another project than registration.project_id; fix the config or use a token of that project"
    )]
    ProjectMismatch,
    #[error(
        "the bootstrap token is used up (every use it allows is taken, or this key's node registered with it over 10 minutes ago); issue a fresh token"
    )]
    TokenConsumed,
    #[error(
        "no free mesh address is left in {0}; free addresses by revoking nodes or widen the range"
    )]
    MeshRangeExhausted(IpNet),
    /// 429 `rate_limited` with `Retry-After`.
    #[error("too many registration attempts from this client; retry after {0} s")]
    RateLimited(u64),
    /// 429 `rate_limited` with `Retry-After`: a node spent its budget of the node routes.
    #[error(
        "this node sent more requests than its budget of the node API allows; retry after {0} s"
    )]
    NodeRateLimited(u64),
    /// 429 `rate_limited` with `Retry-After` ([`STREAM_RETRY_AFTER_SECS`]): the node already
    /// holds this many event streams open on this replica.
    #[error(
        "this node already has {0} event streams open on this server (the limit); close one or retry after {secs} s",
        secs = STREAM_RETRY_AFTER_SECS
    )]
    TooManyStreams(usize),
    /// 429 `rate_limited` with `Retry-After`: a node rotated its key or credential too recently.
    #[error(
        "this node rotated less than {gap} s ago; retry after {0} s",
        gap = plexsphere_wire::rotation::MIN_ROTATION_GAP_SECS
    )]
    RotationLimited(u64),
    /// 429 `rate_limited` with `Retry-After`: a node reported its paths again too soon
    /// (`plexsphere_wire::paths::PATHS_MIN_GAP_MS`).
    #[error(
        "this node reported its paths less than {gap} ms ago; retry after {0} s",
        gap = plexsphere_wire::paths::PATHS_MIN_GAP_MS
    )]
    PathsTooSoon(u64),
    /// 429 `rate_limited` with `Retry-After` ([`STREAM_RETRY_AFTER_SECS`]): the caller already
    /// holds this many console event streams open on this replica.
    #[error(
        "you already have {0} console event streams open on this server (the limit); close a console tab or retry after {secs} s",
        secs = STREAM_RETRY_AFTER_SECS
    )]
    TooManyConsoleStreams(usize),
    #[error("{0}")]
    Unauthorized(&'static str),
    /// 403 `forbidden`: valid credentials that do not allow this call.
    #[error("{0}")]
    Forbidden(String),
    /// 401 `operator_token_expired`: the message says when and how to get a new one.
    #[error("{0}")]
    OperatorTokenExpired(String),
    /// 403 `insufficient_scope`: the token's scope is below what the route requires.
    #[error("{0}")]
    InsufficientScope(String),
    /// 403 `node_revoked`.
    #[error(
        "this node was revoked by an operator; its credential no longer works (register it again with a fresh bootstrap token)"
    )]
    NodeRevoked,
    /// 409 `clone_refused`: a node's credential from another host than the one it is bound
    /// to (its state directory was copied); see `crate::node::clone`.
    #[error("{0}")]
    CloneRefused(String),
    /// 422 `proof_required`: no proof of possession of the WireGuard private key (a plexd
    /// older than this control plane).
    #[error("{0}")]
    ProofRequired(String),
    /// 403 `proof_invalid`: a proof that does not match the key, or an unknown or expired
    /// nonce.
    #[error("{0}")]
    ProofInvalid(String),
    /// 409 `key_in_use`: another live node of the Domain has this WireGuard key.
    #[error("{0}")]
    KeyInUse(String),
    /// 409 `key_prefix_in_use`: another live node of the Domain has a key with the same first
    /// 8 bytes (the prefix relay frames name nodes by).
    #[error("{0}")]
    KeyPrefixInUse(String),
    /// 422 `policy_invalid`: an access policy document that does not parse, names what the
    /// Domain does not know, breaks a limit or fails its tests. The body lists every problem
    /// with line and column (`api::error`); the policy in force is unchanged.
    #[error("the policy document was refused (the policy in force is unchanged):\n{0}")]
    PolicyInvalid(plexsphere_policy::PolicyErrors),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// 409 `name_taken`: another live node of the Domain holds the DNS name.
    #[error("{0}")]
    NameTaken(String),
    /// 400 `route_refused`: a route report with routes that cannot be routes; nothing stored.
    #[error("{0}")]
    RouteRefused(String),
    /// 403 `csrf_required`: a cookie-authenticated write without the CSRF header, or from
    /// another origin (`auth::csrf`).
    #[error("{0}")]
    CsrfRequired(String),
    /// 400 `sign_in_failed`: an OpenID sign-in refused (`auth`); nothing changed.
    #[error("{0}")]
    SignInFailed(String),
    /// 401 `session_expired`: a session past its lifetime or idle timeout, or signed out.
    #[error("{0}")]
    SessionExpired(String),
    /// 404 `sign_in_disabled`: no `--oidc-issuer` on this server.
    #[error(
        "sign-in is not configured on this server (start it with --oidc-issuer); use an operator token"
    )]
    SignInDisabled,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Key(KeyError),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// Whether a whole transaction that failed with this should simply be tried again.
    pub(crate) fn is_lost_race(&self) -> bool {
        matches!(self, Error::Store(e) if e.is_busy())
    }
}

/// A key error that is the database's stays a store error (a database away is `503`, not a
/// key problem).
impl From<KeyError> for Error {
    fn from(e: KeyError) -> Self {
        match e {
            KeyError::Store(s) => Error::Store(s),
            other => Error::Key(other),
        }
    }
}
