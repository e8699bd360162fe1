//! The `resources` table: a provisioned resource as `plexsphere_broker::Resource` plus what
//! the broker keeps beside it (the minted token's id, the rendered composite, when the
//! substrate was asked to provision). Updates are conditional on the `version` read, so the
//! API and the reconcile loop never overwrite each other's transitions.

use plexsphere_broker::Resource;
use plexsphere_broker::phase::Provisioning;
use serde_json::{Map, Value};
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::{StoreError, from_unix, parse_col, unix};

/// A stored resource and its broker bookkeeping.
#[derive(Clone)]
pub struct ResourceRow {
    pub resource: Resource,
    /// The bootstrap token minted for a machine (its public id).
    pub token_id: Option<String>,
    /// The rendered composite (Crossplane YAML); it may hold a bootstrap token.
    pub composite: Option<String>,
    pub provisioned_at: Option<i64>,
    pub version: i64,
    pub updated_at: i64,
}

impl std::fmt::Debug for ResourceRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceRow")
            .field("id", &self.resource.id)
            .field("phase", &self.resource.provisioning.phase)
            .field("token_id", &self.token_id)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

const COLUMNS: &str = "id, project_id, kind, blueprint_version_id, cloud_credential_id, parameters, provisioning, node_id, token_id, composite, provisioned_at, version, created_at, updated_at";

fn from_row(row: &sqlx::any::AnyRow) -> Result<ResourceRow, StoreError> {
    let parameters: Map<String, Value> =
        serde_json::from_str(&row.try_get::<String, _>("parameters")?)
            .map_err(|e| StoreError::corrupt("resources.parameters", e))?;
    let provisioning: Provisioning =
        serde_json::from_str(&row.try_get::<String, _>("provisioning")?)
            .map_err(|e| StoreError::corrupt("resources.provisioning", e))?;
    let node_id: Option<String> = row.try_get("node_id")?;
    let resource = Resource {
        id: parse_col("resources.id", &row.try_get::<String, _>("id")?)?,
        project_id: parse_col(
            "resources.project_id",
            &row.try_get::<String, _>("project_id")?,
        )?,
        kind: row.try_get("kind")?,
        origin: plexsphere_broker::resource::Origin::Provisioned,
        blueprint_version_id: parse_col(
            "resources.blueprint_version_id",
            &row.try_get::<String, _>("blueprint_version_id")?,
        )?,
        cloud_credential_id: parse_col(
            "resources.cloud_credential_id",
            &row.try_get::<String, _>("cloud_credential_id")?,
        )?,
        parameters,
        provisioning,
        node_id: node_id
            .map(|s| parse_col("resources.node_id", &s))
            .transpose()?,
        created_at: from_unix("resources.created_at", row.try_get("created_at")?)?,
    };
    Ok(ResourceRow {
        resource,
        token_id: row.try_get("token_id")?,
        composite: row.try_get("composite")?,
        provisioned_at: row.try_get("provisioned_at")?,
        version: row.try_get("version")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn json(what: &'static str, v: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::corrupt(what, e))
}

pub async fn insert(conn: &mut AnyConnection, r: &ResourceRow) -> Result<(), StoreError> {
    let res = &r.resource;
    sqlx::query(
        "INSERT INTO resources (id, project_id, kind, blueprint_version_id, cloud_credential_id, parameters, provisioning, phase, node_id, token_id, composite, provisioned_at, version, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
    )
    .bind(res.id.to_string())
    .bind(res.project_id.to_string())
    .bind(res.kind.clone())
    .bind(res.blueprint_version_id.to_string())
    .bind(res.cloud_credential_id.to_string())
    .bind(json("resources.parameters", &res.parameters)?)
    .bind(json("resources.provisioning", &res.provisioning)?)
    .bind(res.provisioning.phase.as_str())
    .bind(res.node_id.map(|u| u.to_string()))
    .bind(r.token_id.clone())
    .bind(r.composite.clone())
    .bind(r.provisioned_at)
    .bind(r.version)
    .bind(unix(res.created_at))
    .bind(r.updated_at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub async fn get(conn: &mut AnyConnection, id: Uuid) -> Result<Option<ResourceRow>, StoreError> {
    let sql = sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM resources WHERE id = $1"));
    let row = sqlx::query(sql)
        .bind(id.to_string())
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(from_row).transpose()
}

pub async fn list_for_project(
    conn: &mut AnyConnection,
    project_id: Uuid,
) -> Result<Vec<ResourceRow>, StoreError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM resources WHERE project_id = $1 ORDER BY created_at, id"
    ));
    let rows = sqlx::query(sql)
        .bind(project_id.to_string())
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(from_row).collect()
}

/// Every resource the reconcile loop still drives: all but `Failed` and `Deleted`.
pub(crate) async fn list_active(conn: &mut AnyConnection) -> Result<Vec<ResourceRow>, StoreError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM resources WHERE phase NOT IN ('Failed', 'Deleted') ORDER BY created_at, id"
    ));
    let rows = sqlx::query(sql).fetch_all(&mut *conn).await?;
    rows.iter().map(from_row).collect()
}

/// How many resources are in each phase: every phase of [`Phase::ALL`], 0 when none.
/// A phase name the code does not know is skipped (no free-form label from the database).
///
/// [`Phase::ALL`]: plexsphere_broker::phase::Phase::ALL
pub(crate) async fn count_by_phase(
    conn: &mut AnyConnection,
) -> Result<Vec<(&'static str, i64)>, StoreError> {
    use plexsphere_broker::phase::Phase;
    let rows = sqlx::query("SELECT phase, COUNT(*) AS n FROM resources GROUP BY phase")
        .fetch_all(&mut *conn)
        .await?;
    let mut counts: Vec<(&'static str, i64)> = Phase::ALL.iter().map(|p| (p.as_str(), 0)).collect();
    for row in &rows {
        let phase: String = row.try_get("phase")?;
        let n: i64 = row.try_get("n")?;
        if let Some(slot) = counts.iter_mut().find(|(name, _)| *name == phase) {
            slot.1 = n;
        }
    }
    Ok(counts)
}

/// Writes `r` if the stored version is still `r.version`, bumping it. Answers false when
/// another writer got there first (re-read and decide again).
pub async fn update(
    conn: &mut AnyConnection,
    r: &mut ResourceRow,
    now: i64,
) -> Result<bool, StoreError> {
    update_as(conn, r, now, None).await
}

/// [`update`] by the broker's leader: it writes only while `holder` holds the broker lease
/// at `now_ms` (unix ms, the holder's wall clock). A paused old leader whose lease passed to
/// another replica writes nothing; it answers `false` as for a lost race.
pub async fn update_as(
    conn: &mut AnyConnection,
    r: &mut ResourceRow,
    now: i64,
    leader: Option<(&str, i64)>,
) -> Result<bool, StoreError> {
    let res = &r.resource;
    let fence = if leader.is_some() {
        " AND EXISTS (SELECT 1 FROM leases WHERE name = $11 AND holder = $12 AND expires_at_ms > $13)"
    } else {
        ""
    };
    let sql = format!(
        "UPDATE resources SET provisioning = $1, phase = $2, node_id = $3, token_id = $4, composite = $5, provisioned_at = $6, version = $7, updated_at = $8 \
         WHERE id = $9 AND version = $10{fence}"
    );
    let query = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(json("resources.provisioning", &res.provisioning)?)
        .bind(res.provisioning.phase.as_str())
        .bind(res.node_id.map(|u| u.to_string()))
        .bind(r.token_id.clone())
        .bind(r.composite.clone())
        .bind(r.provisioned_at)
        .bind(r.version + 1)
        .bind(now)
        .bind(res.id.to_string())
        .bind(r.version);
    let query = match leader {
        Some((holder, now_ms)) => query
            .bind(super::lease::BROKER)
            .bind(holder.to_owned())
            .bind(now_ms),
        None => query,
    };
    let done = query.execute(&mut *conn).await?;
    if done.rows_affected() == 1 {
        r.version += 1;
        r.updated_at = now;
        Ok(true)
    } else {
        Ok(false)
    }
}
