//! The `operator_tokens` table: API tokens for operators, stored as the SHA-256 of the secret.

use sqlx::{AnyConnection, Row as _};

use super::StoreError;

#[derive(Clone, PartialEq, Eq)]
pub struct OperatorRow {
    pub id: String,
    pub name: String,
    pub secret_sha256: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

impl std::fmt::Debug for OperatorRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorRow")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("created_at", &self.created_at)
            .field("revoked_at", &self.revoked_at)
            .finish_non_exhaustive()
    }
}

fn from_row(row: &sqlx::any::AnyRow) -> Result<OperatorRow, StoreError> {
    Ok(OperatorRow {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        secret_sha256: row.try_get("secret_sha256")?,
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

pub async fn insert(conn: &mut AnyConnection, o: &OperatorRow) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO operator_tokens (id, name, secret_sha256, created_at, revoked_at) VALUES ($1, $2, $3, $4, $5)")
        .bind(o.id.clone())
        .bind(o.name.clone())
        .bind(o.secret_sha256.clone())
        .bind(o.created_at)
        .bind(o.revoked_at)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

pub async fn get(conn: &mut AnyConnection, id: &str) -> Result<Option<OperatorRow>, StoreError> {
    let row = sqlx::query(
        "SELECT id, name, secret_sha256, created_at, revoked_at FROM operator_tokens WHERE id = $1",
    )
    .bind(id.to_owned())
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(from_row).transpose()
}

pub async fn list(conn: &mut AnyConnection) -> Result<Vec<OperatorRow>, StoreError> {
    let rows = sqlx::query("SELECT id, name, secret_sha256, created_at, revoked_at FROM operator_tokens ORDER BY created_at, id")
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
