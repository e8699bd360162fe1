//! The `observations` table: what nodes report through ingest (handshakes, traffic, errors),
//! the newest [`KEEP_PER_NODE`] per node, for the operator; and the per-node count of the
//! observations a node dropped before it could send them (`nodes.observations_dropped`).
//!
//! A node's observations are numbered by `nodes.observations_seq`, bumped in the batch's own
//! transaction: numbers are gapless per node, so the newest 500 are exactly the seqs above
//! `last - 500` and the bound is a range delete on the primary key (portable, and cheaper than
//! `NOT IN (SELECT ... ORDER BY ... LIMIT 500)`).

use plexsphere_wire::node::{IngestBatch, Observation, ObservationKind};
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::{Store, StoreError, parse_col, retry};

/// The most observations kept per node; older ones are deleted as new ones arrive.
pub(crate) const KEEP_PER_NODE: usize = 500;

/// An observation's kind, as stored in `observations.kind` and named in `?kind=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Handshake,
    Traffic,
    Error,
}

impl Kind {
    pub(crate) const ALL: [Kind; 3] = [Kind::Handshake, Kind::Traffic, Kind::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Handshake => "handshake",
            Kind::Traffic => "traffic",
            Kind::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    pub(crate) fn of(kind: &ObservationKind) -> Self {
        match kind {
            ObservationKind::Handshake { .. } => Kind::Handshake,
            ObservationKind::Traffic { .. } => Kind::Traffic,
            ObservationKind::Error { .. } => Kind::Error,
        }
    }
}

/// One stored observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ObservationRow {
    pub seq: i64,
    /// Unix seconds, the server's clock.
    pub received_at: i64,
    pub observation: Observation,
}

/// Where a batch of `n` observations lands after the node's last seq `last`, keeping `keep`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    /// The node's last seq once the batch is stored; the batch's i-th observation gets
    /// `new_last - n + 1 + i`.
    pub new_last: i64,
    /// The batch's oldest observations that would be deleted at once: not inserted at all.
    pub skip: usize,
    /// Rows with a seq at or below this are deleted.
    pub delete_through: i64,
}

/// Pure: the seqs of a batch and what the bound deletes.
pub(crate) fn place(last: i64, n: usize, keep: usize) -> Placement {
    let new_last = last.saturating_add(i64::try_from(n).unwrap_or(i64::MAX));
    Placement {
        new_last,
        skip: n.saturating_sub(keep),
        delete_through: new_last.saturating_sub(i64::try_from(keep).unwrap_or(i64::MAX)),
    }
}

fn sat_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// What became of an ingest batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recorded {
    Stored,
    /// The node's last stored batch, sent again because its answer was lost: not stored twice.
    Duplicate,
    /// The node no longer exists.
    Gone,
}

/// Stores a batch in one transaction (retried whole when it loses a race): the observations,
/// the node's dropped count, the bound, and the batch's id as the node's last.
pub async fn record(
    store: &Store,
    node_id: Uuid,
    batch: &IngestBatch,
    received_at: i64,
) -> Result<Recorded, StoreError> {
    retry("ingest", StoreError::is_busy, || {
        record_attempt(store, node_id, batch, received_at)
    })
    .await
}

async fn record_attempt(
    store: &Store,
    node_id: Uuid,
    batch: &IngestBatch,
    received_at: i64,
) -> Result<Recorded, StoreError> {
    let mut tx = store.begin().await?;
    let n = batch.observations.len();
    let n_i64 = i64::try_from(n).unwrap_or(i64::MAX);
    // The write comes first: it locks the node's row, so two batches of one node serialize,
    // and a copy of a batch still being stored waits for it and then finds its id.
    let bumped = sqlx::query(
        "UPDATE nodes SET observations_seq = observations_seq + $1, last_ingest_batch = $3 \
         WHERE id = $2 AND (last_ingest_batch IS NULL OR last_ingest_batch <> $3)",
    )
    .bind(n_i64)
    .bind(node_id.to_string())
    .bind(batch.batch_id.to_string())
    .execute(&mut *tx)
    .await?;
    if bumped.rows_affected() != 1 {
        let exists = sqlx::query("SELECT id FROM nodes WHERE id = $1")
            .bind(node_id.to_string())
            .fetch_optional(&mut *tx)
            .await?
            .is_some();
        return Ok(if exists {
            Recorded::Duplicate
        } else {
            Recorded::Gone
        });
    }
    let row = sqlx::query("SELECT observations_seq, observations_dropped FROM nodes WHERE id = $1")
        .bind(node_id.to_string())
        .fetch_one(&mut *tx)
        .await?;
    let new_last: i64 = row.try_get("observations_seq")?;
    let dropped: i64 = row.try_get("observations_dropped")?;
    if batch.dropped > 0 {
        sqlx::query("UPDATE nodes SET observations_dropped = $1 WHERE id = $2")
            .bind(dropped.saturating_add(sat_i64(batch.dropped)))
            .bind(node_id.to_string())
            .execute(&mut *tx)
            .await?;
    }
    let last = new_last.saturating_sub(n_i64);
    let p = place(last, n, KEEP_PER_NODE);
    for (i, o) in batch.observations.iter().enumerate().skip(p.skip) {
        let seq = last.saturating_add(i64::try_from(i).unwrap_or(i64::MAX)) + 1;
        insert(&mut tx, node_id, seq, received_at, o).await?;
    }
    sqlx::query("DELETE FROM observations WHERE node_id = $1 AND seq <= $2")
        .bind(node_id.to_string())
        .bind(p.delete_through)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Recorded::Stored)
}

async fn insert(
    conn: &mut AnyConnection,
    node_id: Uuid,
    seq: i64,
    received_at: i64,
    o: &Observation,
) -> Result<(), StoreError> {
    let (peer, endpoint, rx, tx, message) = match &o.kind {
        ObservationKind::Handshake {
            peer_node_id,
            endpoint,
        } => (
            Some(peer_node_id.to_string()),
            endpoint.map(|e| e.to_string()),
            None,
            None,
            None,
        ),
        ObservationKind::Traffic {
            peer_node_id,
            rx_bytes,
            tx_bytes,
        } => (
            Some(peer_node_id.to_string()),
            None,
            Some(sat_i64(*rx_bytes)),
            Some(sat_i64(*tx_bytes)),
            None,
        ),
        ObservationKind::Error { message } => (None, None, None, None, Some(message.clone())),
    };
    sqlx::query(
        "INSERT INTO observations (node_id, seq, received_at, at, kind, peer_node_id, endpoint, rx_bytes, tx_bytes, message) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(node_id.to_string())
    .bind(seq)
    .bind(received_at)
    .bind(o.at)
    .bind(Kind::of(&o.kind).as_str())
    .bind(peer)
    .bind(endpoint)
    .bind(rx)
    .bind(tx)
    .bind(message)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

fn non_negative(what: &'static str, v: Option<i64>) -> Result<u64, StoreError> {
    let v = v.ok_or_else(|| StoreError::corrupt(what, "NULL"))?;
    u64::try_from(v).map_err(|_| StoreError::corrupt(what, v))
}

fn from_row(row: &sqlx::any::AnyRow) -> Result<ObservationRow, StoreError> {
    let kind: String = row.try_get("kind")?;
    let peer = || -> Result<Uuid, StoreError> {
        let p: Option<String> = row.try_get("peer_node_id")?;
        let p = p.ok_or_else(|| StoreError::corrupt("observations.peer_node_id", "NULL"))?;
        parse_col("observations.peer_node_id", &p)
    };
    let kind = match Kind::parse(&kind) {
        Some(Kind::Handshake) => ObservationKind::Handshake {
            peer_node_id: peer()?,
            endpoint: row
                .try_get::<Option<String>, _>("endpoint")?
                .map(|e| parse_col("observations.endpoint", &e))
                .transpose()?,
        },
        Some(Kind::Traffic) => ObservationKind::Traffic {
            peer_node_id: peer()?,
            rx_bytes: non_negative("observations.rx_bytes", row.try_get("rx_bytes")?)?,
            tx_bytes: non_negative("observations.tx_bytes", row.try_get("tx_bytes")?)?,
        },
        Some(Kind::Error) => ObservationKind::Error {
            message: row
                .try_get::<Option<String>, _>("message")?
                .ok_or_else(|| StoreError::corrupt("observations.message", "NULL"))?,
        },
        None => return Err(StoreError::corrupt("observations.kind", kind)),
    };
    Ok(ObservationRow {
        seq: row.try_get("seq")?,
        received_at: row.try_get("received_at")?,
        observation: Observation {
            at: row.try_get("at")?,
            kind,
        },
    })
}

/// The newest `limit` observations of a node, newest first, optionally of one kind.
pub async fn list(
    conn: &mut AnyConnection,
    node_id: Uuid,
    kind: Option<Kind>,
    limit: u32,
) -> Result<Vec<ObservationRow>, StoreError> {
    let of_kind = if kind.is_some() { " AND kind = $3" } else { "" };
    let sql = format!(
        "SELECT seq, received_at, at, kind, peer_node_id, endpoint, rx_bytes, tx_bytes, message \
         FROM observations WHERE node_id = $1{of_kind} ORDER BY seq DESC LIMIT $2"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(node_id.to_string())
        .bind(i64::from(limit));
    if let Some(k) = kind {
        query = query.bind(k.as_str());
    }
    let rows = query.fetch_all(&mut *conn).await?;
    rows.iter().map(from_row).collect()
}

/// How many observations the node said it dropped; `None` when there is no such node.
pub(crate) async fn dropped(
    conn: &mut AnyConnection,
    node_id: Uuid,
) -> Result<Option<u64>, StoreError> {
    let row = sqlx::query("SELECT observations_dropped FROM nodes WHERE id = $1")
        .bind(node_id.to_string())
        .fetch_optional(&mut *conn)
        .await?;
    row.map(|r| {
        non_negative(
            "nodes.observations_dropped",
            r.try_get("observations_dropped")?,
        )
    })
    .transpose()
}

/// Deletes every observation of a node (before the node itself is deleted).
pub(crate) async fn delete_for_node(
    conn: &mut AnyConnection,
    node_id: Uuid,
) -> Result<u64, StoreError> {
    let done = sqlx::query("DELETE FROM observations WHERE node_id = $1")
        .bind(node_id.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_follows_the_last_seq_and_the_bound_keeps_the_newest() {
        // 3 after 10: seqs 11..=13; nothing to delete while under the bound.
        assert_eq!(
            place(10, 3, 500),
            Placement {
                new_last: 13,
                skip: 0,
                delete_through: -487
            }
        );
        // Crossing the bound: 498 + 5 = 503, so seqs 1..=3 go.
        assert_eq!(place(498, 5, 500).delete_through, 3);
        // A batch larger than the bound: its oldest are never inserted.
        let p = place(0, 4096, 500);
        assert_eq!((p.new_last, p.skip, p.delete_through), (4096, 3596, 3596));
        // An empty batch changes nothing.
        assert_eq!(place(7, 0, 500).new_last, 7);
    }

    #[test]
    fn kinds_round_trip_their_names() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.as_str()), Some(k));
        }
        assert_eq!(Kind::parse("Handshake"), None);
        assert_eq!(Kind::parse(""), None);
    }
}
