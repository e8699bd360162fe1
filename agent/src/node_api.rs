//! The node API calls (`/v1/nodes/{id}/...`), each with `Authorization: Bearer <credential>`,
//! and how their failures read. The daemon runs them as spawned tasks.

use std::time::Duration;

use plexsphere_wire::host::{HOST_HEADER, HostFingerprint};
use plexsphere_wire::node::{EndpointAck, EndpointReport, Heartbeat, HeartbeatAck, IngestBatch};
use plexsphere_wire::rotation::{CredentialRotated, KeyChallenge, KeyRotated, KeyRotation};
use plexsphere_wire::{ApiError, codes};
use uuid::Uuid;

use crate::api_client::{self, ApiClient};
use crate::identity::SecretString;

/// The largest answer body plexd reads (a state document with thousands of peers fits).
pub const MAX_ANSWER: usize = 8 * 1024 * 1024;
/// The largest key chain plexd reads: [`MAX_KEY_CHAIN`] transitions of about 400 bytes each
/// fit many times over.
///
/// [`MAX_KEY_CHAIN`]: plexsphere_wire::signing_keys::MAX_KEY_CHAIN
pub(crate) const MAX_KEY_CHAIN_ANSWER: usize = 256 * 1024;

/// Why a call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// Not reachable or not trusted (DNS, refused, timeout, TLS); the text says which.
    Unreachable(String),
    /// 401: the credential no longer exists (the node was deleted server-side).
    Unauthorized,
    /// 403 `node_revoked`.
    Revoked,
    /// 409 `clone_refused`: the control plane saw this credential from another host than the
    /// one the node is bound to; this state dir is a copy. Ends the daemon (exit 16).
    CloneRefused,
    /// Any other refusal.
    Refused {
        status: u16,
        error: ApiError,
        retry_after: Option<Duration>,
    },
    /// A success status with a body plexd cannot read.
    BadAnswer(String),
}

impl CallError {
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CallError::Refused { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A refusal that sending the same request again cannot change: a 4xx other than 408
    /// (timeout) and 429 (rate limited). 401 and `node_revoked` end the daemon elsewhere.
    pub fn is_final(&self) -> bool {
        matches!(self, CallError::Refused { status, .. }
            if (400..500).contains(status) && !matches!(status, 408 | 429))
    }

    /// Classifies a refusal by status and body.
    pub(crate) fn from_answer(status: u16, body: &[u8], retry_after: Option<Duration>) -> Self {
        let error = serde_json::from_slice::<ApiError>(body).unwrap_or_else(|_| {
            ApiError::new(
                "unexpected_answer",
                format!("HTTP {status}: {}", api_client::quote(body)),
            )
        });
        match (status, error.code.as_str()) {
            (401, _) => CallError::Unauthorized,
            (403, codes::NODE_REVOKED) => CallError::Revoked,
            (409, codes::CLONE_REFUSED) => CallError::CloneRefused,
            _ => CallError::Refused {
                status,
                error,
                retry_after,
            },
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Unreachable(r) => f.write_str(r),
            CallError::Unauthorized => {
                f.write_str("HTTP 401 unauthorized: the node no longer exists on the control plane")
            }
            CallError::Revoked => {
                f.write_str("HTTP 403 node_revoked: an operator revoked this node")
            }
            CallError::CloneRefused => f.write_str(
                "HTTP 409 clone_refused: the control plane saw this node's credential from another host",
            ),
            CallError::Refused { status, error, .. } => write!(f, "HTTP {status} {error}"),
            CallError::BadAnswer(r) => write!(f, "an answer plexd cannot read: {r}"),
        }
    }
}

/// What `GET /state` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateAnswer {
    /// 304: the version in `If-None-Match` is current.
    NotModified,
    /// 200: the signed envelope's bytes (verified by the caller).
    Body(Vec<u8>),
}

/// What `DELETE /v1/nodes/{id}` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaveAnswer {
    Deleted,
    /// 401 or 404: the node was gone already.
    AlreadyGone(u16),
}

/// One node's view of the API.
#[derive(Clone)]
pub struct NodeApi {
    api: ApiClient,
    node_id: Uuid,
    /// Shared by every clone: a credential rotation switches all of them at once.
    credential: std::sync::Arc<std::sync::RwLock<SecretString>>,
    /// This host's fingerprint, sent as `Plexd-Host` with every call.
    host: Option<HostFingerprint>,
}

impl NodeApi {
    pub fn new(api: ApiClient, node_id: Uuid, credential: SecretString) -> Self {
        Self {
            api,
            node_id,
            credential: std::sync::Arc::new(std::sync::RwLock::new(credential)),
            host: None,
        }
    }

    /// Sends `host` as `Plexd-Host` with every call (the control plane refuses a node's
    /// credential from another host than the one it saw first).
    pub(crate) fn with_host(mut self, host: HostFingerprint) -> Self {
        self.host = Some(host);
        self
    }

    /// The `Plexd-Host` header's value, when the host is known.
    pub(crate) fn host_header(&self) -> Option<String> {
        self.host.as_ref().map(HostFingerprint::to_hex)
    }

    /// From now on every call (of every clone) authenticates with `credential`.
    pub(crate) fn set_credential(&self, credential: SecretString) {
        *self
            .credential
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = credential;
    }

    pub fn node_id(&self) -> Uuid {
        self.node_id
    }

    pub fn api(&self) -> &ApiClient {
        &self.api
    }

    pub fn url(&self, tail: &str) -> reqwest::Url {
        self.api
            .base()
            .join(&format!("/v1/nodes/{}{tail}", self.node_id))
    }

    pub fn bearer(&self) -> String {
        let c = self
            .credential
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        format!("Bearer {}", c.expose())
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<(u16, reqwest::header::HeaderMap, Vec<u8>), CallError> {
        self.send_limited(req, MAX_ANSWER).await
    }

    /// [`Self::send`] with a body of at most `limit` bytes.
    async fn send_limited(
        &self,
        req: reqwest::RequestBuilder,
        limit: usize,
    ) -> Result<(u16, reqwest::header::HeaderMap, Vec<u8>), CallError> {
        let mut req = req.header(reqwest::header::AUTHORIZATION, self.bearer());
        if let Some(host) = self.host_header() {
            req = req.header(HOST_HEADER, host);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| CallError::Unreachable(self.api.classify(&e).to_string()))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = read_limited(resp, limit)
            .await
            .map_err(|e| CallError::Unreachable(self.api.classify(&e).to_string()))?
            .ok_or_else(|| {
                CallError::BadAnswer(format!("the body is larger than {limit} bytes"))
            })?;
        Ok((status, headers, body))
    }

    async fn post_json<T: serde::Serialize, A: serde::de::DeserializeOwned>(
        &self,
        tail: &str,
        body: &T,
    ) -> Result<A, CallError> {
        let answer = self
            .send(self.api.http().post(self.url(tail)).json(body))
            .await?;
        json_answer(answer)
    }

    pub async fn heartbeat(&self, hb: &Heartbeat) -> Result<HeartbeatAck, CallError> {
        self.post_json("/heartbeat", hb).await
    }

    pub async fn endpoints(&self, r: &EndpointReport) -> Result<EndpointAck, CallError> {
        self.post_json("/endpoints", r).await
    }

    /// `PUT /v1/nodes/{id}/routes`: what this node offers and which exit it uses.
    pub async fn routes(
        &self,
        r: &plexsphere_wire::routes::RoutesReport,
    ) -> Result<plexsphere_wire::routes::RoutesAck, CallError> {
        json_answer(
            self.send(self.api.http().put(self.url("/routes")).json(r))
                .await?,
        )
    }

    /// `PUT /v1/nodes/{id}/paths`: each peer's path as this node sees it (issue 28).
    pub async fn paths(
        &self,
        r: &plexsphere_wire::paths::PathsReport,
    ) -> Result<plexsphere_wire::paths::PathsAck, CallError> {
        json_answer(
            self.send(self.api.http().put(self.url("/paths")).json(r))
                .await?,
        )
    }

    pub async fn ingest(&self, b: &IngestBatch) -> Result<(), CallError> {
        let (status, headers, bytes) = self
            .send(self.api.http().post(self.url("/ingest")).json(b))
            .await?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(CallError::from_answer(
                status,
                &bytes,
                retry_after(&headers),
            ))
        }
    }

    /// `GET /state` with `If-None-Match: "<version>"` when a state is applied.
    pub async fn state(&self, applied: Option<u64>) -> Result<StateAnswer, CallError> {
        let mut req = self.api.http().get(self.url("/state"));
        if let Some(v) = applied {
            req = req.header(reqwest::header::IF_NONE_MATCH, format!("\"{v}\""));
        }
        let (status, headers, bytes) = self.send(req).await?;
        match status {
            304 => Ok(StateAnswer::NotModified),
            200 => Ok(StateAnswer::Body(bytes)),
            _ => Err(CallError::from_answer(
                status,
                &bytes,
                retry_after(&headers),
            )),
        }
    }

    /// `GET /v1/nodes/{id}/key`: the challenge a key rotation's proof is made with.
    pub async fn key_challenge(&self) -> Result<KeyChallenge, CallError> {
        json_answer(self.send(self.api.http().get(self.url("/key"))).await?)
    }

    /// `POST /v1/nodes/{id}/key`.
    pub async fn rotate_key(&self, r: &KeyRotation) -> Result<KeyRotated, CallError> {
        self.post_json("/key", r).await
    }

    /// `POST /v1/nodes/{id}/credential` with the proof of the node's key.
    pub async fn rotate_credential(
        &self,
        r: &plexsphere_wire::proof::CredentialRotation,
    ) -> Result<CredentialRotated, CallError> {
        self.post_json("/credential", r).await
    }

    /// `GET /v1/nodes/{id}/signing-keys`: the Domain's key chain (verified by the caller,
    /// link by link from the pinned key).
    pub async fn signing_keys(
        &self,
    ) -> Result<plexsphere_wire::signing_keys::SigningKeyChain, CallError> {
        let tail = format!("/{}", plexsphere_wire::signing_keys::SIGNING_KEYS_PATH);
        let req = self.api.http().get(self.url(&tail));
        json_answer(self.send_limited(req, MAX_KEY_CHAIN_ANSWER).await?)
    }

    /// `DELETE /v1/nodes/{id}`.
    pub async fn leave(&self) -> Result<LeaveAnswer, CallError> {
        let (status, headers, bytes) = self.send(self.api.http().delete(self.url(""))).await?;
        match status {
            200..=299 => Ok(LeaveAnswer::Deleted),
            401 | 404 => Ok(LeaveAnswer::AlreadyGone(status)),
            _ => Err(CallError::from_answer(
                status,
                &bytes,
                retry_after(&headers),
            )),
        }
    }
}

/// A 2xx answer's JSON body, or the error the answer carries.
fn json_answer<A: serde::de::DeserializeOwned>(
    (status, headers, bytes): (u16, reqwest::header::HeaderMap, Vec<u8>),
) -> Result<A, CallError> {
    if !(200..300).contains(&status) {
        return Err(CallError::from_answer(
            status,
            &bytes,
            retry_after(&headers),
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| CallError::BadAnswer(e.to_string()))
}

pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(api_client::parse_retry_after)
}

/// Reads a body up to `limit` bytes; `None` when it is larger.
async fn read_limited(
    mut resp: reqwest::Response,
    limit: usize,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if out.len() + chunk.len() > limit {
            return Ok(None);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_classified() {
        let revoked = br#"{"code":"node_revoked","message":"revoked"}"#;
        assert_eq!(
            CallError::from_answer(403, revoked, None),
            CallError::Revoked
        );
        let unauth = br#"{"code":"unauthorized","message":"no"}"#;
        assert_eq!(
            CallError::from_answer(401, unauth, None),
            CallError::Unauthorized
        );
        assert_eq!(
            CallError::from_answer(401, b"", None),
            CallError::Unauthorized
        );
        let e = CallError::from_answer(503, b"<html>busy</html>", Some(Duration::from_secs(4)));
        assert_eq!(e.retry_after(), Some(Duration::from_secs(4)));
        assert_eq!(
            e.to_string(),
            "HTTP 503 HTTP 503: <html>busy</html> (unexpected_answer)"
        );
        let clone = br#"{"code":"clone_refused","message":"another host"}"#;
        assert_eq!(
            CallError::from_answer(409, clone, None),
            CallError::CloneRefused
        );
        let conflict = br#"{"code":"conflict","message":"busy"}"#;
        assert!(matches!(
            CallError::from_answer(409, conflict, None),
            CallError::Refused { status: 409, .. }
        ));
        let forbidden = br#"{"code":"forbidden","message":"not yours"}"#;
        assert!(matches!(
            CallError::from_answer(403, forbidden, None),
            CallError::Refused { status: 403, .. }
        ));
    }

    #[test]
    fn only_client_errors_other_than_timeout_and_rate_limit_are_final() {
        let refused = |status| CallError::from_answer(status, b"", None);
        for status in [400, 404, 413, 422] {
            assert!(refused(status).is_final(), "{status}");
        }
        for status in [408, 429, 500, 502, 503] {
            assert!(!refused(status).is_final(), "{status}");
        }
        assert!(!CallError::Unreachable("refused".into()).is_final());
    }
}
