//! Mesh IP allocation in the store (`register` calls [`allocate`]): the `mesh_ip_cursors` table,
//! where each range's next-fit walk ([`crate::ipam::candidates`]) stands, locked for the length
//! of the registering transaction, and which of a few candidate addresses live nodes hold.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::{StoreError, parse_col};

/// How many candidate addresses one look-up asks about.
pub(crate) const LOOKUP_WINDOW: usize = 32;

/// The next free address of `range` (next-fit from where the range's cursor stands), taken
/// under the cursor's lock so that racing registrations of one range never pick the same one;
/// `None` when every host address of the range is held. Each look-up asks about
/// [`LOOKUP_WINDOW`] candidates at once; while the range has room the first window has a free
/// one, so the cost does not grow with the number of nodes.
pub(crate) async fn allocate(
    conn: &mut AnyConnection,
    domain_id: Uuid,
    range: IpNet,
    reserved: &[IpNet],
) -> Result<Option<IpAddr>, StoreError> {
    let last = lock_cursor(conn, domain_id, range).await?;
    let mut candidates = crate::ipam::candidates(range, reserved, last).peekable();
    while candidates.peek().is_some() {
        let window: Vec<IpAddr> = candidates.by_ref().take(LOOKUP_WINDOW).collect();
        let held = held_among(conn, domain_id, &window).await?;
        if let Some(free) = window.into_iter().find(|ip| !held.contains(ip)) {
            advance_cursor(conn, domain_id, range, free).await?;
            return Ok(Some(free));
        }
    }
    Ok(None)
}

/// Locks `range`'s cursor in `domain_id` for this transaction and answers the address handed
/// out last (`None`: none yet). The row is created on first use. Racing registrations of one
/// range queue on this row lock (Postgres) or on the write lock (SQLite), so each sees the
/// address its predecessor took.
pub(crate) async fn lock_cursor(
    conn: &mut AnyConnection,
    domain_id: Uuid,
    range: IpNet,
) -> Result<Option<IpAddr>, StoreError> {
    let row = sqlx::query(
        "INSERT INTO mesh_ip_cursors (domain_id, range_cidr, last_ip) VALUES ($1, $2, NULL) \
         ON CONFLICT (domain_id, range_cidr) DO UPDATE SET last_ip = mesh_ip_cursors.last_ip \
         RETURNING last_ip",
    )
    .bind(domain_id.to_string())
    .bind(range.to_string())
    .fetch_one(&mut *conn)
    .await?;
    row.try_get::<Option<String>, _>("last_ip")?
        .map(|s| parse_col("mesh_ip_cursors.last_ip", &s))
        .transpose()
}

/// Records `ip` as the address `range` handed out last.
pub async fn advance_cursor(
    conn: &mut AnyConnection,
    domain_id: Uuid,
    range: IpNet,
    ip: IpAddr,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE mesh_ip_cursors SET last_ip = $1 WHERE domain_id = $2 AND range_cidr = $3")
        .bind(ip.to_string())
        .bind(domain_id.to_string())
        .bind(range.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Which of `candidates` (at most [`LOOKUP_WINDOW`]) a live node of `domain_id` holds: one
/// indexed look-up (`nodes_live_mesh_ip`), whatever the number of nodes.
pub(crate) async fn held_among(
    conn: &mut AnyConnection,
    domain_id: Uuid,
    candidates: &[IpAddr],
) -> Result<HashSet<IpAddr>, StoreError> {
    if candidates.is_empty() {
        return Ok(HashSet::new());
    }
    let placeholders: Vec<String> = (0..candidates.len())
        .map(|i| format!("${}", i + 2))
        .collect();
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT mesh_ip FROM nodes WHERE domain_id = $1 AND revoked_at IS NULL AND mesh_ip IN ({})",
        placeholders.join(", ")
    ));
    let mut query = sqlx::query(sql).bind(domain_id.to_string());
    for ip in candidates {
        query = query.bind(ip.to_string());
    }
    let rows = query.fetch_all(&mut *conn).await?;
    rows.iter()
        .map(|r| parse_col("nodes.mesh_ip", &r.try_get::<String, _>("mesh_ip")?))
        .collect()
}
