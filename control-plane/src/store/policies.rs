//! The `policies` table (schema version 17): every version of every Domain's access policy
//! document, append-only, and the Domain's inventory as the policy compiler sees it.
//!
//! How a Domain gets its first document: every Domain always has a current version. The
//! migration stored version 1 = [`DEFAULT_DOCUMENT`] (the explicit allow-all) for every
//! Domain that existed, and [`insert_default`] stores the same version 1 for every Domain
//! plexsphere creates (`crate::seed`), in the transaction that creates it. So [`current`]
//! is `Some` for every Domain plexsphere made. A Domain without a row (one a tool wrote into
//! the database directly) runs [`DEFAULT_DOCUMENT`] as version 0 ([`current_or_default`]);
//! the first change stores version 1 for it.
//!
//! Writers race safely: [`insert`] stores `expected_version + 1` only when the current
//! version is still `expected_version` (what the writer read and validated against), and
//! the primary key `(domain_id, version)` refuses the second of two writers that both saw
//! the same version. The loser gets [`Inserted::Conflict`] (or a unique violation, which
//! means the same) and must re-read and re-run.

use plexsphere_policy::document::DEFAULT_DOCUMENT;
use plexsphere_policy::inventory::{Inventory, NodeInfo, ProjectInfo};
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::{StoreError, parse_col};

/// Who stored the default document.
pub const DEFAULT_AUTHOR: &str = "plexsphere";
/// The summary of the default document's version.
pub const DEFAULT_SUMMARY: &str =
    "the default document: every node may reach every node on every protocol and port";
/// The most versions one history page lists (`?limit=` larger is refused).
pub(crate) const MAX_HISTORY_PAGE: u32 = 100;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRow {
    pub domain_id: Uuid,
    pub version: u64,
    pub document: String,
    /// Who stored it: an operator token's name and id, or [`DEFAULT_AUTHOR`].
    pub author: String,
    pub created_at: i64,
    /// The reachability diff against the version before it, as it read when stored.
    pub summary: String,
}

impl PolicyRow {
    /// What a Domain without a stored version runs: the default document as version 0.
    pub(crate) fn implicit_default(domain_id: Uuid) -> Self {
        PolicyRow {
            domain_id,
            version: 0,
            document: DEFAULT_DOCUMENT.to_owned(),
            author: DEFAULT_AUTHOR.to_owned(),
            created_at: 0,
            summary: DEFAULT_SUMMARY.to_owned(),
        }
    }
}

const COLUMNS: &str = "domain_id, version, document, author, created_at, summary";

fn from_row(row: &sqlx::any::AnyRow) -> Result<PolicyRow, StoreError> {
    let version: i64 = row.try_get("version")?;
    Ok(PolicyRow {
        domain_id: parse_col(
            "policies.domain_id",
            &row.try_get::<String, _>("domain_id")?,
        )?,
        version: u64::try_from(version)
            .map_err(|_| StoreError::corrupt("policies.version", version))?,
        document: row.try_get("document")?,
        author: row.try_get("author")?,
        created_at: row.try_get("created_at")?,
        summary: row.try_get("summary")?,
    })
}

fn sql_version(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::corrupt("policies.version", v))
}

/// The Domain's current (newest) version; `None` when nothing is stored (see the module doc).
pub async fn current(
    conn: &mut AnyConnection,
    domain_id: Uuid,
) -> Result<Option<PolicyRow>, StoreError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM policies WHERE domain_id = $1 ORDER BY version DESC LIMIT 1"
    ));
    let row = sqlx::query(sql)
        .bind(domain_id.to_string())
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(from_row).transpose()
}

/// [`current`], or the default document as version 0 when nothing is stored.
pub async fn current_or_default(
    conn: &mut AnyConnection,
    domain_id: Uuid,
) -> Result<PolicyRow, StoreError> {
    Ok(current(conn, domain_id)
        .await?
        .unwrap_or_else(|| PolicyRow::implicit_default(domain_id)))
}

/// One stored version.
pub async fn get(
    conn: &mut AnyConnection,
    domain_id: Uuid,
    version: u64,
) -> Result<Option<PolicyRow>, StoreError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM policies WHERE domain_id = $1 AND version = $2"
    ));
    let row = sqlx::query(sql)
        .bind(domain_id.to_string())
        .bind(sql_version(version)?)
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(from_row).transpose()
}

/// Up to `limit` versions (at most [`MAX_HISTORY_PAGE`]), newest first, older than
/// `before` when given (the next page starts below the last version of this one).
pub async fn history(
    conn: &mut AnyConnection,
    domain_id: Uuid,
    limit: u32,
    before: Option<u64>,
) -> Result<Vec<PolicyRow>, StoreError> {
    let limit = i64::from(limit.min(MAX_HISTORY_PAGE));
    let before = match before {
        Some(v) => sql_version(v)?,
        None => i64::MAX,
    };
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM policies WHERE domain_id = $1 AND version < $2 ORDER BY version DESC LIMIT $3"
    ));
    let rows = sqlx::query(sql)
        .bind(domain_id.to_string())
        .bind(before)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(from_row).collect()
}

/// A new version to store.
#[derive(Debug, Clone, Copy)]
pub struct NewVersion<'a> {
    pub document: &'a str,
    pub author: &'a str,
    pub summary: &'a str,
    pub now: i64,
}

/// What [`insert`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inserted {
    /// Stored as this row (version = the expected version + 1).
    Stored(PolicyRow),
    /// The current version is no longer the one the writer read: nothing stored.
    Conflict { current: u64 },
}

/// Stores `new` as version `expected_version + 1` if the Domain's current version is still
/// `expected_version` (0 = nothing stored). Run it in the transaction that also appends
/// the Domain's Resync event. A writer racing past the check loses on the primary key: the
/// caller sees a unique violation ([`StoreError::is_unique_violation`]) and answers it as
/// a conflict too.
pub async fn insert(
    conn: &mut AnyConnection,
    domain_id: Uuid,
    expected_version: u64,
    new: NewVersion<'_>,
) -> Result<Inserted, StoreError> {
    let now_version = current(conn, domain_id).await?.map_or(0, |r| r.version);
    if now_version != expected_version {
        return Ok(Inserted::Conflict {
            current: now_version,
        });
    }
    let row = PolicyRow {
        domain_id,
        version: expected_version
            .checked_add(1)
            .ok_or_else(|| StoreError::corrupt("policies.version", expected_version))?,
        document: new.document.to_owned(),
        author: new.author.to_owned(),
        created_at: new.now,
        summary: new.summary.to_owned(),
    };
    write(conn, &row).await?;
    Ok(Inserted::Stored(row))
}

async fn write(conn: &mut AnyConnection, row: &PolicyRow) -> Result<(), StoreError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "INSERT INTO policies ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"
    ));
    sqlx::query(sql)
        .bind(row.domain_id.to_string())
        .bind(sql_version(row.version)?)
        .bind(row.document.clone())
        .bind(row.author.clone())
        .bind(row.created_at)
        .bind(row.summary.clone())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The schema version that made the `policies` table.
pub(crate) const POLICIES_SCHEMA_VERSION: i64 = 17;

/// Stores version 1 = [`DEFAULT_DOCUMENT`] for a Domain just created (in its transaction).
/// On a database not yet at schema version 17 (only tests seed one) it stores nothing: the
/// migration to version 17 stores the default for every Domain it finds.
pub(crate) async fn insert_default(
    conn: &mut AnyConnection,
    domain_id: Uuid,
    now: i64,
) -> Result<(), StoreError> {
    let schema: Option<i64> = sqlx::query("SELECT MAX(version) AS v FROM _sqlx_migrations")
        .fetch_one(&mut *conn)
        .await?
        .try_get("v")?;
    if schema.unwrap_or(0) < POLICIES_SCHEMA_VERSION {
        return Ok(());
    }
    let mut row = PolicyRow::implicit_default(domain_id);
    row.version = 1;
    row.created_at = now;
    write(conn, &row).await
}

/// The Domain as the policy compiler sees it: its Projects (with slugs), its live nodes (id,
/// hostname as the name, Project, tags, mesh IPv4/IPv6), and the tags of its bootstrap
/// tokens that can still make a node at `now` (unexpired, not revoked, uses left), so a
/// document may name a tag before the first node carrying it registers. Three queries,
/// whatever the Domain's size.
pub async fn inventory(
    conn: &mut AnyConnection,
    domain_id: Uuid,
    now: i64,
) -> Result<Inventory, StoreError> {
    let projects = super::projects::in_domain(conn, domain_id).await?;
    let slug = |id: Uuid| {
        projects
            .iter()
            .find(|p| p.id == id)
            .map_or_else(|| id.to_string(), |p| p.slug.clone())
    };
    let nodes = super::nodes::live_in_domain(conn, domain_id)
        .await?
        .into_iter()
        .map(|n| NodeInfo {
            id: n.id,
            name: n.hostname.clone(),
            project_id: n.project_id,
            project_slug: slug(n.project_id),
            ipv4: match n.mesh_ip {
                std::net::IpAddr::V4(a) => Some(a),
                std::net::IpAddr::V6(_) => None,
            },
            ipv6: match n.mesh_ip {
                std::net::IpAddr::V6(a) => Some(a),
                std::net::IpAddr::V4(_) => None,
            },
            tags: n.tags,
        })
        .collect();
    let rows = sqlx::query(
        "SELECT t.tags FROM bootstrap_tokens t JOIN projects p ON p.id = t.project_id \
         WHERE p.domain_id = $1 AND t.tags <> '' AND t.revoked_at IS NULL \
         AND t.expires_at > $2 AND t.uses < t.max_uses",
    )
    .bind(domain_id.to_string())
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    let mut tags = Vec::new();
    for row in &rows {
        tags.extend(crate::tags::split(&row.try_get::<String, _>("tags")?));
    }
    tags.sort();
    tags.dedup();
    Ok(Inventory {
        projects: projects
            .iter()
            .map(|p| ProjectInfo {
                id: p.id,
                slug: p.slug.clone(),
            })
            .collect(),
        nodes,
        tags,
    })
}
