//! The `node_paths` and `path_heads` tables (schema version 21): each node's last path report
//! (one row per peer) and each Domain's path seq, which the console's event stream follows.
//! Also the lean node rows the mesh map reads (a handful of columns, one query per Domain).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use plexsphere_wire::paths::{PathKind, PathTransport};
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::{StoreError, parse_col};

/// One stored row: what `node_id` said of its path to `peer_node_id`.
#[derive(Debug, Clone, PartialEq)]
pub struct PathRow {
    pub node_id: Uuid,
    pub peer_node_id: Uuid,
    pub path: PathKind,
    pub rtt_ms: Option<f64>,
    pub last_handshake_at: Option<i64>,
    pub updated_at: i64,
    pub seq: u64,
}

/// Where a Domain's path seq stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathHead {
    /// The newest report's seq (0: none yet).
    pub seq: u64,
    /// The newest report that removed rows (a stream past its seq sends a snapshot hint).
    pub removed_seq: u64,
}

/// A live node as the map shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapNode {
    pub id: Uuid,
    pub project_id: Uuid,
    pub name: String,
    pub mesh_ip: IpAddr,
    pub last_seen_at: Option<i64>,
    pub version: String,
}

const COLUMNS: &str = "p.node_id, p.peer_node_id, p.kind, p.relay, p.transport, p.endpoint, p.rtt_ms, p.last_handshake_at, p.updated_at, p.seq";

fn to_u64(what: &'static str, v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::corrupt(what, v))
}

fn from_row(row: &sqlx::any::AnyRow) -> Result<PathRow, StoreError> {
    let kind: String = row.try_get("kind")?;
    let path = match kind.as_str() {
        "none" => PathKind::None,
        "direct" => {
            let e: Option<String> = row.try_get("endpoint")?;
            let e = e.ok_or_else(|| StoreError::corrupt("node_paths.endpoint", "NULL"))?;
            PathKind::Direct {
                endpoint: parse_col::<SocketAddr>("node_paths.endpoint", &e)?,
            }
        }
        "relay" => {
            let relay: Option<String> = row.try_get("relay")?;
            let t: Option<String> = row.try_get("transport")?;
            let t = t.unwrap_or_default();
            PathKind::Relay {
                relay: relay.ok_or_else(|| StoreError::corrupt("node_paths.relay", "NULL"))?,
                transport: PathTransport::parse(&t)
                    .ok_or_else(|| StoreError::corrupt("node_paths.transport", &t))?,
            }
        }
        other => return Err(StoreError::corrupt("node_paths.kind", other)),
    };
    Ok(PathRow {
        node_id: parse_col("node_paths.node_id", &row.try_get::<String, _>("node_id")?)?,
        peer_node_id: parse_col(
            "node_paths.peer_node_id",
            &row.try_get::<String, _>("peer_node_id")?,
        )?,
        path,
        rtt_ms: row.try_get("rtt_ms")?,
        last_handshake_at: row.try_get("last_handshake_at")?,
        updated_at: row.try_get("updated_at")?,
        seq: to_u64("node_paths.seq", row.try_get("seq")?)?,
    })
}

/// Replaces `node_id`'s rows by `rows` (their `seq` is ignored: every row gets the Domain's
/// next path seq, which is answered). Call inside a transaction.
pub async fn replace(
    conn: &mut AnyConnection,
    domain: Uuid,
    node_id: Uuid,
    rows: &[PathRow],
    now: i64,
) -> Result<u64, StoreError> {
    let before = sqlx::query("SELECT peer_node_id FROM node_paths WHERE node_id = $1")
        .bind(node_id.to_string())
        .fetch_all(&mut *conn)
        .await?;
    let removed = before.iter().any(|r| {
        let peer: String = r.try_get("peer_node_id").unwrap_or_default();
        !rows.iter().any(|w| w.peer_node_id.to_string() == peer)
    });
    let head = sqlx::query(
        "INSERT INTO path_heads (domain_id, seq, removed_seq) VALUES ($1, 1, 0) \
         ON CONFLICT (domain_id) DO UPDATE SET seq = path_heads.seq + 1 RETURNING seq",
    )
    .bind(domain.to_string())
    .fetch_one(&mut *conn)
    .await?;
    let seq: i64 = head.try_get("seq")?;
    if removed {
        sqlx::query("UPDATE path_heads SET removed_seq = $1 WHERE domain_id = $2")
            .bind(seq)
            .bind(domain.to_string())
            .execute(&mut *conn)
            .await?;
    }
    sqlx::query("DELETE FROM node_paths WHERE node_id = $1")
        .bind(node_id.to_string())
        .execute(&mut *conn)
        .await?;
    for r in rows {
        let (relay, transport, endpoint) = match &r.path {
            PathKind::None => (None, None, None),
            PathKind::Direct { endpoint } => (None, None, Some(endpoint.to_string())),
            PathKind::Relay { relay, transport } => {
                (Some(relay.clone()), Some(transport.as_str()), None)
            }
        };
        sqlx::query(
            "INSERT INTO node_paths (node_id, peer_node_id, domain_id, kind, relay, transport, endpoint, rtt_ms, last_handshake_at, updated_at, seq) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(node_id.to_string())
        .bind(r.peer_node_id.to_string())
        .bind(domain.to_string())
        .bind(r.path.as_str())
        .bind(relay)
        .bind(transport)
        .bind(endpoint)
        .bind(r.rtt_ms)
        .bind(r.last_handshake_at)
        .bind(now)
        .bind(seq)
        .execute(&mut *conn)
        .await?;
    }
    to_u64("path_heads.seq", seq)
}

/// Removes every row `node_id` reported or is the peer of (it was revoked or removed).
pub async fn forget_node(conn: &mut AnyConnection, node_id: Uuid) -> Result<u64, StoreError> {
    let done = sqlx::query("DELETE FROM node_paths WHERE node_id = $1 OR peer_node_id = $1")
        .bind(node_id.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected())
}

/// `node_id`'s rows, by peer.
pub async fn of_node(conn: &mut AnyConnection, node_id: Uuid) -> Result<Vec<PathRow>, StoreError> {
    let sql =
        format!("SELECT {COLUMNS} FROM node_paths p WHERE p.node_id = $1 ORDER BY p.peer_node_id");
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(node_id.to_string())
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(from_row).collect()
}

/// The Domain's rows, all of them (`after` = 0) or those written after seq `after`.
pub async fn in_domain(
    conn: &mut AnyConnection,
    domain: Uuid,
    after: u64,
) -> Result<Vec<PathRow>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM node_paths p WHERE p.domain_id = $1 AND p.seq > $2");
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(domain.to_string())
        .bind(i64::try_from(after).unwrap_or(i64::MAX))
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(from_row).collect()
}

/// The rows between the pairs of `nodes` in both directions (what a changed pair's link is
/// rebuilt from).
pub async fn between(
    conn: &mut AnyConnection,
    domain: Uuid,
    nodes: &[Uuid],
) -> Result<Vec<PathRow>, StoreError> {
    if nodes.is_empty() {
        return Ok(vec![]);
    }
    // Few nodes change at once; past that the Domain's rows are read whole.
    if nodes.len() > 200 {
        return in_domain(conn, domain, 0).await;
    }
    let list = uuid_list(nodes);
    let sql = format!(
        "SELECT {COLUMNS} FROM node_paths p WHERE p.domain_id = $1 AND (p.node_id IN ({list}) OR p.peer_node_id IN ({list}))"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(domain.to_string())
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(from_row).collect()
}

/// Every Domain's path head.
pub async fn heads(conn: &mut AnyConnection) -> Result<HashMap<Uuid, PathHead>, StoreError> {
    let rows = sqlx::query("SELECT domain_id, seq, removed_seq FROM path_heads")
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|r| {
            let d = parse_col(
                "path_heads.domain_id",
                &r.try_get::<String, _>("domain_id")?,
            )?;
            Ok((
                d,
                PathHead {
                    seq: to_u64("path_heads.seq", r.try_get("seq")?)?,
                    removed_seq: to_u64("path_heads.removed_seq", r.try_get("removed_seq")?)?,
                },
            ))
        })
        .collect()
}

/// The live (not revoked) nodes of a Domain with what the map shows, in one query.
pub async fn map_nodes(conn: &mut AnyConnection, domain: Uuid) -> Result<Vec<MapNode>, StoreError> {
    let rows = sqlx::query(
        "SELECT id, project_id, COALESCE(dns_name, hostname) AS name, mesh_ip, last_seen_at, plexd_version \
         FROM nodes WHERE domain_id = $1 AND revoked_at IS NULL ORDER BY id",
    )
    .bind(domain.to_string())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(map_node).collect()
}

/// A resource's phase as the console's event stream reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePhase {
    pub id: Uuid,
    pub project_id: Uuid,
    pub phase: String,
    pub version: i64,
    pub updated_at: i64,
}

/// The resources updated at or after `since` (unix seconds), at most `limit` (the console's
/// cheap "changed since" read; seconds are coarse, so the reader dedups by `version`).
pub async fn resources_since(
    conn: &mut AnyConnection,
    since: i64,
    limit: u32,
) -> Result<Vec<ResourcePhase>, StoreError> {
    let rows = sqlx::query(
        "SELECT id, project_id, phase, version, updated_at FROM resources \
         WHERE updated_at >= $1 ORDER BY updated_at, id LIMIT $2",
    )
    .bind(since)
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(ResourcePhase {
                id: parse_col("resources.id", &r.try_get::<String, _>("id")?)?,
                project_id: parse_col(
                    "resources.project_id",
                    &r.try_get::<String, _>("project_id")?,
                )?,
                phase: r.try_get("phase")?,
                version: r.try_get("version")?,
                updated_at: r.try_get("updated_at")?,
            })
        })
        .collect()
}

/// Live nodes by id (what the console's `node` events carry); missing or revoked ids are left
/// out.
pub async fn map_nodes_by_id(
    conn: &mut AnyConnection,
    ids: &[Uuid],
) -> Result<Vec<MapNode>, StoreError> {
    if ids.is_empty() {
        return Ok(vec![]);
    }
    let list = uuid_list(ids);
    let sql = format!(
        "SELECT id, project_id, COALESCE(dns_name, hostname) AS name, mesh_ip, last_seen_at, plexd_version \
         FROM nodes WHERE id IN ({list}) AND revoked_at IS NULL ORDER BY id"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(map_node).collect()
}

/// Which of `ids` are live nodes of `domain` (a report's peers are checked with this: one
/// query of at most the report's size, whatever the Domain's).
pub async fn live_in_domain(
    conn: &mut AnyConnection,
    domain: Uuid,
    ids: &[Uuid],
) -> Result<std::collections::HashSet<Uuid>, StoreError> {
    if ids.is_empty() {
        return Ok(std::collections::HashSet::new());
    }
    let list = uuid_list(ids);
    let sql = format!(
        "SELECT id FROM nodes WHERE domain_id = $1 AND revoked_at IS NULL AND id IN ({list})"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(domain.to_string())
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|r| parse_col("nodes.id", &r.try_get::<String, _>("id")?))
        .collect()
}

/// `'id1','id2',...` for an SQL `IN (...)` list. Only UUIDs, formatted here, ever go into it
/// (never caller text), so the list cannot carry SQL.
fn uuid_list(ids: &[Uuid]) -> String {
    ids.iter()
        .map(|id| format!("'{id}'"))
        .collect::<Vec<_>>()
        .join(",")
}

fn map_node(r: &sqlx::any::AnyRow) -> Result<MapNode, StoreError> {
    Ok(MapNode {
        id: parse_col("nodes.id", &r.try_get::<String, _>("id")?)?,
        project_id: parse_col("nodes.project_id", &r.try_get::<String, _>("project_id")?)?,
        name: r.try_get("name")?,
        mesh_ip: parse_col("nodes.mesh_ip", &r.try_get::<String, _>("mesh_ip")?)?,
        last_seen_at: r.try_get("last_seen_at")?,
        version: r.try_get("plexd_version")?,
    })
}
