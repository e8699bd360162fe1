//! The `nodes` table: one row per registered node; its credential only as a SHA-256 digest.

use std::net::IpAddr;

use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::{StoreError, parse_col};

#[derive(Clone, PartialEq, Eq)]
pub struct NodeRow {
    pub id: Uuid,
    pub domain_id: Uuid,
    pub project_id: Uuid,
    pub hostname: String,
    pub arch: String,
    pub plexd_version: String,
    pub mesh_ip: IpAddr,
    pub wireguard_public_key: String,
    pub resource_handle: Option<String>,
    /// Lowercase hex SHA-256 of the credential's secret part.
    pub credential_sha256: String,
    pub registered_at: i64,
    /// Set by every call the node authenticates with its credential; NULL = never authenticated.
    pub last_seen_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

impl std::fmt::Debug for NodeRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeRow")
            .field("id", &self.id)
            .field("project_id", &self.project_id)
            .field("hostname", &self.hostname)
            .field("mesh_ip", &self.mesh_ip)
            .field("last_seen_at", &self.last_seen_at)
            .field("revoked_at", &self.revoked_at)
            .finish_non_exhaustive()
    }
}

fn from_row(row: &sqlx::any::AnyRow) -> Result<NodeRow, StoreError> {
    Ok(NodeRow {
        id: parse_col("nodes.id", &row.try_get::<String, _>("id")?)?,
        domain_id: parse_col("nodes.domain_id", &row.try_get::<String, _>("domain_id")?)?,
        project_id: parse_col("nodes.project_id", &row.try_get::<String, _>("project_id")?)?,
        hostname: row.try_get("hostname")?,
        arch: row.try_get("arch")?,
        plexd_version: row.try_get("plexd_version")?,
        mesh_ip: parse_col("nodes.mesh_ip", &row.try_get::<String, _>("mesh_ip")?)?,
        wireguard_public_key: row.try_get("wireguard_public_key")?,
        resource_handle: row.try_get("resource_handle")?,
        credential_sha256: row.try_get("credential_sha256")?,
        registered_at: row.try_get("registered_at")?,
        last_seen_at: row.try_get("last_seen_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

pub async fn insert(conn: &mut AnyConnection, n: &NodeRow) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO nodes (id, domain_id, project_id, hostname, arch, plexd_version, mesh_ip, wireguard_public_key, resource_handle, credential_sha256, registered_at, last_seen_at, revoked_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
    )
    .bind(n.id.to_string())
    .bind(n.domain_id.to_string())
    .bind(n.project_id.to_string())
    .bind(n.hostname.clone())
    .bind(n.arch.clone())
    .bind(n.plexd_version.clone())
    .bind(n.mesh_ip.to_string())
    .bind(n.wireguard_public_key.clone())
    .bind(n.resource_handle.clone())
    .bind(n.credential_sha256.clone())
    .bind(n.registered_at)
    .bind(n.last_seen_at)
    .bind(n.revoked_at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub async fn get(conn: &mut AnyConnection, id: Uuid) -> Result<Option<NodeRow>, StoreError> {
    let row = sqlx::query(
        "SELECT id, domain_id, project_id, hostname, arch, plexd_version, mesh_ip, wireguard_public_key, resource_handle, credential_sha256, registered_at, last_seen_at, revoked_at \
         FROM nodes WHERE id = $1",
    )
    .bind(id.to_string())
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Every node, or those of one Project, oldest first.
pub async fn list(
    conn: &mut AnyConnection,
    project_id: Option<Uuid>,
) -> Result<Vec<NodeRow>, StoreError> {
    let rows = match project_id {
        Some(p) => {
            sqlx::query(
                "SELECT id, domain_id, project_id, hostname, arch, plexd_version, mesh_ip, wireguard_public_key, resource_handle, credential_sha256, registered_at, last_seen_at, revoked_at \
                 FROM nodes WHERE project_id = $1 ORDER BY registered_at, id",
            )
            .bind(p.to_string())
            .fetch_all(&mut *conn)
            .await?
        }
        None => {
            sqlx::query(
                "SELECT id, domain_id, project_id, hostname, arch, plexd_version, mesh_ip, wireguard_public_key, resource_handle, credential_sha256, registered_at, last_seen_at, revoked_at \
                 FROM nodes ORDER BY registered_at, id",
            )
            .fetch_all(&mut *conn)
            .await?
        }
    };
    rows.iter().map(from_row).collect()
}

/// The mesh IPs live (not revoked) nodes of a Domain hold.
pub async fn live_mesh_ips(
    conn: &mut AnyConnection,
    domain_id: Uuid,
) -> Result<Vec<IpAddr>, StoreError> {
    let rows = sqlx::query("SELECT mesh_ip FROM nodes WHERE domain_id = $1 AND revoked_at IS NULL")
        .bind(domain_id.to_string())
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|r| parse_col("nodes.mesh_ip", &r.try_get::<String, _>("mesh_ip")?))
        .collect()
}

/// How many live nodes a Project has.
pub async fn count_live_in_project(
    conn: &mut AnyConnection,
    project_id: Uuid,
) -> Result<i64, StoreError> {
    let row =
        sqlx::query("SELECT COUNT(*) AS n FROM nodes WHERE project_id = $1 AND revoked_at IS NULL")
            .bind(project_id.to_string())
            .fetch_one(&mut *conn)
            .await?;
    Ok(row.try_get("n")?)
}

/// Replaces the credential of a node that has never authenticated and still has this
/// WireGuard key. Answers whether it did (false: the node authenticated meanwhile).
pub async fn replace_unused_credential(
    conn: &mut AnyConnection,
    id: Uuid,
    wireguard_public_key: &str,
    credential_sha256: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE nodes SET credential_sha256 = $1 \
         WHERE id = $2 AND wireguard_public_key = $3 AND last_seen_at IS NULL AND revoked_at IS NULL",
    )
    .bind(credential_sha256.to_owned())
    .bind(id.to_string())
    .bind(wireguard_public_key.to_owned())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records that the node authenticated with its credential (ends the replay window).
pub async fn touch_last_seen(
    conn: &mut AnyConnection,
    id: Uuid,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE nodes SET last_seen_at = $1 WHERE id = $2")
        .bind(now)
        .bind(id.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(())
}
