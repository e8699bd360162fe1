//! The host a node is bound to and the requests refused because they came from another host
//! (columns of `nodes`, migration 10; the node's row owns them, so deleting it deletes them).

use std::collections::HashMap;

use plexsphere_wire::host::HostFingerprint;
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use crate::store::{StoreError, parse_col};

/// The refused requests of one node, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneRecord {
    pub first_seen_at: i64,
    pub last_seen_at: i64,
    pub requests: u64,
    pub addr: String,
    /// 64 hex, `None` when the request carried no fingerprint.
    pub fingerprint: Option<String>,
}

/// The fingerprint a node is bound to (`None`: it never sent one), or `None` for no node.
async fn bound(
    conn: &mut AnyConnection,
    id: Uuid,
) -> Result<Option<Option<HostFingerprint>>, StoreError> {
    let row = sqlx::query("SELECT host_fingerprint FROM nodes WHERE id = $1")
        .bind(id.to_string())
        .fetch_optional(&mut *conn)
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let text: Option<String> = row.try_get("host_fingerprint")?;
    Ok(Some(text.map(|t| parse_fingerprint(&t)).transpose()?))
}

/// A stored `nodes.host_fingerprint`; anything but 64 hex is a corrupt row.
pub(super) fn parse_fingerprint(text: &str) -> Result<HostFingerprint, StoreError> {
    HostFingerprint::parse(text).map_err(|_| StoreError::corrupt("nodes.host_fingerprint", text))
}

/// Binds the node to `fp` unless it is bound already. Answers the fingerprint it is bound to
/// afterwards (another request may have bound it first); `None` when the node is gone.
pub(crate) async fn bind(
    conn: &mut AnyConnection,
    id: Uuid,
    fp: &HostFingerprint,
    now: i64,
) -> Result<Option<HostFingerprint>, StoreError> {
    let done = sqlx::query(
        "UPDATE nodes SET host_fingerprint = $1, host_bound_at = $2 WHERE id = $3 AND host_fingerprint IS NULL",
    )
    .bind(fp.to_hex())
    .bind(now)
    .bind(id.to_string())
    .execute(&mut *conn)
    .await?;
    if done.rows_affected() == 1 {
        return Ok(Some(*fp));
    }
    Ok(bound(conn, id).await?.flatten())
}

/// Records a refused request unless one was recorded less than `every_secs` ago (so a copy
/// that hammers the API costs at most one write per node in that span). Answers whether it
/// wrote.
pub async fn record_clone(
    conn: &mut AnyConnection,
    id: Uuid,
    addr: &str,
    fingerprint: Option<&HostFingerprint>,
    now: i64,
    every_secs: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE nodes SET clone_first_seen_at = COALESCE(clone_first_seen_at, $1), clone_last_seen_at = $1, \
         clone_requests = clone_requests + 1, clone_addr = $2, clone_fingerprint = $3 \
         WHERE id = $4 AND (clone_last_seen_at IS NULL OR clone_last_seen_at <= $5)",
    )
    .bind(now)
    .bind(addr.to_owned())
    .bind(fingerprint.map(HostFingerprint::to_hex))
    .bind(id.to_string())
    .bind(now.saturating_sub(every_secs))
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The columns of a clone record, for nodes that have one.
macro_rules! select_clones {
    ($tail:literal) => {
        concat!(
            "SELECT id, clone_first_seen_at, clone_last_seen_at, clone_requests, clone_addr, clone_fingerprint \
             FROM nodes WHERE clone_first_seen_at IS NOT NULL",
            $tail
        )
    };
}

fn clone_from_row(row: &sqlx::any::AnyRow) -> Result<(Uuid, CloneRecord), StoreError> {
    let id = parse_col("nodes.id", &row.try_get::<String, _>("id")?)?;
    let requests: i64 = row.try_get("clone_requests")?;
    Ok((
        id,
        CloneRecord {
            first_seen_at: row.try_get("clone_first_seen_at")?,
            last_seen_at: row
                .try_get::<Option<i64>, _>("clone_last_seen_at")?
                .ok_or_else(|| StoreError::corrupt("nodes.clone_last_seen_at", "NULL"))?,
            requests: u64::try_from(requests)
                .map_err(|_| StoreError::corrupt("nodes.clone_requests", requests))?,
            addr: row
                .try_get::<Option<String>, _>("clone_addr")?
                .unwrap_or_default(),
            fingerprint: row.try_get("clone_fingerprint")?,
        },
    ))
}

/// The refused requests of one node, if any were recorded.
pub async fn clone_of(
    conn: &mut AnyConnection,
    id: Uuid,
) -> Result<Option<CloneRecord>, StoreError> {
    let row = sqlx::query(select_clones!(" AND id = $1"))
        .bind(id.to_string())
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref()
        .map(clone_from_row)
        .transpose()
        .map(|r| r.map(|(_, c)| c))
}

/// Every node with recorded refused requests.
pub(crate) async fn clones(
    conn: &mut AnyConnection,
) -> Result<HashMap<Uuid, CloneRecord>, StoreError> {
    let rows = sqlx::query(select_clones!(""))
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(clone_from_row).collect()
}
