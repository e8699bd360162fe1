//! What a node's calls and its operator change in its `nodes` row after registration: that
//! it was seen, its heartbeats, its revocation, its UDP offload switch and its tags; and
//! deleting the row.

use plexsphere_wire::node::UdpOffload;
use sqlx::AnyConnection;
use uuid::Uuid;

use crate::store::StoreError;

/// Records that the node authenticated with its credential (ends the replay window). Writes
/// only when the stored time is older, so a burst of calls in one second costs one write.
pub async fn touch_last_seen(
    conn: &mut AnyConnection,
    id: Uuid,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE nodes SET last_seen_at = $1 WHERE id = $2 AND (last_seen_at IS NULL OR last_seen_at < $1)",
    )
        .bind(now)
        .bind(id.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// What a heartbeat records.
#[derive(Debug, Clone)]
pub(crate) struct HeartbeatRecord<'a> {
    pub plexd_version: &'a str,
    pub uptime_secs: u64,
    pub applied_state_version: Option<u64>,
    pub peers_configured: u32,
    pub peers_connected: u32,
    pub at: i64,
}

/// A `u64` as the `i64` an integer column holds, saturating at `i64::MAX`.
pub(super) fn sat_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Records a heartbeat (and that the node was seen). Answers whether the node still exists.
pub(crate) async fn record_heartbeat(
    conn: &mut AnyConnection,
    id: Uuid,
    hb: &HeartbeatRecord<'_>,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE nodes SET plexd_version = $1, uptime_secs = $2, applied_state_version = $3, \
         peers_configured = $4, peers_connected = $5, last_heartbeat_at = $6, last_seen_at = $6 \
         WHERE id = $7",
    )
    .bind(hb.plexd_version.to_owned())
    .bind(sat_i64(hb.uptime_secs))
    .bind(hb.applied_state_version.map(sat_i64))
    .bind(i64::from(hb.peers_configured))
    .bind(i64::from(hb.peers_connected))
    .bind(hb.at)
    .bind(id.to_string())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Marks a node revoked. Answers false when it was already revoked or does not exist.
pub async fn revoke(conn: &mut AnyConnection, id: Uuid, now: i64) -> Result<bool, StoreError> {
    let done = sqlx::query("UPDATE nodes SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
        .bind(now)
        .bind(id.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Sets the operator's UDP GSO/GRO switch of a live node; answers whether the node is live.
pub(crate) async fn set_udp_offload(
    conn: &mut AnyConnection,
    id: Uuid,
    setting: Option<UdpOffload>,
) -> Result<bool, StoreError> {
    let done =
        sqlx::query("UPDATE nodes SET udp_offload = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(setting.map(|s| s.as_str().to_owned()))
            .bind(id.to_string())
            .execute(&mut *conn)
            .await?;
    Ok(done.rows_affected() == 1)
}

/// Replaces the tags of a live node (checked names, `crate::tags::normalize`); answers
/// whether the node is live.
pub async fn set_tags(
    conn: &mut AnyConnection,
    id: Uuid,
    tags: &[String],
) -> Result<bool, StoreError> {
    let done = sqlx::query("UPDATE nodes SET tags = $1 WHERE id = $2 AND revoked_at IS NULL")
        .bind(crate::tags::join(tags))
        .bind(id.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Deletes a node and the rows it owns (its observations); its mesh IP is free again.
/// Answers whether a node row was deleted.
pub async fn delete(conn: &mut AnyConnection, id: Uuid) -> Result<bool, StoreError> {
    crate::store::observations::delete_for_node(conn, id).await?;
    let done = sqlx::query("DELETE FROM nodes WHERE id = $1")
        .bind(id.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}
