//! The audit log's API shapes (docs/audit.md, docs/api.md): `GET /v1/audit` and
//! `POST /v1/audit/verify`.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

/// The rows one `GET /v1/audit` answers by default, and the most it answers.
pub const DEFAULT_PAGE: u32 = 100;
pub const MAX_PAGE: u32 = 1_000;

/// Who made a change, as stored: people only as keyed identifiers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditActor {
    /// `token`, `session`, `broker`, `host-cli`, `system` or `node`.
    pub kind: String,
    /// The token or session id, a node id; empty for the broker and the system.
    #[serde(rename = "ref")]
    pub reference: String,
    /// A token's name.
    pub name: String,
    /// `token`, `session`, `reconcile`, `cli`, `system`, `node`.
    pub how: String,
    /// HMAC-SHA256 under the chain's key of the person's issuer and subject (hex), if any.
    pub subject_key: Option<String>,
    /// HMAC-SHA256 under the chain's key of the person's e-mail (hex), if any.
    pub email_key: Option<String>,
}

/// One row of a chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRow {
    pub seq: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    pub actor: AuditActor,
    pub action: String,
    pub target: String,
    pub detail: serde_json::Value,
    pub prev_hash: String,
    pub hash: String,
}

/// `GET /v1/audit?domain=..&since=RFC3339&limit=N&after=SEQ&actor_email=E`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditPage {
    /// `platform` or the Domain's id.
    pub chain: String,
    pub domain_id: Option<Uuid>,
    pub entries: Vec<AuditRow>,
    /// Pass as `after=` for the next page; `None`: this was the last.
    pub next_after: Option<i64>,
}

/// `POST /v1/audit/verify`'s body: `{"domain": id or slug}`; none: the platform chain.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyRequest {
    #[serde(default)]
    pub domain: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyProblem {
    pub seq: i64,
    /// `altered`, `removed`, `reordered` or `inserted`.
    pub kind: String,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub ok: bool,
    pub chain: String,
    pub rows: u64,
    pub problems: Vec<VerifyProblem>,
    /// Problems past the listed ones (the list stops at 100).
    #[serde(default)]
    pub more_problems: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_report_json_is_pinned() {
        let r = VerifyReport {
            ok: false,
            chain: "platform".into(),
            rows: 3,
            problems: vec![VerifyProblem {
                seq: 2,
                kind: "removed".into(),
                detail: "seq 2 is missing".into(),
            }],
            more_problems: 0,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"ok":false,"chain":"platform","rows":3,"problems":[{"seq":2,"kind":"removed","detail":"seq 2 is missing"}],"more_problems":0}"#
        );
    }
}
