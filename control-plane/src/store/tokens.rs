//! The `bootstrap_tokens` table: single-use tokens, stored as the SHA-256 of their secret.

use plexsphere_wire::secret::BootstrapToken;
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::{StoreError, parse_col};

#[derive(Clone, PartialEq, Eq)]
pub struct TokenRow {
    /// The public lookup id (16 hex characters).
    pub id: String,
    pub project_id: Uuid,
    pub kind: String,
    pub env_prefix: String,
    /// Lowercase hex SHA-256 of the secret part.
    pub secret_sha256: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub consumed_at: Option<i64>,
    pub consumed_by_node: Option<Uuid>,
    pub revoked_at: Option<i64>,
    pub resource_id: Option<Uuid>,
}

impl TokenRow {
    /// The row of a freshly generated token: unused, valid for `ttl_secs` from `now`, and only
    /// its secret's digest stored. Times are stored in whole unix seconds; the expiry is
    /// rounded up, never down, so a token lives at least the `ttl_secs` asked for (and less
    /// than a second more): a token is expired from the second `expires_at` on.
    pub fn issued(
        token: &BootstrapToken,
        project_id: Uuid,
        now: time::OffsetDateTime,
        ttl_secs: u64,
        resource_id: Option<Uuid>,
    ) -> Self {
        let ttl = i64::try_from(ttl_secs).unwrap_or(i64::MAX);
        let expires_at = now
            .unix_timestamp()
            .saturating_add(ttl)
            .saturating_add(i64::from(now.nanosecond() > 0));
        TokenRow {
            id: token.id.clone(),
            project_id,
            kind: token.kind.as_str().to_owned(),
            env_prefix: token.env_prefix.clone(),
            secret_sha256: super::secret_digest(&token.secret),
            created_at: now.unix_timestamp(),
            expires_at,
            consumed_at: None,
            consumed_by_node: None,
            revoked_at: None,
            resource_id,
        }
    }
}

impl std::fmt::Debug for TokenRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRow")
            .field("id", &self.id)
            .field("project_id", &self.project_id)
            .field("kind", &self.kind)
            .field("expires_at", &self.expires_at)
            .field("consumed_at", &self.consumed_at)
            .field("revoked_at", &self.revoked_at)
            .finish_non_exhaustive()
    }
}

fn opt_uuid(what: &'static str, v: Option<String>) -> Result<Option<Uuid>, StoreError> {
    v.map(|s| parse_col(what, &s)).transpose()
}

fn from_row(row: &sqlx::any::AnyRow) -> Result<TokenRow, StoreError> {
    Ok(TokenRow {
        id: row.try_get("id")?,
        project_id: parse_col(
            "bootstrap_tokens.project_id",
            &row.try_get::<String, _>("project_id")?,
        )?,
        kind: row.try_get("kind")?,
        env_prefix: row.try_get("env_prefix")?,
        secret_sha256: row.try_get("secret_sha256")?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        consumed_at: row.try_get("consumed_at")?,
        consumed_by_node: opt_uuid(
            "bootstrap_tokens.consumed_by_node",
            row.try_get("consumed_by_node")?,
        )?,
        revoked_at: row.try_get("revoked_at")?,
        resource_id: opt_uuid("bootstrap_tokens.resource_id", row.try_get("resource_id")?)?,
    })
}

pub async fn insert(conn: &mut AnyConnection, t: &TokenRow) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO bootstrap_tokens (id, project_id, kind, env_prefix, secret_sha256, created_at, expires_at, consumed_at, consumed_by_node, revoked_at, resource_id) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(t.id.clone())
    .bind(t.project_id.to_string())
    .bind(t.kind.clone())
    .bind(t.env_prefix.clone())
    .bind(t.secret_sha256.clone())
    .bind(t.created_at)
    .bind(t.expires_at)
    .bind(t.consumed_at)
    .bind(t.consumed_by_node.map(|u| u.to_string()))
    .bind(t.revoked_at)
    .bind(t.resource_id.map(|u| u.to_string()))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// What `from_row` reads, in the order the table declares it.
const COLUMNS: &str = "id, project_id, kind, env_prefix, secret_sha256, created_at, expires_at, consumed_at, consumed_by_node, revoked_at, resource_id";

pub async fn get(conn: &mut AnyConnection, id: &str) -> Result<Option<TokenRow>, StoreError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM bootstrap_tokens WHERE id = $1"
    ));
    let row = sqlx::query(sql)
        .bind(id.to_owned())
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(from_row).transpose()
}

pub async fn list_for_project(
    conn: &mut AnyConnection,
    project_id: Uuid,
) -> Result<Vec<TokenRow>, StoreError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM bootstrap_tokens WHERE project_id = $1 ORDER BY created_at, id"
    ));
    let rows = sqlx::query(sql)
        .bind(project_id.to_string())
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(from_row).collect()
}

/// Consumes a token for `node_id` if, at this instant, it is still usable. Exactly one caller
/// of many racing on one token sees `true`: the row changes only while `consumed_at` is NULL.
pub async fn consume(
    conn: &mut AnyConnection,
    id: &str,
    node_id: Uuid,
    now: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE bootstrap_tokens SET consumed_at = $1, consumed_by_node = $2 \
         WHERE id = $3 AND consumed_at IS NULL AND revoked_at IS NULL AND expires_at > $1",
    )
    .bind(now)
    .bind(node_id.to_string())
    .bind(id.to_owned())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Revokes a token unless it is consumed; revoking a revoked token keeps the first time.
/// Answers whether the token is revoked afterwards.
pub async fn revoke(conn: &mut AnyConnection, id: &str, now: i64) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE bootstrap_tokens SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2 AND consumed_at IS NULL",
    )
    .bind(now)
    .bind(id.to_owned())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Moves a token's expiry (operators' tooling and tests use it; the API never does).
pub async fn set_expires_at(
    conn: &mut AnyConnection,
    id: &str,
    expires_at: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query("UPDATE bootstrap_tokens SET expires_at = $1 WHERE id = $2")
        .bind(expires_at)
        .bind(id.to_owned())
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexsphere_wire::secret::TokenKind;

    #[test]
    fn a_token_lives_at_least_its_ttl_and_less_than_a_second_more() {
        let token = BootstrapToken::generate("lab", TokenKind::Node).unwrap();
        let project = Uuid::from_u128(1);
        let at = |secs: i64, millis: i64| {
            time::OffsetDateTime::from_unix_timestamp(secs).unwrap()
                + time::Duration::milliseconds(millis)
        };
        // Issued at 100.26 s with a TTL of 60 s: valid up to 160.26 s, so expired from 161 on.
        let row = TokenRow::issued(&token, project, at(100, 260), 60, None);
        assert_eq!((row.created_at, row.expires_at), (100, 161));
        // On a whole second, exactly the TTL.
        let row = TokenRow::issued(&token, project, at(100, 0), 60, None);
        assert_eq!(row.expires_at, 160);
        // Never past the end of time.
        let row = TokenRow::issued(&token, project, at(100, 1), u64::MAX, None);
        assert_eq!(row.expires_at, i64::MAX);
    }
}
