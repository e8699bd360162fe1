//! How the API writes the audit log (docs/audit.md): [`AppState::audit`] right after a change
//! that committed on its own, [`by`] for an operator's entry. The log itself (chains, the
//! pepper, the encoding) is `crate::audit`, which knows nothing of the API.

use ring::hmac;
use uuid::Uuid;

use super::extract::{Operator, Via};
use super::state::AppState;
use crate::audit::{Actor, AuditEntry, AuditError, PepperError, PersonRef, record};
use crate::store::{self, StoreError};

impl AppState {
    /// This replica's pepper as an HMAC key.
    pub fn pepper_key(&self) -> Result<hmac::Key, PepperError> {
        self.pepper.key(&self.keys)
    }

    /// Records `entry` right after a change that committed on its own, in a transaction of its
    /// own (retried when it loses a race with another append). A failure cannot undo the
    /// change: it is logged at error level and counted
    /// (`plexsphere_audit_write_failures_total`), and the change's answer stands.
    pub async fn audit(&self, entry: AuditEntry) {
        let now = store::unix(self.now());
        let result = async {
            let pepper = self.pepper_key()?;
            store::retry(
                "audit append",
                |e: &AuditError| matches!(e, AuditError::Store(s) if s.is_busy()),
                || async {
                    let mut tx = self.store.begin().await?;
                    record(&mut tx, &pepper, &entry, now).await?;
                    tx.commit().await.map_err(StoreError::from)?;
                    Ok::<_, AuditError>(())
                },
            )
            .await
        }
        .await;
        if let Err(e) = result {
            self.metrics.audit_write_failures.inc();
            tracing::error!(
                action = entry.action, target = %entry.target, error = %e,
                "the change was made but its audit row could not be written; check the database"
            );
        }
    }
}

impl AppState {
    /// [`AppState::audit`] for a change to something of `project`: the row goes to the chain
    /// of the project's Domain.
    pub(crate) async fn audit_in_project(&self, project: Uuid, mut entry: AuditEntry) {
        let found = async {
            let mut conn = self.store.acquire().await?;
            store::projects::get(&mut conn, project).await
        }
        .await;
        match found {
            Ok(Some(p)) => {
                entry.domain_id = Some(p.domain_id);
                self.audit(entry).await;
            }
            other => {
                self.metrics.audit_write_failures.inc();
                let error = match other {
                    Err(e) => e.to_string(),
                    _ => "the project is gone".to_owned(),
                };
                tracing::error!(
                    action = entry.action, target = %entry.target, project_id = %project, error = %error,
                    "the change was made but its audit row could not be written: its project's Domain cannot be read"
                );
            }
        }
    }
}

/// An entry by `op` (the Domain filled in by the caller or [`AppState::audit_in_project`]).
pub(crate) fn by(
    op: &Operator,
    domain_id: Option<Uuid>,
    action: &'static str,
    target: String,
    detail: serde_json::Value,
) -> AuditEntry {
    AuditEntry {
        domain_id,
        actor: actor(op),
        action,
        target,
        detail,
    }
}

/// The operator of a request as an audit actor: a token as itself; a session as its public
/// id and the person behind it (stored keyed).
pub(crate) fn actor(op: &Operator) -> Actor {
    match (&op.via, &op.person) {
        (Via::Session { session_id }, Some(p)) => Actor::session(
            session_id,
            PersonRef {
                issuer: p.issuer.clone(),
                subject: p.subject.clone(),
                email: p.email.clone(),
            },
        ),
        _ => Actor {
            kind: "token",
            reference: op.id.clone(),
            name: op.name.clone(),
            how: "token",
            person: None,
        },
    }
}
