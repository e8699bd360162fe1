//! The operator API's token views (re-exported by [`crate::admin`], the path callers use):
//! bootstrap tokens (issued, listed) and operator tokens (their scopes, created, listed).

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::secret::TokenKind;

/// `POST /v1/projects/{project_id}/bootstrap-tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssueTokenRequest {
    pub kind: TokenKind,
    /// 1-16 characters of `a-z0-9`; appears in the token's text (`pxbt_<env>_...`).
    pub env_prefix: String,
    /// Lifetime in seconds (at least 60, at most 30 days).
    pub ttl_secs: u64,
    /// How many nodes may register with the token, 1-1000; absent: 1 (single use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uses: Option<u32>,
    /// Makes the token's nodes ephemeral: the control plane removes one once it has been
    /// offline this many seconds (120 to 7 days). Absent: not ephemeral.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_offline_secs: Option<u64>,
    /// Tags every node the token makes gets at registration (`tag:` optional; at most 32).
    /// Absent: none. An older server refuses the field (it knows no tags).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

/// The answer to issuing a token: the only time its text is ever shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedToken {
    pub id: String,
    pub token: String,
    pub project_id: Uuid,
    pub kind: TokenKind,
    pub env_prefix: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// How many nodes may register with it (1 from older servers).
    #[serde(default = "one")]
    pub max_uses: u32,
    /// Set when its nodes are ephemeral: removed after this many seconds offline.
    #[serde(default)]
    pub ephemeral_offline_secs: Option<u64>,
    /// The tags its nodes get at registration (names without `tag:`; empty from older
    /// servers).
    #[serde(default)]
    pub tags: Vec<String>,
}

/// What older servers mean by a token's use limit: single use.
fn one() -> u32 {
    1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenStatus {
    Active,
    Consumed,
    Expired,
    Revoked,
}

impl TokenStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenStatus::Active => "active",
            TokenStatus::Consumed => "consumed",
            TokenStatus::Expired => "expired",
            TokenStatus::Revoked => "revoked",
        }
    }
}

/// One bootstrap token as `bootstrap-token list` shows it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenView {
    pub id: String,
    pub project_id: Uuid,
    pub kind: TokenKind,
    pub env_prefix: String,
    pub status: TokenStatus,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option", default)]
    pub consumed_at: Option<OffsetDateTime>,
    /// The node that took the token's last use (its only one for a single-use token).
    #[serde(default)]
    pub consumed_by_node: Option<Uuid>,
    #[serde(with = "time::serde::rfc3339::option", default)]
    pub revoked_at: Option<OffsetDateTime>,
    /// The resource the broker minted this token for, if any.
    #[serde(default)]
    pub resource_id: Option<Uuid>,
    /// Nodes registered with it so far, and how many may (1 and 0/1 from older servers).
    #[serde(default)]
    pub uses: u32,
    #[serde(default = "one")]
    pub max_uses: u32,
    /// Set when its nodes are ephemeral: removed after this many seconds offline.
    #[serde(default)]
    pub ephemeral_offline_secs: Option<u64>,
    /// The nodes it made that still exist, oldest first (empty from older servers).
    #[serde(default)]
    pub nodes: Vec<Uuid>,
    /// The tags its nodes get at registration, fixed when it was issued (names without
    /// `tag:`; empty from older servers).
    #[serde(default)]
    pub tags: Vec<String>,
}

/// What an operator token may do (docs/api.md, "Operator token scopes"); ordered, each scope
/// allows everything the ones before it allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OperatorScope {
    /// Reads only (`GET`).
    ReadOnly,
    /// Day-to-day work: bootstrap tokens, nodes, resources (machines).
    Operator,
    /// Everything, operator tokens and cloud credentials included.
    Admin,
}

impl OperatorScope {
    pub const ALL: [OperatorScope; 3] = [
        OperatorScope::ReadOnly,
        OperatorScope::Operator,
        OperatorScope::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OperatorScope::ReadOnly => "read-only",
            OperatorScope::Operator => "operator",
            OperatorScope::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<OperatorScope> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatorTokenStatus {
    Active,
    Expired,
    Revoked,
}

/// One operator token as `GET /v1/operator-tokens` and `GET /v1/operator-tokens/self` show it
/// (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorTokenView {
    pub id: String,
    pub name: String,
    pub scope: OperatorScope,
    /// The one project the token is limited to; `None`: every project.
    #[serde(default)]
    pub project_id: Option<Uuid>,
    /// Created before scopes existed: admin, never expires; replace it with a scoped token.
    #[serde(default)]
    pub legacy: bool,
    pub status: OperatorTokenStatus,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// `None`: never expires (admin and legacy tokens only).
    #[serde(with = "time::serde::rfc3339::option", default)]
    pub expires_at: Option<OffsetDateTime>,
    /// Recorded at most once a minute per token.
    #[serde(with = "time::serde::rfc3339::option", default)]
    pub last_used_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339::option", default)]
    pub revoked_at: Option<OffsetDateTime>,
}

/// `POST /v1/operator-tokens` (admin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateOperatorToken {
    pub name: String,
    pub scope: OperatorScope,
    #[serde(default)]
    pub project_id: Option<Uuid>,
    /// `90d`, `12h`, `1d12h`... or `never` (admin only); absent: 90 days.
    #[serde(default)]
    pub expires_in: Option<String>,
}

/// The answer to creating an operator token: the only time its text is ever shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedOperatorToken {
    pub token: String,
    #[serde(flatten)]
    pub view: OperatorTokenView,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_token_view_json_is_pinned() {
        let json = r#"{"id":"0123456789abcdef","name":"ci","scope":"read-only","project_id":"019a0816-0000-7000-8000-000000000002","legacy":false,"status":"active","created_at":"2026-11-30T10:00:00Z","expires_at":"2027-02-28T10:00:00Z","last_used_at":null,"revoked_at":null}"#;
        let v: OperatorTokenView = serde_json::from_str(json).unwrap();
        assert_eq!(v.scope, OperatorScope::ReadOnly);
        assert_eq!(serde_json::to_string(&v).unwrap(), json);
        assert!(OperatorScope::ReadOnly < OperatorScope::Operator);
        assert!(OperatorScope::Operator < OperatorScope::Admin);
        for s in OperatorScope::ALL {
            assert_eq!(OperatorScope::parse(s.as_str()), Some(s));
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
        let req: CreateOperatorToken =
            serde_json::from_str(r#"{"name":"ci","scope":"operator"}"#).unwrap();
        assert_eq!((req.project_id, req.expires_in), (None, None));
    }

    #[test]
    fn token_view_json_is_pinned() {
        let json = r#"{"id":"0123456789abcdef","project_id":"019a0816-0000-7000-8000-000000000002","kind":"node","env_prefix":"lab","status":"consumed","created_at":"2026-11-30T10:00:00Z","expires_at":"2026-11-30T11:00:00Z","consumed_at":"2026-11-30T10:05:00Z","consumed_by_node":"019a0816-0000-7000-8000-0000000000aa","revoked_at":null,"resource_id":null,"uses":3,"max_uses":3,"ephemeral_offline_secs":1800,"nodes":["019a0816-0000-7000-8000-0000000000aa"],"tags":["ci"]}"#;
        let v: TokenView = serde_json::from_str(json).unwrap();
        assert_eq!(v.status, TokenStatus::Consumed);
        assert_eq!((v.uses, v.max_uses), (3, 3));
        assert_eq!(serde_json::to_string(&v).unwrap(), json);
    }

    #[test]
    fn a_token_view_from_an_older_server_is_single_use() {
        let json = r#"{"id":"0123456789abcdef","project_id":"019a0816-0000-7000-8000-000000000002","kind":"node","env_prefix":"lab","status":"active","created_at":"2026-11-30T10:00:00Z","expires_at":"2026-11-30T11:00:00Z","consumed_at":null,"consumed_by_node":null,"revoked_at":null,"resource_id":null}"#;
        let v: TokenView = serde_json::from_str(json).unwrap();
        assert_eq!((v.uses, v.max_uses, v.ephemeral_offline_secs), (0, 1, None));
        assert!(v.nodes.is_empty());
        assert!(v.tags.is_empty());
    }

    #[test]
    fn issue_token_request_json_is_pinned_and_the_new_fields_are_optional() {
        let json = r#"{"kind":"node","env_prefix":"asg","ttl_secs":3600,"max_uses":50,"ephemeral_offline_secs":1800}"#;
        let r: IssueTokenRequest = serde_json::from_str(json).unwrap();
        assert_eq!(
            (r.max_uses, r.ephemeral_offline_secs),
            (Some(50), Some(1800))
        );
        assert_eq!(serde_json::to_string(&r).unwrap(), json);
        let tagged =
            r#"{"kind":"node","env_prefix":"asg","ttl_secs":3600,"tags":["tag:ci","web"]}"#;
        let r: IssueTokenRequest = serde_json::from_str(tagged).unwrap();
        assert_eq!(r.tags, vec!["tag:ci", "web"]);
        assert_eq!(serde_json::to_string(&r).unwrap(), tagged);
        let old = r#"{"kind":"node","env_prefix":"lab","ttl_secs":3600}"#;
        let r: IssueTokenRequest = serde_json::from_str(old).unwrap();
        assert_eq!((r.max_uses, r.ephemeral_offline_secs), (None, None));
        assert_eq!(serde_json::to_string(&r).unwrap(), old);
    }

    #[test]
    fn issue_request_is_strict() {
        let ok: IssueTokenRequest =
            serde_json::from_str(r#"{"kind":"node","env_prefix":"lab","ttl_secs":3600}"#).unwrap();
        assert_eq!(ok.kind, TokenKind::Node);
        assert!(
            serde_json::from_str::<IssueTokenRequest>(
                r#"{"kind":"user","env_prefix":"lab","ttl_secs":1}"#
            )
            .is_err()
        );
        assert!(
            serde_json::from_str::<IssueTokenRequest>(
                r#"{"kind":"node","env_prefix":"lab","ttl_secs":1,"x":1}"#
            )
            .is_err()
        );
    }
}
