//! The `leases` table: who holds a named lease and until when (unix milliseconds of the
//! holders' wall clocks). Taking and renewing are one conditional upsert, so two replicas
//! racing for a free lease cannot both win; see `crate::leader` for the timing.

use sqlx::{AnyConnection, Row as _};

use super::StoreError;

/// The lease of the broker's reconcile loop and the maintenance task.
pub const BROKER: &str = "broker";

/// One lease as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub holder: String,
    /// Grows by one each time the lease changes hands.
    pub term: i64,
    pub expires_at_ms: i64,
}

/// Takes `name` for `holder` until `now_ms + ttl_ms` when it is free, expired or already
/// `holder`'s (a renewal); answers whether `holder` holds it now.
pub async fn acquire(
    conn: &mut AnyConnection,
    name: &str,
    holder: &str,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO leases (name, holder, term, expires_at_ms, renewed_at_ms) VALUES ($1, $2, 1, $3, $4) \
         ON CONFLICT (name) DO UPDATE SET \
             term = CASE WHEN leases.holder = excluded.holder THEN leases.term ELSE leases.term + 1 END, \
             holder = excluded.holder, expires_at_ms = excluded.expires_at_ms, renewed_at_ms = excluded.renewed_at_ms \
         WHERE leases.holder = excluded.holder OR leases.expires_at_ms <= $4",
    )
    .bind(name)
    .bind(holder)
    .bind(now_ms.saturating_add(ttl_ms))
    .bind(now_ms)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The lease `name`, if anyone ever took it.
pub async fn get(conn: &mut AnyConnection, name: &str) -> Result<Option<LeaseRow>, StoreError> {
    let row = sqlx::query("SELECT holder, term, expires_at_ms FROM leases WHERE name = $1")
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?;
    row.map(|r| {
        Ok(LeaseRow {
            holder: r.try_get("holder")?,
            term: r.try_get("term")?,
            expires_at_ms: r.try_get("expires_at_ms")?,
        })
    })
    .transpose()
}

/// Gives `name` up when `holder` holds it (a clean shutdown: the next replica need not wait
/// out the expiry); answers whether it did.
pub async fn release(
    conn: &mut AnyConnection,
    name: &str,
    holder: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query("UPDATE leases SET expires_at_ms = 0 WHERE name = $1 AND holder = $2")
        .bind(name)
        .bind(holder)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}
