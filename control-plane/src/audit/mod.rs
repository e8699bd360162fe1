//! The audit log (docs/audit.md): every change an operator, the broker or the host's
//! `plexsphere` commands make, appended to a hash chain per Domain (and one platform chain for
//! what belongs to no Domain), people's identifiers keyed with the pepper.
//!
//! A change records itself with one line: [`record`] inside the change's own transaction, or
//! [`AppState::audit`] right after a change that committed on its own (which one each change
//! uses is listed in docs/audit.md, "What is recorded").

pub(crate) mod chain;
pub(crate) mod pepper;
pub(crate) mod table;

use ring::hmac;
use uuid::Uuid;

use crate::store::StoreError;
use chain::{ChainKey, Row};
pub(crate) use pepper::{Pepper, PepperError};

/// The chain of changes that belong to no Domain (operator tokens, platform role bindings,
/// cloud credentials).
pub(crate) const PLATFORM_CHAIN: &str = "platform";

/// The chain id of a Domain, or of the platform for `None`.
pub(crate) fn chain_id(domain: Option<Uuid>) -> String {
    domain.map_or_else(|| PLATFORM_CHAIN.to_owned(), |d| d.to_string())
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Pepper(#[from] PepperError),
    #[error("the audit row's detail cannot be encoded: {0}")]
    Detail(String),
}

impl From<AuditError> for crate::error::Error {
    fn from(e: AuditError) -> Self {
        match e {
            AuditError::Store(s) => crate::error::Error::Store(s),
            other => crate::error::Error::Internal(other.to_string()),
        }
    }
}

/// A person behind a session, as the issuer names them. Stored only keyed (HMAC under the
/// chain's key), never in clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersonRef {
    pub issuer: String,
    pub subject: String,
    pub email: Option<String>,
}

/// Who made a change and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// `token`, `session`, `broker`, `host-cli`, `system` or `node`.
    pub kind: &'static str,
    /// A token or session id as it is, a node id; empty for the broker and the system.
    pub reference: String,
    /// A token's name (never a person's name or e-mail).
    pub name: String,
    /// The channel: `token`, `session`, `reconcile` (broker), `cli` (host), `system`, `node`.
    pub how: &'static str,
    pub person: Option<PersonRef>,
}

impl Actor {
    /// A person signed in through the issuer: `session_id` is the session's public id.
    pub fn session(session_id: &str, person: PersonRef) -> Self {
        Actor {
            kind: "session",
            reference: session_id.to_owned(),
            name: String::new(),
            how: "session",
            person: Some(person),
        }
    }

    /// The provisioning broker's reconcile loop.
    pub fn broker() -> Self {
        Self::fixed("broker", "reconcile")
    }

    /// The server-side `plexsphere` commands run on the host.
    pub(crate) fn host_cli() -> Self {
        Self::fixed("host-cli", "cli")
    }

    /// The control plane on its own (maintenance, expiry).
    pub fn system() -> Self {
        Self::fixed("system", "system")
    }

    /// A node about itself.
    pub fn node(node_id: Uuid) -> Self {
        Actor {
            kind: "node",
            reference: node_id.to_string(),
            name: String::new(),
            how: "node",
            person: None,
        }
    }

    fn fixed(kind: &'static str, how: &'static str) -> Self {
        Actor {
            kind,
            reference: String::new(),
            name: String::new(),
            how,
            person: None,
        }
    }
}

/// One change to record.
#[derive(Debug, Clone)]
pub struct AuditEntry {
    /// The Domain the change belongs to; `None`: the platform chain.
    pub domain_id: Option<Uuid>,
    pub actor: Actor,
    /// What happened, `<object>.<verb>` (`token.issue`, `node.revoke`; docs/audit.md lists them).
    pub action: &'static str,
    /// What it happened to (`node/<id>`, `bootstrap-token/<id>`...).
    pub target: String,
    /// More about it (never a secret).
    pub detail: serde_json::Value,
}

/// `detail` as canonical JSON: object keys sorted, no whitespace.
pub(crate) fn canonical_json(v: &serde_json::Value) -> Result<String, AuditError> {
    fn sorted(v: &serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                let mut out = serde_json::Map::new();
                for k in keys {
                    out.insert(k.clone(), sorted(&m[k.as_str()]));
                }
                serde_json::Value::Object(out)
            }
            serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_string(&sorted(v)).map_err(|e| AuditError::Detail(e.to_string()))
}

/// Appends `entry` to its chain at `now` (unix seconds), on `conn`: give it the change's own
/// transaction where the change has one, so the change and its row commit together.
pub async fn record(
    conn: &mut sqlx::AnyConnection,
    pepper: &hmac::Key,
    entry: &AuditEntry,
    now: i64,
) -> Result<Row, AuditError> {
    let chain = chain_id(entry.domain_id);
    let key = ChainKey::derive(pepper, &chain);
    let person = entry.actor.person.as_ref();
    let row = Row {
        actor_subject: person
            .map(|p| key.person("subject", &format!("{}\n{}", p.issuer, p.subject)))
            .unwrap_or_default(),
        actor_email: person
            .and_then(|p| p.email.as_deref())
            .map(|e| key.person("email", e))
            .unwrap_or_default(),
        chain_id: chain,
        seq: 0,
        at: now,
        actor_kind: entry.actor.kind.to_owned(),
        actor_ref: entry.actor.reference.clone(),
        actor_name: entry.actor.name.clone(),
        how: entry.actor.how.to_owned(),
        action: entry.action.to_owned(),
        target: entry.target.clone(),
        detail: canonical_json(&entry.detail)?,
        prev_hash: String::new(),
        hash: String::new(),
        mac: String::new(),
    };
    Ok(table::append(conn, &key, row).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let v = serde_json::json!({"b": 1, "a": {"d": [ {"z": 1, "y": 2} ], "c": null}});
        assert_eq!(
            canonical_json(&v).unwrap(),
            r#"{"a":{"c":null,"d":[{"y":2,"z":1}]},"b":1}"#
        );
    }

    #[test]
    fn chain_ids() {
        assert_eq!(chain_id(None), "platform");
        assert_eq!(chain_id(Some(Uuid::nil())), Uuid::nil().to_string());
    }
}
