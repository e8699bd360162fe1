//! The sign-in tables (schema version 19): sign-ins in progress, sessions, and the ID tokens
//! plexctl exchanged.

use sqlx::{AnyConnection, Row as _};

use super::StoreError;

/// A sign-in in progress.
#[derive(Clone)]
pub(crate) struct PendingRow {
    pub state_sha256: String,
    pub browser_sha256: String,
    pub nonce: String,
    pub pkce_verifier: String,
    pub return_to: String,
    pub client_key: String,
    pub created_at: i64,
    pub expires_at: i64,
}

impl std::fmt::Debug for PendingRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRow")
            .field("return_to", &self.return_to)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// Deletes expired sign-ins and exchanged-token digests.
pub(crate) async fn purge_expired(conn: &mut AnyConnection, now: i64) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM auth_pending WHERE expires_at <= $1")
        .bind(now)
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM auth_used_id_tokens WHERE expires_at <= $1")
        .bind(now)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Live sign-ins of `client_key`, and in all.
pub(crate) async fn count_pending(
    conn: &mut AnyConnection,
    client_key: &str,
    now: i64,
) -> Result<(i64, i64), StoreError> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS total, COALESCE(SUM(CASE WHEN client_key = $1 THEN 1 ELSE 0 END), 0) AS mine FROM auth_pending WHERE expires_at > $2",
    )
    .bind(client_key.to_owned())
    .bind(now)
    .fetch_one(&mut *conn)
    .await?;
    Ok((row.try_get("mine")?, row.try_get("total")?))
}

pub(crate) async fn insert_pending(
    conn: &mut AnyConnection,
    p: &PendingRow,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO auth_pending (state_sha256, browser_sha256, nonce, pkce_verifier, return_to, client_key, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(p.state_sha256.clone())
    .bind(p.browser_sha256.clone())
    .bind(p.nonce.clone())
    .bind(p.pkce_verifier.clone())
    .bind(p.return_to.clone())
    .bind(p.client_key.clone())
    .bind(p.created_at)
    .bind(p.expires_at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Takes (reads and deletes) the sign-in of `state_sha256`: `None` if there is none, or if a
/// concurrent callback took it first (single use).
pub(crate) async fn take_pending(
    conn: &mut AnyConnection,
    state_sha256: &str,
) -> Result<Option<PendingRow>, StoreError> {
    let Some(row) = sqlx::query(
        "SELECT state_sha256, browser_sha256, nonce, pkce_verifier, return_to, client_key, created_at, expires_at FROM auth_pending WHERE state_sha256 = $1",
    )
    .bind(state_sha256.to_owned())
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    let p = PendingRow {
        state_sha256: row.try_get("state_sha256")?,
        browser_sha256: row.try_get("browser_sha256")?,
        nonce: row.try_get("nonce")?,
        pkce_verifier: row.try_get("pkce_verifier")?,
        return_to: row.try_get("return_to")?,
        client_key: row.try_get("client_key")?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
    };
    let gone = sqlx::query("DELETE FROM auth_pending WHERE state_sha256 = $1")
        .bind(state_sha256.to_owned())
        .execute(&mut *conn)
        .await?;
    Ok((gone.rows_affected() == 1).then_some(p))
}

/// A session.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionRow {
    pub id: String,
    pub secret_sha256: String,
    /// `cookie` or `bearer`.
    pub kind: String,
    pub csrf_sha256: Option<String>,
    pub issuer: String,
    pub subject: String,
    pub email: Option<String>,
    pub name: Option<String>,
    pub groups: Vec<String>,
    pub created_at: i64,
    pub last_seen_at: i64,
    pub expires_at: i64,
    pub revoked_at: Option<i64>,
    pub revoked_reason: Option<String>,
}

impl std::fmt::Debug for SessionRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRow")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("subject", &self.subject)
            .field("expires_at", &self.expires_at)
            .field("revoked_at", &self.revoked_at)
            .finish_non_exhaustive()
    }
}

const COLUMNS: &str = "id, secret_sha256, kind, csrf_sha256, issuer, subject, email, name, groups_json, created_at, last_seen_at, expires_at, revoked_at, revoked_reason";

fn from_row(row: &sqlx::any::AnyRow) -> Result<SessionRow, StoreError> {
    let groups: String = row.try_get("groups_json")?;
    let groups = serde_json::from_str(&groups)
        .map_err(|e| StoreError::corrupt("auth_sessions.groups_json", e))?;
    Ok(SessionRow {
        id: row.try_get("id")?,
        secret_sha256: row.try_get("secret_sha256")?,
        kind: row.try_get("kind")?,
        csrf_sha256: row.try_get("csrf_sha256")?,
        issuer: row.try_get("issuer")?,
        subject: row.try_get("subject")?,
        email: row.try_get("email")?,
        name: row.try_get("name")?,
        groups,
        created_at: row.try_get("created_at")?,
        last_seen_at: row.try_get("last_seen_at")?,
        expires_at: row.try_get("expires_at")?,
        revoked_at: row.try_get("revoked_at")?,
        revoked_reason: row.try_get("revoked_reason")?,
    })
}

pub async fn insert_session(conn: &mut AnyConnection, s: &SessionRow) -> Result<(), StoreError> {
    let groups = serde_json::to_string(&s.groups)
        .map_err(|e| StoreError::corrupt("auth_sessions.groups_json", e))?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO auth_sessions ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
    )))
    .bind(s.id.clone())
    .bind(s.secret_sha256.clone())
    .bind(s.kind.clone())
    .bind(s.csrf_sha256.clone())
    .bind(s.issuer.clone())
    .bind(s.subject.clone())
    .bind(s.email.clone())
    .bind(s.name.clone())
    .bind(groups)
    .bind(s.created_at)
    .bind(s.last_seen_at)
    .bind(s.expires_at)
    .bind(s.revoked_at)
    .bind(s.revoked_reason.clone())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub(crate) async fn get_session(
    conn: &mut AnyConnection,
    id: &str,
) -> Result<Option<SessionRow>, StoreError> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM auth_sessions WHERE id = $1"
    )))
    .bind(id.to_owned())
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Records a use of the session.
pub(crate) async fn touch(conn: &mut AnyConnection, id: &str, now: i64) -> Result<(), StoreError> {
    sqlx::query("UPDATE auth_sessions SET last_seen_at = $1 WHERE id = $2 AND last_seen_at < $1")
        .bind(now)
        .bind(id.to_owned())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Revokes a live session; false if it was revoked already (or does not exist).
pub async fn revoke(
    conn: &mut AnyConnection,
    id: &str,
    now: i64,
    reason: &str,
) -> Result<bool, StoreError> {
    let r = sqlx::query(
        "UPDATE auth_sessions SET revoked_at = $1, revoked_reason = $2 WHERE id = $3 AND revoked_at IS NULL",
    )
    .bind(now)
    .bind(reason.to_owned())
    .bind(id.to_owned())
    .execute(&mut *conn)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Remembers an exchanged ID token until `expires_at`; false if it was exchanged before.
pub(crate) async fn use_id_token(
    conn: &mut AnyConnection,
    token_sha256: &str,
    expires_at: i64,
) -> Result<bool, StoreError> {
    let r = sqlx::query(
        "INSERT INTO auth_used_id_tokens (token_sha256, expires_at) VALUES ($1, $2) ON CONFLICT (token_sha256) DO NOTHING",
    )
    .bind(token_sha256.to_owned())
    .bind(expires_at)
    .execute(&mut *conn)
    .await?;
    Ok(r.rows_affected() == 1)
}
