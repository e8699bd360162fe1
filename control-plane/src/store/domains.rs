//! The `domains` table: a Domain owns a mesh range and signing keys (`domain_keys.rs`).

use ipnet::IpNet;
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::{StoreError, parse_col};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    pub id: Uuid,
    pub slug: String,
    pub mesh_cidr: IpNet,
    pub created_at: i64,
}

fn from_row(row: &sqlx::any::AnyRow) -> Result<Domain, StoreError> {
    Ok(Domain {
        id: parse_col("domains.id", &row.try_get::<String, _>("id")?)?,
        slug: row.try_get("slug")?,
        mesh_cidr: parse_col("domains.mesh_cidr", &row.try_get::<String, _>("mesh_cidr")?)?,
        created_at: row.try_get("created_at")?,
    })
}

pub async fn list(conn: &mut AnyConnection) -> Result<Vec<Domain>, StoreError> {
    let rows = sqlx::query("SELECT id, slug, mesh_cidr, created_at FROM domains ORDER BY slug")
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(from_row).collect()
}

pub async fn get(conn: &mut AnyConnection, id: Uuid) -> Result<Option<Domain>, StoreError> {
    let row = sqlx::query("SELECT id, slug, mesh_cidr, created_at FROM domains WHERE id = $1")
        .bind(id.to_string())
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(from_row).transpose()
}

pub async fn by_slug(conn: &mut AnyConnection, slug: &str) -> Result<Option<Domain>, StoreError> {
    let row = sqlx::query("SELECT id, slug, mesh_cidr, created_at FROM domains WHERE slug = $1")
        .bind(slug.to_owned())
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(from_row).transpose()
}

pub async fn insert(conn: &mut AnyConnection, d: &Domain) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO domains (id, slug, mesh_cidr, created_at) VALUES ($1, $2, $3, $4)")
        .bind(d.id.to_string())
        .bind(d.slug.clone())
        .bind(d.mesh_cidr.to_string())
        .bind(d.created_at)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Whether any node (live or revoked) ever registered in the Domain: such a Domain's key is
/// trusted by nodes and is never made anew.
pub(crate) async fn has_nodes(conn: &mut AnyConnection, id: Uuid) -> Result<bool, StoreError> {
    let row = sqlx::query("SELECT COUNT(*) AS n FROM nodes WHERE domain_id = $1")
        .bind(id.to_string())
        .fetch_one(&mut *conn)
        .await?;
    Ok(row.try_get::<i64, _>("n")? > 0)
}
