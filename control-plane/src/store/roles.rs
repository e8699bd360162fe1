//! The `role_bindings` table (schema version 19): a role on a scope, bound to a person's
//! subject, e-mail address or group.

use sqlx::{AnyConnection, Row as _};

use super::StoreError;

/// The most role bindings a server keeps (`POST /v1/role-bindings` refuses past it).
pub(crate) const MAX_ROLE_BINDINGS: i64 = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingRow {
    pub id: String,
    /// `admin`, `auditor` or `member`.
    pub role: String,
    /// `platform`, `domain` or `project`.
    pub scope_kind: String,
    /// The Domain's or Project's id; '' for the platform.
    pub scope_id: String,
    /// `subject`, `email` or `group`.
    pub principal_kind: String,
    pub principal: String,
    pub created_at: i64,
    /// Who bound it (`token:<id>`, `session:<id>`, `host`).
    pub created_by: String,
}

const COLUMNS: &str =
    "id, role, scope_kind, scope_id, principal_kind, principal, created_at, created_by";

fn from_row(row: &sqlx::any::AnyRow) -> Result<BindingRow, StoreError> {
    Ok(BindingRow {
        id: row.try_get("id")?,
        role: row.try_get("role")?,
        scope_kind: row.try_get("scope_kind")?,
        scope_id: row.try_get("scope_id")?,
        principal_kind: row.try_get("principal_kind")?,
        principal: row.try_get("principal")?,
        created_at: row.try_get("created_at")?,
        created_by: row.try_get("created_by")?,
    })
}

/// Inserts a binding; a unique violation (the same binding exists) surfaces as such.
pub async fn insert(conn: &mut AnyConnection, b: &BindingRow) -> Result<(), StoreError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO role_bindings ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    )))
    .bind(b.id.clone())
    .bind(b.role.clone())
    .bind(b.scope_kind.clone())
    .bind(b.scope_id.clone())
    .bind(b.principal_kind.clone())
    .bind(b.principal.clone())
    .bind(b.created_at)
    .bind(b.created_by.clone())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub(crate) async fn count(conn: &mut AnyConnection) -> Result<i64, StoreError> {
    let row = sqlx::query("SELECT COUNT(*) AS n FROM role_bindings")
        .fetch_one(&mut *conn)
        .await?;
    Ok(row.try_get("n")?)
}

/// Every binding, oldest first.
pub async fn list(conn: &mut AnyConnection) -> Result<Vec<BindingRow>, StoreError> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM role_bindings ORDER BY created_at, id LIMIT {MAX_ROLE_BINDINGS}"
    )))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(from_row).collect()
}

pub async fn get(conn: &mut AnyConnection, id: &str) -> Result<Option<BindingRow>, StoreError> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM role_bindings WHERE id = $1"
    )))
    .bind(id.to_owned())
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Deletes a binding; false if there was none.
pub async fn delete(conn: &mut AnyConnection, id: &str) -> Result<bool, StoreError> {
    let r = sqlx::query("DELETE FROM role_bindings WHERE id = $1")
        .bind(id.to_owned())
        .execute(&mut *conn)
        .await?;
    Ok(r.rows_affected() == 1)
}

/// The bindings that apply to a person with these claims.
pub(crate) async fn for_person(
    conn: &mut AnyConnection,
    subject: &str,
    email: Option<&str>,
    groups: &[String],
) -> Result<Vec<BindingRow>, StoreError> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM role_bindings WHERE (principal_kind = 'subject' AND principal = $1) OR (principal_kind = 'email' AND principal = $2) OR principal_kind = 'group' LIMIT {MAX_ROLE_BINDINGS}"
    )))
    .bind(subject.to_owned())
    .bind(email.map(str::to_ascii_lowercase).unwrap_or_default())
    .fetch_all(&mut *conn)
    .await?;
    let mut out = Vec::new();
    for row in &rows {
        let b = from_row(row)?;
        if b.principal_kind != "group" || groups.contains(&b.principal) {
            out.push(b);
        }
    }
    Ok(out)
}
