//! The `bootstrap_tokens` table: tokens good for one node (the default) or up to `max_uses`
//! nodes (an autoscaling group's), stored as the SHA-256 of their secret.

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
    /// How many nodes the token may make and whether they are ephemeral (schema version 11).
    pub usage: TokenUsage,
    /// How many nodes it made so far (at most `usage.max_uses`).
    pub uses: u32,
    /// The tags every node it makes gets at registration, fixed when issued (schema version
    /// 17; names without `tag:`, sorted, `crate::tags`).
    pub tags: Vec<String>,
}

/// The most nodes one token may make: a bound on what a leaked reusable token can enrol.
/// Larger groups use several tokens.
pub(crate) const MAX_USES: u32 = 1_000;
/// The shortest and longest time an ephemeral node may stay offline before the control plane
/// removes it: shorter would remove nodes that only missed a few heartbeats (the default
/// offline threshold is 90 s), longer keeps dead autoscaled nodes as peers for too long.
pub(crate) const MIN_EPHEMERAL_OFFLINE_SECS: u64 = 120;
pub(crate) const MAX_EPHEMERAL_OFFLINE_SECS: u64 = 7 * 86_400;

/// How a token may be used: how many nodes it makes, and whether those are ephemeral (removed
/// once offline for `ephemeral_offline_secs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenUsage {
    pub max_uses: u32,
    pub ephemeral_offline_secs: Option<u64>,
}

impl Default for TokenUsage {
    /// Single use, not ephemeral: every token before schema version 11.
    fn default() -> Self {
        TokenUsage {
            max_uses: 1,
            ephemeral_offline_secs: None,
        }
    }
}

/// Why a [`TokenUsage`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UsageError {
    #[error("max_uses must be between 1 and {MAX_USES}; issue several tokens for a larger group")]
    Uses,
    #[error(
        "ephemeral_offline_secs must be between {MIN_EPHEMERAL_OFFLINE_SECS} (2 minutes) and {MAX_EPHEMERAL_OFFLINE_SECS} (7 days)"
    )]
    EphemeralOffline,
}

impl TokenUsage {
    /// Checks the bounds above (pure).
    pub(crate) fn checked(
        max_uses: u32,
        ephemeral_offline_secs: Option<u64>,
    ) -> Result<Self, UsageError> {
        if !(1..=MAX_USES).contains(&max_uses) {
            return Err(UsageError::Uses);
        }
        if ephemeral_offline_secs.is_some_and(|s| {
            !(MIN_EPHEMERAL_OFFLINE_SECS..=MAX_EPHEMERAL_OFFLINE_SECS).contains(&s)
        }) {
            return Err(UsageError::EphemeralOffline);
        }
        Ok(TokenUsage {
            max_uses,
            ephemeral_offline_secs,
        })
    }
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
            usage: TokenUsage::default(),
            uses: 0,
            tags: Vec::new(),
        }
    }

    /// The same row with another use limit and ephemeral setting.
    pub(crate) fn with_usage(self, usage: TokenUsage) -> Self {
        TokenRow { usage, ..self }
    }

    /// The same row with the tags its nodes get (checked names, `crate::tags::normalize`).
    pub fn with_tags(self, tags: Vec<String>) -> Self {
        TokenRow { tags, ..self }
    }

    /// Whether every use is taken.
    pub fn used_up(&self) -> bool {
        self.uses >= self.usage.max_uses
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
            .field("usage", &self.usage)
            .field("uses", &self.uses)
            .field("tags", &self.tags)
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
        usage: TokenUsage {
            max_uses: count_col(row, "max_uses")?,
            ephemeral_offline_secs: row
                .try_get::<Option<i64>, _>("ephemeral_offline_secs")?
                .map(|v| {
                    u64::try_from(v).map_err(|_| {
                        StoreError::corrupt("bootstrap_tokens.ephemeral_offline_secs", v)
                    })
                })
                .transpose()?,
        },
        uses: count_col(row, "uses")?,
        tags: crate::tags::split(&row.try_get::<String, _>("tags")?),
    })
}

/// A use count column; out of `u32` is a corrupt row.
fn count_col(row: &sqlx::any::AnyRow, column: &'static str) -> Result<u32, StoreError> {
    let v: i64 = row.try_get(column)?;
    u32::try_from(v).map_err(|_| StoreError::corrupt("bootstrap_tokens use count", v))
}

pub async fn insert(conn: &mut AnyConnection, t: &TokenRow) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO bootstrap_tokens (id, project_id, kind, env_prefix, secret_sha256, created_at, expires_at, consumed_at, consumed_by_node, revoked_at, resource_id, max_uses, uses, ephemeral_offline_secs, tags) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
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
    .bind(i64::from(t.usage.max_uses))
    .bind(i64::from(t.uses))
    .bind(
        t.usage
            .ephemeral_offline_secs
            .map(|s| i64::try_from(s).unwrap_or(i64::MAX)),
    )
    .bind(crate::tags::join(&t.tags))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// What `from_row` reads, in the order the table declares it.
const COLUMNS: &str = "id, project_id, kind, env_prefix, secret_sha256, created_at, expires_at, consumed_at, consumed_by_node, revoked_at, resource_id, max_uses, uses, ephemeral_offline_secs, tags";

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

/// Takes one use of a token for `node_id` if, at this instant, it is still usable. Of many
/// callers racing on one token, at most `max_uses - uses` see `true`: the row changes only
/// while `uses < max_uses`, and the database serialises the writers of one row. The use that
/// takes the last one sets `consumed_at` and `consumed_by_node` (a single-use token reads as
/// before version 11).
pub(crate) async fn consume(
    conn: &mut AnyConnection,
    id: &str,
    node_id: Uuid,
    now: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE bootstrap_tokens SET uses = uses + 1, \
         consumed_at = CASE WHEN uses + 1 >= max_uses THEN $1 ELSE consumed_at END, \
         consumed_by_node = CASE WHEN uses + 1 >= max_uses THEN $2 ELSE consumed_by_node END \
         WHERE id = $3 AND uses < max_uses AND revoked_at IS NULL AND expires_at > $1",
    )
    .bind(now)
    .bind(node_id.to_string())
    .bind(id.to_owned())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Revokes a token unless every use is taken (a reusable token with uses left stops making
/// nodes; the nodes it made stay); revoking a revoked token keeps the first time. Answers
/// whether the token is revoked afterwards.
pub async fn revoke(conn: &mut AnyConnection, id: &str, now: i64) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE bootstrap_tokens SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2 AND uses < max_uses",
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
