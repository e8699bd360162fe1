//! The `audit_chains` and `audit_log` tables (schema version 20, docs/audit.md): appending a
//! row to a chain, paging through one, reading its head.

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};

use super::chain::{ChainKey, GENESIS, Head, Row};
use crate::store::StoreError;

/// The columns of `audit_log`, in the order of the table (a literal for `concat!`).
macro_rules! columns {
    () => {
        "chain_id, seq, at, actor_kind, actor_ref, actor_name, actor_subject, actor_email, \
         how, action, target, detail, prev_hash, hash, mac"
    };
}

/// Appends `row` (its `seq`, `prev_hash`, `hash` and `mac` are set here) to its chain and moves
/// the head. Call it inside a transaction: the head's `UPDATE ... RETURNING` comes first, so
/// appends to one chain wait for each other on every replica and no two get one seq.
pub async fn append(
    conn: &mut AnyConnection,
    key: &ChainKey,
    mut row: Row,
) -> Result<Row, StoreError> {
    let head = sqlx::query(
        "INSERT INTO audit_chains (chain_id, seq, head_hash, mac) VALUES ($1, 1, $2, '') \
         ON CONFLICT (chain_id) DO UPDATE SET seq = audit_chains.seq + 1 \
         RETURNING seq, head_hash",
    )
    .bind(&row.chain_id)
    .bind(GENESIS)
    .fetch_one(&mut *conn)
    .await?;
    row.seq = head.try_get("seq")?;
    row.prev_hash = head.try_get("head_hash")?;
    row.seal(key);
    sqlx::query(concat!(
        "INSERT INTO audit_log (",
        columns!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
    ))
    .bind(&row.chain_id)
    .bind(row.seq)
    .bind(row.at)
    .bind(&row.actor_kind)
    .bind(&row.actor_ref)
    .bind(&row.actor_name)
    .bind(&row.actor_subject)
    .bind(&row.actor_email)
    .bind(&row.how)
    .bind(&row.action)
    .bind(&row.target)
    .bind(&row.detail)
    .bind(&row.prev_hash)
    .bind(&row.hash)
    .bind(&row.mac)
    .execute(&mut *conn)
    .await?;
    sqlx::query("UPDATE audit_chains SET head_hash = $2, mac = $3 WHERE chain_id = $1")
        .bind(&row.chain_id)
        .bind(&row.hash)
        .bind(key.head_mac(row.seq, &row.hash))
        .execute(&mut *conn)
        .await?;
    Ok(row)
}

/// The chain's head, `None` when nothing was ever appended to it.
pub async fn head(conn: &mut AnyConnection, chain_id: &str) -> Result<Option<Head>, StoreError> {
    let row = sqlx::query("SELECT seq, head_hash, mac FROM audit_chains WHERE chain_id = $1")
        .bind(chain_id)
        .fetch_optional(&mut *conn)
        .await?;
    row.map(|r| {
        Ok(Head {
            seq: r.try_get("seq")?,
            hash: r.try_get("head_hash")?,
            mac: r.try_get("mac")?,
        })
    })
    .transpose()
}

/// What a page of [`list`] selects.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    /// Rows after this seq (the previous page's last).
    pub after: i64,
    /// Rows at or after this unix time.
    pub since: Option<i64>,
    /// Only rows whose keyed e-mail is this.
    pub actor_email: Option<String>,
}

/// Up to `limit` rows of the chain in seq order.
pub async fn list(
    conn: &mut AnyConnection,
    chain_id: &str,
    filter: &Filter,
    limit: i64,
) -> Result<Vec<Row>, StoreError> {
    let rows = sqlx::query(concat!(
        "SELECT ",
        columns!(),
        " FROM audit_log WHERE chain_id = $1 AND seq > $2 AND at >= $3 \
         AND ($4 = '' OR actor_email = $4) ORDER BY seq LIMIT $5"
    ))
    .bind(chain_id)
    .bind(filter.after)
    .bind(filter.since.unwrap_or(i64::MIN))
    .bind(filter.actor_email.clone().unwrap_or_default())
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(from_row).collect()
}

fn from_row(r: &AnyRow) -> Result<Row, StoreError> {
    Ok(Row {
        chain_id: r.try_get("chain_id")?,
        seq: r.try_get("seq")?,
        at: r.try_get("at")?,
        actor_kind: r.try_get("actor_kind")?,
        actor_ref: r.try_get("actor_ref")?,
        actor_name: r.try_get("actor_name")?,
        actor_subject: r.try_get("actor_subject")?,
        actor_email: r.try_get("actor_email")?,
        how: r.try_get("how")?,
        action: r.try_get("action")?,
        target: r.try_get("target")?,
        detail: r.try_get("detail")?,
        prev_hash: r.try_get("prev_hash")?,
        hash: r.try_get("hash")?,
        mac: r.try_get("mac")?,
    })
}
