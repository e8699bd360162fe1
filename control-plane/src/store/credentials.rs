//! The `cloud_credentials` table: the payload is stored sealed (base64 of the blob) and the
//! row never leaves the server with it.

use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::{StoreError, parse_col};

#[derive(Clone, PartialEq, Eq)]
pub struct CredentialRow {
    pub id: Uuid,
    pub name: String,
    pub provider: String,
    /// Base64 of the sealed blob (`plexsphere_broker::credentials::seal`).
    pub sealed_payload: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

impl std::fmt::Debug for CredentialRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialRow")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("provider", &self.provider)
            .field("revoked_at", &self.revoked_at)
            .finish_non_exhaustive()
    }
}

const COLUMNS: &str = "id, name, provider, sealed_payload, created_at, revoked_at";

fn from_row(row: &sqlx::any::AnyRow) -> Result<CredentialRow, StoreError> {
    Ok(CredentialRow {
        id: parse_col("cloud_credentials.id", &row.try_get::<String, _>("id")?)?,
        name: row.try_get("name")?,
        provider: row.try_get("provider")?,
        sealed_payload: row.try_get("sealed_payload")?,
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

pub async fn insert(conn: &mut AnyConnection, c: &CredentialRow) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO cloud_credentials (id, name, provider, sealed_payload, created_at, revoked_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(c.id.to_string())
    .bind(c.name.clone())
    .bind(c.provider.clone())
    .bind(c.sealed_payload.clone())
    .bind(c.created_at)
    .bind(c.revoked_at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub async fn get(conn: &mut AnyConnection, id: Uuid) -> Result<Option<CredentialRow>, StoreError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM cloud_credentials WHERE id = $1"
    ));
    let row = sqlx::query(sql)
        .bind(id.to_string())
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(from_row).transpose()
}

pub async fn list(conn: &mut AnyConnection) -> Result<Vec<CredentialRow>, StoreError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM cloud_credentials ORDER BY created_at, id"
    ));
    let rows = sqlx::query(sql).fetch_all(&mut *conn).await?;
    rows.iter().map(from_row).collect()
}

/// Revokes a credential; revoking again keeps the first time. Answers whether it exists.
pub async fn revoke(conn: &mut AnyConnection, id: Uuid, now: i64) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE cloud_credentials SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2",
    )
    .bind(now)
    .bind(id.to_string())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Replaces a credential's sealed payload if it still holds `was` (`plexsphere kek rotate`).
/// Answers whether it did.
pub async fn reseal(
    conn: &mut AnyConnection,
    id: Uuid,
    was: &str,
    sealed: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE cloud_credentials SET sealed_payload = $1 WHERE id = $2 AND sealed_payload = $3",
    )
    .bind(sealed.to_owned())
    .bind(id.to_string())
    .bind(was.to_owned())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Gives a credential that is not revoked a new sealed payload (`plexctl cloud-credential
/// rotate`). Answers whether it did.
pub async fn rotate(conn: &mut AnyConnection, id: Uuid, sealed: &str) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE cloud_credentials SET sealed_payload = $1 WHERE id = $2 AND revoked_at IS NULL",
    )
    .bind(sealed.to_owned())
    .bind(id.to_string())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}
