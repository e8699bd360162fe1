//! The `domain_keys` table: each Domain's signing keys, sealed under the KEK (keys/seal.rs).
//! Creation is insert-if-absent on `(domain_id, generation)`: replicas racing to create the
//! same generation all read back the one row that won.

use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::{StoreError, parse_col};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredKey {
    pub domain_id: Uuid,
    /// 1 for a Domain's first key, one more for each rotation.
    pub generation: i64,
    /// The Ed25519 public key, standard base64.
    pub public_key: String,
    /// The seed sealed under the KEK (`v1:...`).
    pub sealed_seed: String,
    pub created_at: i64,
    /// Unix seconds from which this key signs (the end of a rotation's overlap).
    pub active_from: i64,
}

fn from_row(row: &sqlx::any::AnyRow) -> Result<StoredKey, StoreError> {
    Ok(StoredKey {
        domain_id: parse_col(
            "domain_keys.domain_id",
            &row.try_get::<String, _>("domain_id")?,
        )?,
        generation: row.try_get("generation")?,
        public_key: row.try_get("public_key")?,
        sealed_seed: row.try_get("sealed_seed")?,
        created_at: row.try_get("created_at")?,
        active_from: row.try_get("active_from")?,
    })
}

/// Every key of the Domain, oldest generation first.
pub async fn list(conn: &mut AnyConnection, domain_id: Uuid) -> Result<Vec<StoredKey>, StoreError> {
    let rows = sqlx::query(
        "SELECT domain_id, generation, public_key, sealed_seed, created_at, active_from \
         FROM domain_keys WHERE domain_id = $1 ORDER BY generation",
    )
    .bind(domain_id.to_string())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(from_row).collect()
}

/// Stores `key` unless its Domain already has that generation; true when this call stored it.
pub async fn insert_if_absent(
    conn: &mut AnyConnection,
    key: &StoredKey,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO domain_keys \
         (domain_id, generation, public_key, sealed_seed, created_at, active_from) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (domain_id, generation) DO NOTHING",
    )
    .bind(key.domain_id.to_string())
    .bind(key.generation)
    .bind(key.public_key.clone())
    .bind(key.sealed_seed.clone())
    .bind(key.created_at)
    .bind(key.active_from)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}
