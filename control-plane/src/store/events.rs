//! The `events` table (the replay window) and `domain_events` (each Domain's seq counter).
//!
//! A Domain's seq is handed out by an upsert of its counter row in the same transaction that
//! records the change, so seqs are gap-free, increase in commit order (the row lock holds a
//! second writer until the first commits) and need no database-specific auto-increment.
//! Readers therefore always see a prefix of the log: every seq up to the head they read.

use plexsphere_wire::node::EventKind;
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use super::{StoreError, parse_col};

/// Where a Domain's log stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Head {
    /// The newest seq handed out (0: no event yet). Also `NodeState::version`.
    pub seq: u64,
    /// Every event with a seq up to this one has been pruned.
    pub pruned_through: u64,
}

/// One stored event, as a stream replays it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EventRow {
    pub seq: u64,
    pub kind: EventKind,
}

fn to_u64(what: &'static str, v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::corrupt(what, v))
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Appends one event to the Domain's log and answers its seq. Call it inside the transaction
/// that makes the change; notify the bus only after that transaction committed.
pub async fn append(
    conn: &mut AnyConnection,
    domain_id: Uuid,
    target: Option<Uuid>,
    subject: Uuid,
    kind: &EventKind,
    now: i64,
) -> Result<u64, StoreError> {
    let row = sqlx::query(
        "INSERT INTO domain_events (domain_id, seq, pruned_through) VALUES ($1, 1, 0) \
         ON CONFLICT (domain_id) DO UPDATE SET seq = domain_events.seq + 1 RETURNING seq",
    )
    .bind(domain_id.to_string())
    .fetch_one(&mut *conn)
    .await?;
    let seq: i64 = row.try_get("seq")?;
    let json = serde_json::to_string(kind)
        .map_err(|e| StoreError::corrupt("events.kind (serializing)", e))?;
    sqlx::query(
        "INSERT INTO events (domain_id, seq, target_node_id, subject_node_id, kind, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(domain_id.to_string())
    .bind(seq)
    .bind(target.map(|t| t.to_string()))
    .bind(subject.to_string())
    .bind(json)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    to_u64("domain_events.seq", seq)
}

/// How far `plexsphere restore` moves every Domain's log ahead. A node refuses any state or
/// event at or below the newest one it applied (a replay must not roll it back), and the
/// backup is older than what the nodes saw: the log moves past anything the old server can
/// have handed out after the backup (2^32 changes per Domain), so the restored server's next
/// state is newer than all of it. Repeated restores still leave room for 2^31 of them.
pub(crate) const RESTORE_SEQ_GAP: u64 = 1 << 32;

/// Moves every Domain's log `gap` ahead (a Domain without events yet gets a log at `gap`), and
/// marks everything before as pruned, so that a stream resuming from any earlier seq is
/// resynced. Answers the number of Domains moved. Run it in one transaction.
pub(crate) async fn advance_for_restore(
    conn: &mut AnyConnection,
    gap: u64,
) -> Result<u64, StoreError> {
    let gap = to_i64(gap);
    sqlx::query(
        "INSERT INTO domain_events (domain_id, seq, pruned_through) \
         SELECT id, 0, 0 FROM domains WHERE id NOT IN (SELECT domain_id FROM domain_events)",
    )
    .execute(&mut *conn)
    .await?;
    let moved = sqlx::query("UPDATE domain_events SET seq = seq + $1, pruned_through = seq + $1")
        .bind(gap)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    Ok(moved)
}

/// The Domain's head (zeros when it never had an event).
pub async fn head(conn: &mut AnyConnection, domain_id: Uuid) -> Result<Head, StoreError> {
    let row = sqlx::query("SELECT seq, pruned_through FROM domain_events WHERE domain_id = $1")
        .bind(domain_id.to_string())
        .fetch_optional(&mut *conn)
        .await?;
    match row {
        None => Ok(Head::default()),
        Some(r) => Ok(Head {
            seq: to_u64("domain_events.seq", r.try_get("seq")?)?,
            pruned_through: to_u64("domain_events.pruned_through", r.try_get("pruned_through")?)?,
        }),
    }
}

/// Every Domain's newest seq (Domains without an event yet are left out): what a replica's
/// poller compares with what its bus announced (one small read of the counter table).
pub(crate) async fn heads(conn: &mut AnyConnection) -> Result<Vec<(Uuid, u64)>, StoreError> {
    let rows = sqlx::query("SELECT domain_id, seq FROM domain_events")
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|r| {
            let domain: String = r.try_get("domain_id")?;
            Ok((
                parse_col("domain_events.domain_id", &domain)?,
                to_u64("domain_events.seq", r.try_get("seq")?)?,
            ))
        })
        .collect()
}

/// Up to `limit` events after `after` that are addressed to `node_id`, oldest first.
pub(crate) async fn for_node(
    conn: &mut AnyConnection,
    domain_id: Uuid,
    node_id: Uuid,
    after: u64,
    limit: u32,
) -> Result<Vec<EventRow>, StoreError> {
    let rows = sqlx::query(
        "SELECT seq, kind FROM events WHERE domain_id = $1 AND seq > $2 \
         AND (target_node_id = $3 OR (target_node_id IS NULL AND subject_node_id <> $3)) \
         ORDER BY seq LIMIT $4",
    )
    .bind(domain_id.to_string())
    .bind(to_i64(after))
    .bind(node_id.to_string())
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            let text: String = r.try_get("kind")?;
            Ok(EventRow {
                seq: to_u64("events.seq", r.try_get("seq")?)?,
                kind: serde_json::from_str(&text)
                    .map_err(|e| StoreError::corrupt("events.kind", e))?,
            })
        })
        .collect()
}

/// One stored event with its addressing, as the Domain's fan-out reader holds it: every
/// stream of the Domain picks out its own with [`DomainEventRow::is_for`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainEventRow {
    pub seq: u64,
    /// The one node the event is for; `None`: every node of the Domain but the subject.
    pub target: Option<Uuid>,
    /// The node the event is about.
    pub subject: Uuid,
    pub kind: EventKind,
}

impl DomainEventRow {
    /// Whether `node_id` receives this event: the same rule as [`for_node`]'s SQL.
    pub fn is_for(&self, node_id: Uuid) -> bool {
        plexsphere_wire::domain_event::is_recipient(self.target, self.subject, node_id)
    }
}

/// Up to `limit` events of the Domain after `after`, for every node, oldest first: what the
/// Domain's one fan-out reader reads per wake-up, whatever the number of open streams.
pub async fn for_domain(
    conn: &mut AnyConnection,
    domain_id: Uuid,
    after: u64,
    limit: u32,
) -> Result<Vec<DomainEventRow>, StoreError> {
    let rows = sqlx::query(
        "SELECT seq, target_node_id, subject_node_id, kind FROM events \
         WHERE domain_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
    )
    .bind(domain_id.to_string())
    .bind(to_i64(after))
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            let target: Option<String> = r.try_get("target_node_id")?;
            let subject: String = r.try_get("subject_node_id")?;
            let text: String = r.try_get("kind")?;
            Ok(DomainEventRow {
                seq: to_u64("events.seq", r.try_get("seq")?)?,
                target: target
                    .map(|t| parse_col("events.target_node_id", &t))
                    .transpose()?,
                subject: parse_col("events.subject_node_id", &subject)?,
                kind: serde_json::from_str(&text)
                    .map_err(|e| StoreError::corrupt("events.kind", e))?,
            })
        })
        .collect()
}

/// Deletes every event created at or before `cutoff` (and, per Domain, every older seq), and
/// records how far each Domain's log was pruned. Answers how many events were deleted.
pub async fn prune(conn: &mut AnyConnection, cutoff: i64) -> Result<u64, StoreError> {
    let upto = sqlx::query(
        "SELECT domain_id, MAX(seq) AS upto FROM events WHERE created_at <= $1 GROUP BY domain_id",
    )
    .bind(cutoff)
    .fetch_all(&mut *conn)
    .await?;
    let mut deleted = 0;
    for row in &upto {
        let domain: String = row.try_get("domain_id")?;
        let _: Uuid = parse_col("events.domain_id", &domain)?;
        let seq: i64 = row.try_get("upto")?;
        deleted += sqlx::query("DELETE FROM events WHERE domain_id = $1 AND seq <= $2")
            .bind(domain.clone())
            .bind(seq)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        sqlx::query(
            "UPDATE domain_events SET pruned_through = $1 WHERE domain_id = $2 AND pruned_through < $1",
        )
        .bind(seq)
        .bind(domain)
        .execute(&mut *conn)
        .await?;
    }
    Ok(deleted)
}
