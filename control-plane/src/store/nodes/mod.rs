//! The `nodes` table: one row per registered node; its credential only as a SHA-256 digest.
//! Its column groups have their own files: the reach columns ([`reach`]), the rotation
//! columns ([`rotation`]) and the host a node is bound to ([`hosts`]); what a node's calls and
//! its operator change after registration has its own file too (`updates`). They import the
//! store's error and column helpers, never this file (only the unit tests' fixture of a row,
//! `test_row`, does).

use std::net::{IpAddr, SocketAddr};

use plexsphere_wire::host::HostFingerprint;
use plexsphere_wire::node::UdpOffload;
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::{StoreError, parse_col};

pub mod hosts;
mod reach;
pub use reach::{NodeReach, set_endpoints};
use reach::{json_list, reach_from_row};
pub(crate) mod rotation;
pub use rotation::NodeRotation;
#[cfg(test)]
mod test_row;
mod updates;
use updates::sat_i64;
pub(crate) use updates::{HeartbeatRecord, record_heartbeat, set_udp_offload};
pub use updates::{delete, revoke, set_tags, touch_last_seen};

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
    /// The WireGuard listen port the node last reported.
    pub listen_port: Option<u16>,
    /// The endpoints the server advertises for the node, best first.
    pub endpoints: Vec<SocketAddr>,
    /// What the node reported about itself (heartbeats and ingest).
    pub report: NodeReport,
    /// What the node's last endpoint report said of its reach.
    pub reach: NodeReach,
    /// Key and credential rotation (schema version 9).
    pub rotation: NodeRotation,
    /// The host fingerprint the node is bound to (`None` until it sent one; schema version 10,
    /// `crate::node::clone`).
    pub host_fingerprint: Option<HostFingerprint>,
    /// The token it registered with and whether it is ephemeral (schema version 11).
    pub origin: NodeOrigin,
    /// The operator's UDP GSO/GRO switch (`None`: the node's default; schema version 14).
    pub udp_offload: Option<UdpOffload>,
    /// The node's tags, names without `tag:`, sorted (schema version 17, `crate::tags`).
    pub tags: Vec<String>,
    /// The node's DNS label, unique among the live nodes of its Domain (schema version 18,
    /// `store::names`); a row not named yet reads its host name's label.
    pub dns_name: String,
}

/// Where a node came from: the bootstrap token it registered with (`None` for nodes older
/// than schema version 11 whose token row is gone) and, for an ephemeral node, how long it may
/// stay offline before the control plane removes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeOrigin {
    pub bootstrap_token_id: Option<String>,
    pub ephemeral_offline_secs: Option<u64>,
}

/// What a node reported about itself: its last heartbeat's figures (all `None` until it
/// heartbeats) and the observations it dropped before sending (ingest, summed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeReport {
    pub last_heartbeat_at: Option<i64>,
    pub uptime_secs: Option<u64>,
    pub applied_state_version: Option<u64>,
    pub peers_configured: Option<u32>,
    pub peers_connected: Option<u32>,
    pub observations_dropped: u64,
}

/// The columns every node SELECT reads, in `from_row`'s order.
macro_rules! select_nodes {
    ($tail:literal) => {
        concat!(
            "SELECT id, domain_id, project_id, hostname, arch, plexd_version, mesh_ip, wireguard_public_key, resource_handle, credential_sha256, registered_at, last_seen_at, revoked_at, listen_port, endpoints, \
             last_heartbeat_at, uptime_secs, applied_state_version, peers_configured, peers_connected, observations_dropped, \
             local_endpoints, reflexive_endpoints, observed_endpoint, home_relay, nat_mapping, udp_blocked, \
             key_rotated_at, credential_rotated_at, pending_credential_sha256, previous_credential_sha256, previous_credential_until, rotate_key_requested_at, rotate_credential_requested_at, host_fingerprint, bootstrap_token_id, ephemeral_offline_secs, udp_offload, tags, dns_name FROM nodes ",
            $tail
        )
    };
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
            .field("tags", &self.tags)
            .field("dns_name", &self.dns_name)
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
        listen_port: row
            .try_get::<Option<i64>, _>("listen_port")?
            .map(|p| u16::try_from(p).map_err(|_| StoreError::corrupt("nodes.listen_port", p)))
            .transpose()?,
        endpoints: json_list(row, "endpoints", "nodes.endpoints")?,
        report: NodeReport {
            last_heartbeat_at: row.try_get("last_heartbeat_at")?,
            uptime_secs: opt_col(row, "uptime_secs", "nodes.uptime_secs")?,
            applied_state_version: opt_col(
                row,
                "applied_state_version",
                "nodes.applied_state_version",
            )?,
            peers_configured: opt_col(row, "peers_configured", "nodes.peers_configured")?,
            peers_connected: opt_col(row, "peers_connected", "nodes.peers_connected")?,
            observations_dropped: {
                let n: i64 = row.try_get("observations_dropped")?;
                u64::try_from(n)
                    .map_err(|_| StoreError::corrupt("nodes.observations_dropped", n))?
            },
        },
        reach: reach_from_row(row)?,
        rotation: rotation::rotation_from_row(row)?,
        host_fingerprint: row
            .try_get::<Option<String>, _>("host_fingerprint")?
            .map(|t| hosts::parse_fingerprint(&t))
            .transpose()?,
        origin: NodeOrigin {
            bootstrap_token_id: row.try_get("bootstrap_token_id")?,
            ephemeral_offline_secs: opt_col(
                row,
                "ephemeral_offline_secs",
                "nodes.ephemeral_offline_secs",
            )?,
        },
        udp_offload: row
            .try_get::<Option<String>, _>("udp_offload")?
            .map(|t| {
                UdpOffload::parse(&t).ok_or_else(|| StoreError::corrupt("nodes.udp_offload", t))
            })
            .transpose()?,
        tags: crate::tags::split(&row.try_get::<String, _>("tags")?),
        dns_name: match row.try_get::<Option<String>, _>("dns_name")? {
            Some(n) => n,
            None => {
                plexsphere_wire::routes::label_from_hostname(&row.try_get::<String, _>("hostname")?)
            }
        },
    })
}

/// A nullable BIGINT column as an unsigned integer; out of range is a corrupt row.
fn opt_col<T: TryFrom<i64>>(
    row: &sqlx::any::AnyRow,
    column: &str,
    what: &'static str,
) -> Result<Option<T>, StoreError> {
    row.try_get::<Option<i64>, _>(column)?
        .map(|v| T::try_from(v).map_err(|_| StoreError::corrupt(what, v)))
        .transpose()
}

pub async fn insert(conn: &mut AnyConnection, n: &NodeRow) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO nodes (id, domain_id, project_id, hostname, arch, plexd_version, mesh_ip, wireguard_public_key, resource_handle, credential_sha256, registered_at, last_seen_at, revoked_at, bootstrap_token_id, ephemeral_offline_secs, key_prefix, tags, dns_name) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)",
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
    .bind(n.origin.bootstrap_token_id.clone())
    .bind(n.origin.ephemeral_offline_secs.map(sat_i64))
    .bind(plexsphere_wire::proof::key_prefix_of(&n.wireguard_public_key))
    .bind(crate::tags::join(&n.tags))
    .bind(n.dns_name.clone())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A live node of `domain` other than `except` whose key is `key` or shares its first 8
/// bytes: its id and key (the exact key first).
pub(crate) async fn key_clash(
    conn: &mut AnyConnection,
    domain: Uuid,
    key: &str,
    except: Option<Uuid>,
) -> Result<Option<(Uuid, String)>, StoreError> {
    let row = sqlx::query(
        "SELECT id, wireguard_public_key FROM nodes \
         WHERE domain_id = $1 AND revoked_at IS NULL AND id <> $2 \
         AND (wireguard_public_key = $3 OR key_prefix = $4) \
         ORDER BY CASE WHEN wireguard_public_key = $3 THEN 0 ELSE 1 END, registered_at LIMIT 1",
    )
    .bind(domain.to_string())
    .bind(except.map_or_else(String::new, |e| e.to_string()))
    .bind(key.to_owned())
    .bind(plexsphere_wire::proof::key_prefix_of(key))
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let id = parse_col("nodes.id", &row.try_get::<String, _>("id")?)?;
    Ok(Some((id, row.try_get("wireguard_public_key")?)))
}

/// The node `token_id` made for this WireGuard key, if any (the replay rule's lookup).
pub async fn made_by_token_with_key(
    conn: &mut AnyConnection,
    token_id: &str,
    wireguard_public_key: &str,
) -> Result<Option<NodeRow>, StoreError> {
    let row = sqlx::query(select_nodes!(
        "WHERE bootstrap_token_id = $1 AND wireguard_public_key = $2 ORDER BY registered_at DESC, id LIMIT 1"
    ))
    .bind(token_id.to_owned())
    .bind(wireguard_public_key.to_owned())
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// The ids of the nodes each token of a Project made, oldest first, by token id.
pub(crate) async fn made_by_tokens_of_project(
    conn: &mut AnyConnection,
    project_id: Uuid,
) -> Result<std::collections::HashMap<String, Vec<Uuid>>, StoreError> {
    let rows = sqlx::query(
        "SELECT id, bootstrap_token_id FROM nodes WHERE project_id = $1 AND bootstrap_token_id IS NOT NULL ORDER BY registered_at, id",
    )
    .bind(project_id.to_string())
    .fetch_all(&mut *conn)
    .await?;
    let mut out: std::collections::HashMap<String, Vec<Uuid>> = std::collections::HashMap::new();
    for row in &rows {
        let token: String = row.try_get("bootstrap_token_id")?;
        let id = parse_col("nodes.id", &row.try_get::<String, _>("id")?)?;
        out.entry(token).or_default().push(id);
    }
    Ok(out)
}

/// The live ephemeral nodes whose last authenticated call (or registration, when they never
/// made one) is older than their offline allowance at `now`.
pub(crate) async fn ephemeral_expired(
    conn: &mut AnyConnection,
    now: i64,
) -> Result<Vec<NodeRow>, StoreError> {
    let rows = sqlx::query(select_nodes!(
        "WHERE ephemeral_offline_secs IS NOT NULL AND revoked_at IS NULL \
         AND COALESCE(last_seen_at, registered_at) + ephemeral_offline_secs < $1 ORDER BY registered_at, id"
    ))
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(from_row).collect()
}

pub async fn get(conn: &mut AnyConnection, id: Uuid) -> Result<Option<NodeRow>, StoreError> {
    let row = sqlx::query(select_nodes!("WHERE id = $1"))
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
            sqlx::query(select_nodes!(
                "WHERE project_id = $1 ORDER BY registered_at, id"
            ))
            .bind(p.to_string())
            .fetch_all(&mut *conn)
            .await?
        }
        None => {
            sqlx::query(select_nodes!("ORDER BY registered_at, id"))
                .fetch_all(&mut *conn)
                .await?
        }
    };
    rows.iter().map(from_row).collect()
}

/// How many live nodes a Project has.
pub(crate) async fn count_live_in_project(
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
pub(crate) async fn replace_unused_credential(
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

/// The live (not revoked) nodes of a Domain, oldest first.
pub async fn live_in_domain(
    conn: &mut AnyConnection,
    domain_id: Uuid,
) -> Result<Vec<NodeRow>, StoreError> {
    let rows = sqlx::query(select_nodes!(
        "WHERE domain_id = $1 AND revoked_at IS NULL ORDER BY registered_at, id"
    ))
    .bind(domain_id.to_string())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(from_row).collect()
}
