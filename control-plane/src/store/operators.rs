//! The `operator_tokens` table: API tokens for operators, stored as the SHA-256 of the secret,
//! with their scope, project, expiry and last use (schema version 8).

use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::StoreError;

#[derive(Clone, PartialEq, Eq)]
pub struct OperatorRow {
    pub id: String,
    pub name: String,
    pub secret_sha256: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    /// `read-only`, `operator` or `admin`; `None`: a legacy token from before scopes.
    pub scope: Option<String>,
    /// The one project the token is limited to.
    pub project_id: Option<Uuid>,
    /// Unix seconds; `None`: never expires.
    pub expires_at: Option<i64>,
    pub last_used_at: Option<i64>,
}

impl std::fmt::Debug for OperatorRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorRow")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("created_at", &self.created_at)
            .field("revoked_at", &self.revoked_at)
            .field("scope", &self.scope)
            .field("project_id", &self.project_id)
            .field("expires_at", &self.expires_at)
            .field("last_used_at", &self.last_used_at)
            .finish_non_exhaustive()
    }
}

const COLUMNS: &str =
    "id, name, secret_sha256, created_at, revoked_at, scope, project_id, expires_at, last_used_at";

fn from_row(row: &sqlx::any::AnyRow) -> Result<OperatorRow, StoreError> {
    let project_id: Option<String> = row.try_get("project_id")?;
    let project_id = project_id
        .map(|p| {
            Uuid::parse_str(&p).map_err(|e| {
                StoreError::corrupt("operator_tokens.project_id", format!("{p:?}: {e}"))
            })
        })
        .transpose()?;
    Ok(OperatorRow {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        secret_sha256: row.try_get("secret_sha256")?,
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
        scope: row.try_get("scope")?,
        project_id,
        expires_at: row.try_get("expires_at")?,
        last_used_at: row.try_get("last_used_at")?,
    })
}

pub async fn insert(conn: &mut AnyConnection, o: &OperatorRow) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO operator_tokens (id, name, secret_sha256, created_at, revoked_at, scope, project_id, expires_at, last_used_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(o.id.clone())
    .bind(o.name.clone())
    .bind(o.secret_sha256.clone())
    .bind(o.created_at)
    .bind(o.revoked_at)
    .bind(o.scope.clone())
    .bind(o.project_id.map(|p| p.to_string()))
    .bind(o.expires_at)
    .bind(o.last_used_at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub async fn get(conn: &mut AnyConnection, id: &str) -> Result<Option<OperatorRow>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM operator_tokens WHERE id = $1");
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id.to_owned())
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(from_row).transpose()
}

pub async fn list(conn: &mut AnyConnection) -> Result<Vec<OperatorRow>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM operator_tokens ORDER BY created_at, id");
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(from_row).collect()
}

/// Revokes an operator token; answers whether a token with that id exists.
pub async fn revoke(conn: &mut AnyConnection, id: &str, now: i64) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE operator_tokens SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2",
    )
    .bind(now)
    .bind(id.to_owned())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records a use at `now` unless one was recorded after `not_after` (so a burst of requests
/// writes once); answers whether it wrote.
pub async fn touch_last_used(
    conn: &mut AnyConnection,
    id: &str,
    now: i64,
    not_after: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE operator_tokens SET last_used_at = $1 WHERE id = $2 AND (last_used_at IS NULL OR last_used_at <= $3)",
    )
    .bind(now)
    .bind(id.to_owned())
    .bind(not_after)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}
