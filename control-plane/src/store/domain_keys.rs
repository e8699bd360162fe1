//! The `domain_keys` table: each Domain's signing keys, sealed under the KEK (keys/seal.rs).
//! Creation is insert-if-absent on `(domain_id, generation)`: replicas racing to create the
//! same generation all read back the one row that won (a rotation's loser answers 409).

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
    /// The JSON of the `KeyTransition` the previous generation signed for this one (schema
    /// version 15); `None` for generation 1.
    pub transition: Option<String>,
    /// When the Domain's nodes were told that this key now signs; `None` until then.
    pub activated_at: Option<i64>,
}

/// The columns every key SELECT reads, then `$tail`.
macro_rules! select_keys {
    ($tail:literal) => {
        concat!(
            "SELECT domain_id, generation, public_key, sealed_seed, created_at, active_from, \
             transition, activated_at FROM domain_keys ",
            $tail
        )
    };
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
        transition: row.try_get("transition")?,
        activated_at: row.try_get("activated_at")?,
    })
}

/// Every key of the Domain, oldest generation first.
pub async fn list(conn: &mut AnyConnection, domain_id: Uuid) -> Result<Vec<StoredKey>, StoreError> {
    let rows = sqlx::query(select_keys!("WHERE domain_id = $1 ORDER BY generation"))
        .bind(domain_id.to_string())
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(from_row).collect()
}

/// Every key of every Domain (what a KEK rotation re-seals), by Domain and generation.
pub(crate) async fn list_all(conn: &mut AnyConnection) -> Result<Vec<StoredKey>, StoreError> {
    let rows = sqlx::query(select_keys!("ORDER BY domain_id, generation"))
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(from_row).collect()
}

/// Stores `key` unless its Domain already has that generation; true when this call stored it.
pub(crate) async fn insert_if_absent(
    conn: &mut AnyConnection,
    key: &StoredKey,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO domain_keys \
         (domain_id, generation, public_key, sealed_seed, created_at, active_from, transition, activated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (domain_id, generation) DO NOTHING",
    )
    .bind(key.domain_id.to_string())
    .bind(key.generation)
    .bind(key.public_key.clone())
    .bind(key.sealed_seed.clone())
    .bind(key.created_at)
    .bind(key.active_from)
    .bind(key.transition.clone())
    .bind(key.activated_at)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The keys after the first whose `active_from` is at or before `now` and whose nodes were
/// not told yet: `(domain_id, generation)`.
pub(crate) async fn due_activation(
    conn: &mut AnyConnection,
    now: i64,
) -> Result<Vec<(Uuid, i64)>, StoreError> {
    let rows = sqlx::query(
        "SELECT domain_id, generation FROM domain_keys \
         WHERE generation > 1 AND active_from <= $1 AND activated_at IS NULL \
         ORDER BY domain_id, generation",
    )
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok((
                parse_col(
                    "domain_keys.domain_id",
                    &r.try_get::<String, _>("domain_id")?,
                )?,
                r.try_get("generation")?,
            ))
        })
        .collect()
}

/// Marks the key as announced active at `now`, unless it already was; true when this call
/// marked it (so one replica alone tells the nodes).
pub(crate) async fn mark_activated(
    conn: &mut AnyConnection,
    domain_id: Uuid,
    generation: i64,
    now: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE domain_keys SET activated_at = $3 \
         WHERE domain_id = $1 AND generation = $2 AND activated_at IS NULL",
    )
    .bind(domain_id.to_string())
    .bind(generation)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Replaces the sealed seed of one key (a KEK rotation), only if it still holds `before`;
/// true when this call replaced it.
pub(crate) async fn reseal(
    conn: &mut AnyConnection,
    key: &StoredKey,
    sealed_seed: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE domain_keys SET sealed_seed = $3 \
         WHERE domain_id = $1 AND generation = $2 AND sealed_seed = $4",
    )
    .bind(key.domain_id.to_string())
    .bind(key.generation)
    .bind(sealed_seed.to_owned())
    .bind(key.sealed_seed.clone())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}
