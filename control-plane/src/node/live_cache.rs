//! The live node rows of a Domain as of one event seq, read once and shared by every state
//! build that read the same head (a policy change, a tag change or a key rotation's `resync`
//! makes every node of the Domain pull its state at once: without this each pull read every
//! row of the Domain, N^2 row reads per storm; docs/benchmarks.md section 10).
//!
//! Why the head is a valid key: every change of what a state shows of a peer (its key,
//! endpoints, home relay, name, tags, Project, its joining or leaving) appends an event in
//! the transaction that makes it (`ops.rs`' module doc), so two reads after the same head
//! see the same peers. The rows are read after the head, so they include every change up to
//! it (a newer one only repeats a delta, as before). The node's own row is not taken from
//! here (`signed_state` reads it itself).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use crate::store::StoreError;
use crate::store::nodes::{self, NodeRow};

type Snapshot = (u64, Arc<Vec<NodeRow>>);

#[derive(Default)]
struct Slot {
    snapshot: Mutex<Option<Snapshot>>,
    /// Held by the one caller reading the rows for this Domain.
    loading: tokio::sync::Mutex<()>,
}

/// The live rows of each Domain at the newest head a state build read.
#[derive(Default)]
pub struct LiveCache {
    slots: Mutex<HashMap<Uuid, Arc<Slot>>>,
}

impl LiveCache {
    fn slot(&self, domain_id: Uuid) -> Arc<Slot> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.entry(domain_id).or_default().clone()
    }

    fn at(slot: &Slot, head: u64) -> Option<Arc<Vec<NodeRow>>> {
        let snap = slot.snapshot.lock().unwrap_or_else(|p| p.into_inner());
        snap.as_ref()
            .filter(|(h, _)| *h == head)
            .map(|(_, rows)| rows.clone())
    }

    /// The Domain's live rows as of `head` (read by the caller just before): the shared
    /// snapshot when one was read at the same head, else one read for every caller asking
    /// at once.
    pub(crate) async fn live(
        &self,
        conn: &mut sqlx::AnyConnection,
        domain_id: Uuid,
        head: u64,
    ) -> Result<Arc<Vec<NodeRow>>, StoreError> {
        let slot = self.slot(domain_id);
        if let Some(rows) = Self::at(&slot, head) {
            return Ok(rows);
        }
        let _loading = slot.loading.lock().await;
        if let Some(rows) = Self::at(&slot, head) {
            return Ok(rows);
        }
        let rows = Arc::new(nodes::live_in_domain(conn, domain_id).await?);
        let mut snap = slot.snapshot.lock().unwrap_or_else(|p| p.into_inner());
        if snap.as_ref().is_none_or(|(h, _)| head >= *h) {
            *snap = Some((head, rows.clone()));
        }
        Ok(rows)
    }
}
