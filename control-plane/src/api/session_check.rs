//! The check every session-authenticated request goes through (`api::extract::Operator`):
//! the session is live (not revoked, within its lifetime and idle timeout) and the person
//! still holds a role; otherwise it is revoked on the way and refused.

use serde_json::{Value, json};

use super::state::AppState;
use crate::auth::person_grants;
use crate::auth::roles::RoleGrant;
use crate::auth::session::{self, Kind, SessionSecret};
use crate::error::Error;
use crate::store::{self, sessions};

/// The audit entry of a session event (the platform chain: a person is no Domain's).
pub(super) fn session_audit(
    row: &sessions::SessionRow,
    action: &'static str,
    detail: Value,
) -> crate::audit::AuditEntry {
    let person = crate::audit::PersonRef {
        issuer: row.issuer.clone(),
        subject: row.subject.clone(),
        email: row.email.clone(),
    };
    crate::audit::AuditEntry {
        domain_id: None,
        actor: crate::audit::Actor::session(&row.id, person),
        action,
        target: format!("session/{}", row.id),
        detail,
    }
}

/// The session of `secret` if it is live, with the person's roles now. Expired, idle or
/// role-less sessions are revoked on the way (and refused).
pub async fn live_session(
    st: &AppState,
    secret: &SessionSecret,
    kind: Kind,
) -> Result<(sessions::SessionRow, Vec<RoleGrant>), Error> {
    const BAD: &str =
        "the session is not valid (unknown, wrong secret, or sign-in is off); sign in again";
    let auth = st.auth.as_ref().ok_or(Error::Unauthorized(BAD))?;
    let mut conn = st.store.acquire().await?;
    let row = sessions::get_session(&mut conn, &secret.id)
        .await?
        .ok_or(Error::Unauthorized(BAD))?;
    if !store::secret_matches(&secret.secret, &row.secret_sha256)
        || Kind::parse(&row.kind) != Some(kind)
    {
        return Err(Error::Unauthorized(BAD));
    }
    let now = store::unix(st.now());
    if let Some(reason) = &row.revoked_reason {
        return Err(Error::SessionExpired(format!(
            "this session ended ({reason}); sign in again"
        )));
    }
    if now >= row.expires_at {
        sessions::revoke(&mut conn, &row.id, now, "expired").await?;
        return Err(Error::SessionExpired(
            "this session reached its lifetime; sign in again".into(),
        ));
    }
    let idle = i64::try_from(auth.config.session_idle_timeout.as_secs()).unwrap_or(i64::MAX / 2);
    if now - row.last_seen_at >= idle {
        sessions::revoke(&mut conn, &row.id, now, "idle").await?;
        return Err(Error::SessionExpired(
            "this session was idle too long; sign in again".into(),
        ));
    }
    let roles = person_grants(&mut conn, &row).await?;
    if roles.is_empty() {
        sessions::revoke(&mut conn, &row.id, now, "no role").await?;
        drop(conn);
        st.audit(session_audit(
            &row,
            "auth.session_revoked",
            json!({"reason": "no role"}),
        ))
        .await;
        return Err(Error::SessionExpired(
            "this session ended: no role is bound to you any more; ask an admin".into(),
        ));
    }
    if now - row.last_seen_at >= session::LAST_SEEN_WRITE_EVERY_SECS {
        sessions::touch(&mut conn, &row.id, now).await?;
    }
    Ok((row, roles))
}
