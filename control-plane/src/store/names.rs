//! DNS names (issue 27, schema version 18): a node's label, unique among the live nodes of
//! its Domain (`nodes.dns_name`, the partial unique index `nodes_live_dns_name`), and each
//! Domain's suffix (`domains.dns_suffix`). A registering node gets its host name's label
//! ([`label_from_hostname`]) made unique with `-2`, `-3`, ... ([`unique_label`]); an operator
//! renames with `PUT /v1/nodes/{id}/name`; a revoked node frees its name.

use std::collections::HashSet;

use plexsphere_wire::routes::{DEFAULT_DNS_SUFFIX, MAX_LABEL_LEN, label_from_hostname};
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::error::{StoreError, parse_col};

/// `base`, or `base-N` for the smallest N >= 2 that `taken` does not hold; `base` is cut so
/// the label stays within [`MAX_LABEL_LEN`] (and loses a `-` the cut leaves at its end).
pub(crate) fn unique_label(base: &str, taken: &HashSet<String>) -> String {
    if !taken.contains(base) {
        return base.to_owned();
    }
    let mut n: u64 = 2;
    loop {
        let tail = format!("-{n}");
        let keep = MAX_LABEL_LEN.saturating_sub(tail.len()).min(base.len());
        let head = base[..keep].trim_end_matches('-');
        let head = if head.is_empty() { "node" } else { head };
        let candidate = format!("{head}{tail}");
        if !taken.contains(&candidate) {
            return candidate;
        }
        n += 1;
    }
}

/// The names live nodes of `domain` (other than `except`) hold that start with `base`'s
/// first characters: all [`unique_label`] needs to know.
async fn taken_like(
    conn: &mut AnyConnection,
    domain: Uuid,
    base: &str,
    except: Option<Uuid>,
) -> Result<HashSet<String>, StoreError> {
    // Any candidate starts with at least the first few characters of `base` (cut from the
    // end only), so a prefix match finds every clash; the label alphabet has no LIKE
    // wildcard (`%`, `_`).
    let prefix: String = base.chars().take(8).collect();
    let rows = sqlx::query(
        "SELECT dns_name FROM nodes WHERE domain_id = $1 AND revoked_at IS NULL \
         AND dns_name IS NOT NULL AND id <> $2 AND dns_name LIKE $3",
    )
    .bind(domain.to_string())
    .bind(except.map_or_else(String::new, |e| e.to_string()))
    .bind(format!("{prefix}%"))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| r.try_get::<String, _>("dns_name").map_err(StoreError::from))
        .collect()
}

/// A free label for a node of `domain` from its host name.
pub(crate) async fn pick_for_hostname(
    conn: &mut AnyConnection,
    domain: Uuid,
    hostname: &str,
) -> Result<String, StoreError> {
    let base = label_from_hostname(hostname);
    let taken = taken_like(conn, domain, &base, None).await?;
    Ok(unique_label(&base, &taken))
}

/// The live node of `domain` other than `except` that holds `name`, if any.
pub(crate) async fn holder(
    conn: &mut AnyConnection,
    domain: Uuid,
    name: &str,
    except: Uuid,
) -> Result<Option<Uuid>, StoreError> {
    let row = sqlx::query(
        "SELECT id FROM nodes WHERE domain_id = $1 AND revoked_at IS NULL AND dns_name = $2 AND id <> $3",
    )
    .bind(domain.to_string())
    .bind(name.to_owned())
    .bind(except.to_string())
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|r| parse_col("nodes.id", &r.try_get::<String, _>("id")?))
        .transpose()
}

/// Sets a live node's label (checked by the caller); answers whether the node is live.
pub(crate) async fn set_name(
    conn: &mut AnyConnection,
    id: Uuid,
    name: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query("UPDATE nodes SET dns_name = $1 WHERE id = $2 AND revoked_at IS NULL")
        .bind(name.to_owned())
        .bind(id.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// The Domain's DNS suffix ([`DEFAULT_DNS_SUFFIX`] for a Domain the store does not know).
pub(crate) async fn suffix(conn: &mut AnyConnection, domain: Uuid) -> Result<String, StoreError> {
    let row = sqlx::query("SELECT dns_suffix FROM domains WHERE id = $1")
        .bind(domain.to_string())
        .fetch_optional(&mut *conn)
        .await?;
    match row {
        Some(r) => Ok(r.try_get("dns_suffix")?),
        None => Ok(DEFAULT_DNS_SUFFIX.to_owned()),
    }
}

/// Sets the Domain's DNS suffix (checked by the caller); answers whether the Domain exists.
pub(crate) async fn set_suffix(
    conn: &mut AnyConnection,
    domain: Uuid,
    suffix: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query("UPDATE domains SET dns_suffix = $1 WHERE id = $2")
        .bind(suffix.to_owned())
        .bind(domain.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Names the live nodes that have no name yet (registered before schema version 18), oldest
/// first, each from its resource handle (a broker machine) or else its host name, made
/// unique (what `plexctl` showed as NAME before). Idempotent; runs after every migration.
pub(crate) async fn backfill(conn: &mut AnyConnection) -> Result<usize, StoreError> {
    let rows = sqlx::query(
        "SELECT id, domain_id, hostname, resource_handle FROM nodes WHERE dns_name IS NULL AND revoked_at IS NULL \
         ORDER BY registered_at, id",
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut named = 0;
    for r in &rows {
        let id: Uuid = parse_col("nodes.id", &r.try_get::<String, _>("id")?)?;
        let domain: Uuid = parse_col("nodes.domain_id", &r.try_get::<String, _>("domain_id")?)?;
        let hostname: String = r.try_get("hostname")?;
        let handle: Option<String> = r.try_get("resource_handle")?;
        let source = handle.as_deref().unwrap_or(&hostname);
        let name = pick_for_hostname(conn, domain, source).await?;
        let done = sqlx::query("UPDATE nodes SET dns_name = $1 WHERE id = $2 AND dns_name IS NULL")
            .bind(name)
            .bind(id.to_string())
            .execute(&mut *conn)
            .await?;
        named += usize::try_from(done.rows_affected()).unwrap_or(0);
    }
    Ok(named)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> HashSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn labels_are_made_unique_with_a_counter_and_stay_within_63() {
        assert_eq!(unique_label("web", &set(&[])), "web");
        assert_eq!(unique_label("web", &set(&["web"])), "web-2");
        assert_eq!(unique_label("web", &set(&["web", "web-2"])), "web-3");
        let long = "a".repeat(63);
        let got = unique_label(&long, &set(&[long.as_str()]));
        assert_eq!(got.len(), 63);
        assert!(got.ends_with("-2"));
        // A cut that leaves a '-' at the end drops it.
        let dashy = format!("{}-b", "a".repeat(60));
        let got = unique_label(&dashy, &set(&[dashy.as_str()]));
        assert_eq!(got, format!("{}-2", "a".repeat(60)));
        assert!(plexsphere_wire::routes::check_label(&got).is_ok());
    }
}
