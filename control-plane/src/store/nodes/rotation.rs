//! The rotation columns of the `nodes` table (schema version 9): when the WireGuard key and
//! the credential last changed, the credential a rotation handed out and the one it replaced,
//! and what an operator asked for.

use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use crate::store::StoreError;

/// A node's rotation state (all `None` until a rotation or a request).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeRotation {
    pub key_rotated_at: Option<i64>,
    pub credential_rotated_at: Option<i64>,
    /// SHA-256 hex of the credential the last rotation handed out, until its first use.
    pub pending_credential_sha256: Option<String>,
    /// SHA-256 hex of the credential a rotation replaced, accepted until `previous_until`.
    pub previous_credential_sha256: Option<String>,
    pub previous_until: Option<i64>,
    pub rotate_key_requested_at: Option<i64>,
    pub rotate_credential_requested_at: Option<i64>,
}

/// The rotation columns of a node row (read by every node SELECT of `nodes.rs`).
pub(super) fn rotation_from_row(row: &sqlx::any::AnyRow) -> Result<NodeRotation, StoreError> {
    Ok(NodeRotation {
        key_rotated_at: row.try_get("key_rotated_at")?,
        credential_rotated_at: row.try_get("credential_rotated_at")?,
        pending_credential_sha256: row.try_get("pending_credential_sha256")?,
        previous_credential_sha256: row.try_get("previous_credential_sha256")?,
        previous_until: row.try_get("previous_credential_until")?,
        rotate_key_requested_at: row.try_get("rotate_key_requested_at")?,
        rotate_credential_requested_at: row.try_get("rotate_credential_requested_at")?,
    })
}

/// Whether another node (live or revoked: a key names one node for good) holds this key.
pub(crate) async fn key_in_use_elsewhere(
    conn: &mut AnyConnection,
    id: Uuid,
    public_key: &str,
) -> Result<bool, StoreError> {
    let row =
        sqlx::query("SELECT COUNT(*) AS n FROM nodes WHERE wireguard_public_key = $1 AND id <> $2")
            .bind(public_key.to_owned())
            .bind(id.to_string())
            .fetch_one(&mut *conn)
            .await?;
    Ok(row.try_get::<i64, _>("n")? > 0)
}

/// Replaces the node's key when it is still `old` (compare and swap); clears an operator's
/// request. Answers whether it changed.
pub(crate) async fn set_key(
    conn: &mut AnyConnection,
    id: Uuid,
    old: &str,
    new: &str,
    now: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE nodes SET wireguard_public_key = $1, key_rotated_at = $2, rotate_key_requested_at = NULL, key_prefix = $5 \
         WHERE id = $3 AND wireguard_public_key = $4 AND revoked_at IS NULL",
    )
    .bind(new.to_owned())
    .bind(now)
    .bind(id.to_string())
    .bind(old.to_owned())
    .bind(plexsphere_wire::proof::key_prefix_of(new))
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Stores a freshly handed-out credential as pending (replacing an unused pending one).
pub(crate) async fn set_pending_credential(
    conn: &mut AnyConnection,
    id: Uuid,
    sha256: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE nodes SET pending_credential_sha256 = $1 WHERE id = $2 AND revoked_at IS NULL",
    )
    .bind(sha256.to_owned())
    .bind(id.to_string())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The pending credential was used: it becomes the credential, the old one is accepted until
/// `previous_until`. Only when the pending one is still `pending` (two first uses at once
/// promote once). Answers whether it did.
pub(crate) async fn promote_pending_credential(
    conn: &mut AnyConnection,
    id: Uuid,
    pending: &str,
    now: i64,
    previous_until: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE nodes SET previous_credential_sha256 = credential_sha256, previous_credential_until = $1, \
         credential_sha256 = pending_credential_sha256, pending_credential_sha256 = NULL, \
         credential_rotated_at = $2, rotate_credential_requested_at = NULL \
         WHERE id = $3 AND pending_credential_sha256 = $4",
    )
    .bind(previous_until)
    .bind(now)
    .bind(id.to_string())
    .bind(pending.to_owned())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Which rotation an operator asks a live node for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    Key,
    Credential,
}

/// Marks the node (live only) as asked to rotate; a pending request keeps its first time.
/// Answers whether a live node was marked.
pub(crate) async fn request(
    conn: &mut AnyConnection,
    id: Uuid,
    what: Request,
    now: i64,
) -> Result<bool, StoreError> {
    let sql = match what {
        Request::Key => {
            "UPDATE nodes SET rotate_key_requested_at = COALESCE(rotate_key_requested_at, $1) WHERE id = $2 AND revoked_at IS NULL"
        }
        Request::Credential => {
            "UPDATE nodes SET rotate_credential_requested_at = COALESCE(rotate_credential_requested_at, $1) WHERE id = $2 AND revoked_at IS NULL"
        }
    };
    let done = sqlx::query(sql)
        .bind(now)
        .bind(id.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}
