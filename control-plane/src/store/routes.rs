//! The `node_routes` table (schema version 18): what each node advertises as a subnet router
//! or exit, its approval, health and last report, and whether it carries traffic now
//! (`primary_since`, set by `routes::select`). One row per (node, cidr); an exit is two
//! rows of kind `exit` (`0.0.0.0/0`, `::/0`).

use std::net::IpAddr;

use ipnet::IpNet;
use plexsphere_wire::routes::Approval;
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::{StoreError, parse_col};

/// Whether a row is a subnet route or one of an exit's two prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Route,
    Exit,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Route => "route",
            Kind::Exit => "exit",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "route" => Some(Kind::Route),
            "exit" => Some(Kind::Exit),
            _ => None,
        }
    }
}

/// One (node, cidr) row as the selection (`routes::select`) reads it ([`RouteRow`] holds more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Router {
    pub node_id: Uuid,
    pub cidr: IpNet,
    pub kind: Kind,
    pub probe: Option<IpAddr>,
    /// In the node's last report (false: withdrawn, kept for its approval).
    pub advertised: bool,
    pub healthy: bool,
    /// Since when the router has been healthy without a break (`None` while unhealthy).
    pub healthy_since: Option<i64>,
    pub last_report: i64,
    pub approval: Approval,
    pub approved_at: Option<i64>,
    /// Set while the row carries traffic (primary, or exit in service): since when.
    pub primary_since: Option<i64>,
}

/// A stored row: what the selection reads, and the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRow {
    pub domain_id: Uuid,
    pub router: Router,
    pub approved_by: Option<String>,
}

const COLUMNS: &str = "r.node_id, r.domain_id, r.cidr, r.kind, r.probe, r.advertised, r.healthy, r.healthy_since, r.last_report, r.approval, r.approved_at, r.approved_by, r.primary_since";

pub(crate) fn approval_str(a: Approval) -> &'static str {
    match a {
        Approval::Pending => "pending",
        Approval::Approved => "approved",
        Approval::Denied => "denied",
    }
}

fn parse_approval(s: &str) -> Result<Approval, StoreError> {
    match s {
        "pending" => Ok(Approval::Pending),
        "approved" => Ok(Approval::Approved),
        "denied" => Ok(Approval::Denied),
        other => Err(StoreError::corrupt("node_routes.approval", other)),
    }
}

fn from_row(row: &sqlx::any::AnyRow) -> Result<RouteRow, StoreError> {
    let kind: String = row.try_get("kind")?;
    Ok(RouteRow {
        domain_id: parse_col(
            "node_routes.domain_id",
            &row.try_get::<String, _>("domain_id")?,
        )?,
        approved_by: row.try_get("approved_by")?,
        router: Router {
            node_id: parse_col("node_routes.node_id", &row.try_get::<String, _>("node_id")?)?,
            cidr: parse_col("node_routes.cidr", &row.try_get::<String, _>("cidr")?)?,
            kind: Kind::parse(&kind)
                .ok_or_else(|| StoreError::corrupt("node_routes.kind", &kind))?,
            probe: row
                .try_get::<Option<String>, _>("probe")?
                .map(|p| parse_col("node_routes.probe", &p))
                .transpose()?,
            advertised: row.try_get::<i64, _>("advertised")? != 0,
            healthy: row.try_get::<i64, _>("healthy")? != 0,
            healthy_since: row.try_get("healthy_since")?,
            last_report: row.try_get("last_report")?,
            approval: parse_approval(&row.try_get::<String, _>("approval")?)?,
            approved_at: row.try_get("approved_at")?,
            primary_since: row.try_get("primary_since")?,
        },
    })
}

/// The rows of the live nodes of a Domain, by cidr then node.
pub(crate) async fn in_domain(
    conn: &mut AnyConnection,
    domain: Uuid,
) -> Result<Vec<RouteRow>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM node_routes r JOIN nodes n ON n.id = r.node_id \
         WHERE r.domain_id = $1 AND n.revoked_at IS NULL ORDER BY r.cidr, r.node_id"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(domain.to_string())
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(from_row).collect()
}

/// The Domains that have any row (what the sweep looks at).
pub async fn domains(conn: &mut AnyConnection) -> Result<Vec<Uuid>, StoreError> {
    let rows = sqlx::query("SELECT DISTINCT domain_id FROM node_routes")
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|r| {
            parse_col(
                "node_routes.domain_id",
                &r.try_get::<String, _>("domain_id")?,
            )
        })
        .collect()
}

/// How many advertised rows a Domain has (the Domain's limit).
pub async fn count_advertised(conn: &mut AnyConnection, domain: Uuid) -> Result<i64, StoreError> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS n FROM node_routes WHERE domain_id = $1 AND advertised = 1",
    )
    .bind(domain.to_string())
    .fetch_one(&mut *conn)
    .await?;
    Ok(row.try_get("n")?)
}

pub async fn insert(conn: &mut AnyConnection, r: &RouteRow) -> Result<(), StoreError> {
    let x = &r.router;
    sqlx::query(
        "INSERT INTO node_routes (node_id, domain_id, cidr, kind, probe, advertised, healthy, healthy_since, last_report, approval, approved_at, approved_by, primary_since) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
    )
    .bind(x.node_id.to_string())
    .bind(r.domain_id.to_string())
    .bind(x.cidr.to_string())
    .bind(x.kind.as_str())
    .bind(x.probe.map(|p| p.to_string()))
    .bind(i64::from(x.advertised))
    .bind(i64::from(x.healthy))
    .bind(x.healthy_since)
    .bind(x.last_report)
    .bind(approval_str(x.approval))
    .bind(x.approved_at)
    .bind(r.approved_by.clone())
    .bind(x.primary_since)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Writes a row's report fields, approval and `primary_since` back (the key is unchanged).
pub async fn update(conn: &mut AnyConnection, r: &RouteRow) -> Result<(), StoreError> {
    let x = &r.router;
    sqlx::query(
        "UPDATE node_routes SET probe = $1, advertised = $2, healthy = $3, healthy_since = $4, last_report = $5, \
         approval = $6, approved_at = $7, approved_by = $8, primary_since = $9 WHERE node_id = $10 AND cidr = $11",
    )
    .bind(x.probe.map(|p| p.to_string()))
    .bind(i64::from(x.advertised))
    .bind(i64::from(x.healthy))
    .bind(x.healthy_since)
    .bind(x.last_report)
    .bind(approval_str(x.approval))
    .bind(x.approved_at)
    .bind(r.approved_by.clone())
    .bind(x.primary_since)
    .bind(x.node_id.to_string())
    .bind(x.cidr.to_string())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub async fn delete(
    conn: &mut AnyConnection,
    node: Uuid,
    cidr: &ipnet::IpNet,
) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM node_routes WHERE node_id = $1 AND cidr = $2")
        .bind(node.to_string())
        .bind(cidr.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Sets only `primary_since` (what the selection changes).
pub(crate) async fn set_primary_since(
    conn: &mut AnyConnection,
    node: Uuid,
    cidr: &ipnet::IpNet,
    since: Option<i64>,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE node_routes SET primary_since = $1 WHERE node_id = $2 AND cidr = $3")
        .bind(since)
        .bind(node.to_string())
        .bind(cidr.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The exit a node uses, as its last report named it.
pub(crate) async fn set_use_exit(
    conn: &mut AnyConnection,
    node: Uuid,
    use_exit: Option<&str>,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE nodes SET use_exit = $1 WHERE id = $2")
        .bind(use_exit.map(str::to_owned))
        .bind(node.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Every live node of a Domain that names an exit: (node, what it named).
pub(crate) async fn exit_users(
    conn: &mut AnyConnection,
    domain: Uuid,
) -> Result<Vec<(Uuid, String)>, StoreError> {
    let rows = sqlx::query(
        "SELECT id, use_exit FROM nodes WHERE domain_id = $1 AND revoked_at IS NULL AND use_exit IS NOT NULL ORDER BY id",
    )
    .bind(domain.to_string())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok((
                parse_col("nodes.id", &r.try_get::<String, _>("id")?)?,
                r.try_get::<String, _>("use_exit")?,
            ))
        })
        .collect()
}

/// Whether `node` carries any route or exit now.
pub(crate) async fn carries_any(conn: &mut AnyConnection, node: Uuid) -> Result<bool, StoreError> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS n FROM node_routes WHERE node_id = $1 AND primary_since IS NOT NULL",
    )
    .bind(node.to_string())
    .fetch_one(&mut *conn)
    .await?;
    Ok(row.try_get::<i64, _>("n")? > 0)
}
