//! The `projects` table: a Project belongs to a Domain and may reserve a sub-range of its mesh.

use ipnet::IpNet;
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::{StoreError, parse_col};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Project {
    pub id: Uuid,
    pub domain_id: Uuid,
    pub slug: String,
    pub display_name: Option<String>,
    pub sub_range_cidr: Option<IpNet>,
    pub created_at: i64,
}

fn from_row(row: &sqlx::any::AnyRow) -> Result<Project, StoreError> {
    let sub: Option<String> = row.try_get("sub_range_cidr")?;
    Ok(Project {
        id: parse_col("projects.id", &row.try_get::<String, _>("id")?)?,
        domain_id: parse_col(
            "projects.domain_id",
            &row.try_get::<String, _>("domain_id")?,
        )?,
        slug: row.try_get("slug")?,
        display_name: row.try_get("display_name")?,
        sub_range_cidr: sub
            .map(|s| parse_col("projects.sub_range_cidr", &s))
            .transpose()?,
        created_at: row.try_get("created_at")?,
    })
}

pub async fn list(conn: &mut AnyConnection) -> Result<Vec<Project>, StoreError> {
    let rows = sqlx::query(
        "SELECT id, domain_id, slug, display_name, sub_range_cidr, created_at FROM projects ORDER BY slug, id",
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(from_row).collect()
}

pub(crate) async fn in_domain(
    conn: &mut AnyConnection,
    domain_id: Uuid,
) -> Result<Vec<Project>, StoreError> {
    let rows = sqlx::query(
        "SELECT id, domain_id, slug, display_name, sub_range_cidr, created_at FROM projects WHERE domain_id = $1 ORDER BY slug",
    )
    .bind(domain_id.to_string())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(from_row).collect()
}

pub async fn get(conn: &mut AnyConnection, id: Uuid) -> Result<Option<Project>, StoreError> {
    let row = sqlx::query(
        "SELECT id, domain_id, slug, display_name, sub_range_cidr, created_at FROM projects WHERE id = $1",
    )
    .bind(id.to_string())
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(from_row).transpose()
}

pub async fn insert(conn: &mut AnyConnection, p: &Project) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO projects (id, domain_id, slug, display_name, sub_range_cidr, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(p.id.to_string())
    .bind(p.domain_id.to_string())
    .bind(p.slug.clone())
    .bind(p.display_name.clone())
    .bind(p.sub_range_cidr.map(|c| c.to_string()))
    .bind(p.created_at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Changes the mutable fields of a Project (display name, sub-range).
pub async fn update(conn: &mut AnyConnection, p: &Project) -> Result<(), StoreError> {
    sqlx::query("UPDATE projects SET display_name = $1, sub_range_cidr = $2 WHERE id = $3")
        .bind(p.display_name.clone())
        .bind(p.sub_range_cidr.map(|c| c.to_string()))
        .bind(p.id.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(())
}
