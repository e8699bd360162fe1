//! The operator API of access policy (issue 25): a Domain's policy document, its versions,
//! validation, the reachability diff of a change, explain, and node tags
//! (`plexctl policy ...`, `plexctl node tag ...`). docs/api.md lists the routes.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

/// `GET /v1/domains/{domain}/policy`: the document in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyView {
    pub domain_id: Uuid,
    /// 1 = the Domain's first document (the default allow-all); each change adds one.
    pub version: u64,
    pub document: String,
    /// Who stored it: `NAME (TOKEN_ID)` of an operator token, or `plexsphere` (the default).
    pub author: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// The reachability diff against the version before it, as it read when stored.
    pub summary: String,
}

/// One version as `GET /v1/domains/{domain}/policy/history` lists it (newest first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyVersionView {
    pub version: u64,
    pub author: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    pub summary: String,
}

/// `POST /v1/domains/{domain}/policy/validate`: checks a document against the Domain (its
/// Projects, nodes, tags) and runs its tests; stores nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidatePolicyRequest {
    pub document: String,
}

/// The answer to validate: `valid`, or the problems (each with line and column).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyValidation {
    pub valid: bool,
    #[serde(default)]
    pub errors: Vec<PolicyProblem>,
}

/// One problem of a document: where (1-based line and column; column 0 = somewhere on the
/// line) and what is wrong and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyProblem {
    /// `syntax`, `invalid`, `unknown` (a name the Domain does not know), `limit` or
    /// `test_failed`.
    pub kind: String,
    pub line: u32,
    pub column: u32,
    pub message: String,
}

impl PolicyProblem {
    /// `FILE:LINE:COLUMN: MESSAGE`, as compilers print problems.
    pub fn render(&self, file: &str) -> String {
        format!("{file}:{}:{}: {}", self.line, self.column, self.message)
    }
}

/// The body of a refused document (`422 policy_invalid`): the usual `code` and `message`
/// (the problems rendered, one per line) and the problems themselves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRefusal {
    pub code: String,
    pub message: String,
    #[serde(default)]
    pub errors: Vec<PolicyProblem>,
}

/// `PUT /v1/domains/{domain}/policy`: a new document, applied only when the Domain's current
/// version is still `expected_version` (409 `conflict` otherwise) and not `dry_run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetPolicyRequest {
    pub document: String,
    pub expected_version: u64,
    #[serde(default)]
    pub dry_run: bool,
}

/// `POST /v1/domains/{domain}/policy/rollback`: stores version `version`'s document again, as
/// a new version (history is append-only), after validating it against today's Domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackPolicyRequest {
    pub version: u64,
    pub expected_version: u64,
    #[serde(default)]
    pub dry_run: bool,
}

/// The answer to a change or a rollback: what it changes, and whether it was applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyChange {
    /// False for a dry run: nothing was stored.
    pub applied: bool,
    /// The version in force before.
    pub previous_version: u64,
    /// The version stored (`previous_version + 1`); for a dry run, the one it would get.
    pub version: u64,
    /// The reachability diff against the version in force before, one line per group of
    /// node pairs ("web-1 -> db-1: gains tcp 5432"); empty when nothing changes.
    pub diff: Vec<String>,
}

/// `GET /v1/domains/{domain}/policy/explain?src=&dst=&what=`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyExplanation {
    /// The version the answer is about.
    pub version: u64,
    /// Whether the asked packet (without `what`: anything at all) is allowed.
    pub allowed: bool,
    /// The rule(s) and line(s) that allow it, or "no rule allows it" and a rule that would.
    pub lines: Vec<String>,
}

/// `PUT /v1/nodes/{node_id}/tags`: the node's whole set of tags (`tag:` optional).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetTagsRequest {
    pub tags: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_json_is_pinned() {
        let json = r#"{"domain_id":"019a0816-0000-7000-8000-000000000000","version":2,"document":"rules: []\n","author":"ops (0123456789abcdef)","created_at":"2026-12-05T10:00:00Z","summary":"a -> b: loses any"}"#;
        let v: PolicyView = serde_json::from_str(json).unwrap();
        assert_eq!(v.version, 2);
        assert_eq!(serde_json::to_string(&v).unwrap(), json);
        let json =
            r#"{"applied":false,"previous_version":2,"version":3,"diff":["a -> b: gains tcp 22"]}"#;
        let c: PolicyChange = serde_json::from_str(json).unwrap();
        assert_eq!(serde_json::to_string(&c).unwrap(), json);
        let json = r#"{"code":"policy_invalid","message":"m","errors":[{"kind":"syntax","line":3,"column":7,"message":"bad"}]}"#;
        let r: PolicyRefusal = serde_json::from_str(json).unwrap();
        assert_eq!(r.errors[0].render("p.yaml"), "p.yaml:3:7: bad");
        assert_eq!(serde_json::to_string(&r).unwrap(), json);
        // A refusal reads as the usual error body too.
        let e: crate::ApiError = serde_json::from_str(json).unwrap();
        assert_eq!(e.code, "policy_invalid");
    }

    #[test]
    fn requests_are_strict_and_dry_run_is_optional() {
        let r: SetPolicyRequest =
            serde_json::from_str(r#"{"document":"rules: []","expected_version":1}"#).unwrap();
        assert!(!r.dry_run);
        assert!(
            serde_json::from_str::<SetPolicyRequest>(
                r#"{"document":"x","expected_version":1,"force":true}"#
            )
            .is_err()
        );
        assert!(serde_json::from_str::<SetPolicyRequest>(r#"{"document":"x"}"#).is_err());
        assert!(serde_json::from_str::<SetTagsRequest>(r#"{"tags":["web"],"x":1}"#).is_err());
    }
}
