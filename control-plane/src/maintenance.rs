//! The periodic task: prunes events older than the replay window, removes ephemeral nodes
//! offline past their allowance, logs nodes going offline (or coming back) as the
//! operator's journal should show them, and tells a Domain's nodes when a rotated signing key
//! starts to sign, if the replica that rotated it did not (`keys::rotate::announce_due`).
//!
//! Only the replica that holds the broker lease runs a round (`crate::leader`): one journal of
//! node status changes, one pruner. Each step would still be safe twice (a paused old leader
//! that acts once more): pruning is an idempotent transaction, and removing an ephemeral node
//! re-checks the row in its transaction (one replica deletes, the others find it gone).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use plexsphere_wire::admin::NodeStatus;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::Error;
use crate::node::ops::NodeOps;
use crate::store::nodes::NodeRow;
use crate::store::{self, Store, StoreError, events, nodes};
use crate::views::node_status;

/// When the task runs and what it keeps, in seconds as the store counts them.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// How often a round runs.
    pub every: Duration,
    /// Events stay replayable at least this long.
    pub retention: Duration,
    /// A node is offline once its last authenticated call is older than this.
    pub offline_after_secs: i64,
}

/// What the task works with, from the server it runs in: the store, the node operations (to
/// remove ephemeral nodes as nodes are removed), the clock and its schedule. The HTTP state
/// implements it; this task never sees the HTTP state itself.
pub trait MaintenanceHost: Send + Sync {
    fn store(&self) -> &Store;
    fn node_ops(&self) -> NodeOps<'_>;
    fn now(&self) -> OffsetDateTime;
    fn schedule(&self) -> Schedule;
    /// Whether this replica leads (holds the broker lease): only the leader runs a round.
    fn leadership(&self) -> &crate::leader::Leadership;
}

impl<T: MaintenanceHost + ?Sized> MaintenanceHost for Arc<T> {
    fn store(&self) -> &Store {
        (**self).store()
    }
    fn node_ops(&self) -> NodeOps<'_> {
        (**self).node_ops()
    }
    fn now(&self) -> OffsetDateTime {
        (**self).now()
    }
    fn schedule(&self) -> Schedule {
        (**self).schedule()
    }
    fn leadership(&self) -> &crate::leader::Leadership {
        (**self).leadership()
    }
}

/// Starts the task; it stops by itself once the state is gone (the server stopped).
/// The route sweep (`routes::admin::ROUTE_SWEEP_SECS`) runs beside it, on its own task.
pub fn spawn<S: MaintenanceHost + 'static>(state: &Arc<S>) -> tokio::task::JoinHandle<()> {
    spawn_route_sweep(state);
    let weak: Weak<S> = Arc::downgrade(state);
    let every = state.schedule().every;
    tokio::spawn(async move {
        let mut known: HashMap<Uuid, NodeStatus> = HashMap::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(st) = weak.upgrade() else { return };
            if st.leadership().acting(std::time::Instant::now()).is_none() {
                // A follower: the leader logs the transitions; start afresh when leading.
                known.clear();
                continue;
            }
            if let Err(e) = prune(&*st).await {
                tracing::warn!(error = %e, "cannot prune the event log; retrying at the next round");
            }
            if let Err(e) = expire_ephemeral(&*st).await {
                tracing::warn!(error = %e, "cannot remove offline ephemeral nodes; retrying at the next round");
            }
            if let Err(e) = sweep(&*st, &mut known).await {
                tracing::warn!(error = %e, "cannot sweep node status; retrying at the next round");
            }
            let ops = st.node_ops();
            if let Err(e) = crate::keys::rotate::announce_due(ops.store, ops.bus).await {
                tracing::warn!(error = %e, "cannot announce a Domain's new signing key; retrying at the next round");
            }
        }
    })
}

/// Every [`crate::routes::admin::ROUTE_SWEEP_SECS`], on the leader: re-runs the primary
/// selection of every Domain with routes, so a router whose lease expired is replaced
/// (docs/routes.md "Failover"). Stops once the state is gone.
fn spawn_route_sweep<S: MaintenanceHost + 'static>(state: &Arc<S>) {
    let weak: Weak<S> = Arc::downgrade(state);
    tokio::spawn(async move {
        let every = std::time::Duration::from_secs(crate::routes::admin::ROUTE_SWEEP_SECS);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            let Some(st) = weak.upgrade() else { return };
            if st.leadership().acting(std::time::Instant::now()).is_none() {
                continue;
            }
            let ops = st.node_ops();
            let routes = crate::routes::ops::RouteOps {
                store: ops.store,
                bus: ops.bus,
            };
            match routes.sweep(crate::store::unix(st.now())).await {
                Ok(_) => failing = false,
                // Logged once per failing stretch, not every second.
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "cannot sweep the routes' leases; retrying every second");
                }
                Err(_) => {}
            }
        }
    });
}

/// Deletes the events older than the configured retention.
pub async fn prune(st: &(impl MaintenanceHost + ?Sized)) -> Result<u64, Error> {
    let retention = i64::try_from(st.schedule().retention.as_secs()).unwrap_or(i64::MAX);
    let cutoff = store::unix(st.now()).saturating_sub(retention);
    let deleted = store::retry("prune events", StoreError::is_busy, || {
        prune_attempt(st.store(), cutoff)
    })
    .await?;
    if deleted > 0 {
        tracing::debug!(
            deleted,
            cutoff,
            "pruned events older than the replay window"
        );
    }
    Ok(deleted)
}

async fn prune_attempt(store: &Store, cutoff: i64) -> Result<u64, StoreError> {
    let mut tx = store.begin().await?;
    let n = events::prune(&mut tx, cutoff).await?;
    tx.commit().await?;
    Ok(n)
}

/// Removes every ephemeral node offline past its allowance
/// (`node::decisions::ephemeral_expired`); answers how many were removed.
pub(crate) async fn expire_ephemeral(st: &(impl MaintenanceHost + ?Sized)) -> Result<usize, Error> {
    let now = store::unix(st.now());
    let expired = {
        let mut conn = st.store().acquire().await?;
        nodes::ephemeral_expired(&mut conn, now).await?
    };
    let ops = st.node_ops();
    let mut removed = 0;
    for node in &expired {
        removed += usize::from(ops.remove_ephemeral(node.id, now).await?);
    }
    Ok(removed)
}

async fn sweep(
    st: &(impl MaintenanceHost + ?Sized),
    known: &mut HashMap<Uuid, NodeStatus>,
) -> Result<(), Error> {
    let mut conn = st.store().acquire().await?;
    let rows = nodes::list(&mut conn, None).await?;
    let now = store::unix(st.now());
    let offline_after = st.schedule().offline_after_secs;
    for (node, from, to) in transitions(known, &rows, now, offline_after) {
        match to {
            NodeStatus::Offline => tracing::info!(
                node_id = %node.id, mesh_ip = %node.mesh_ip, last_seen_at = ?node.last_seen_at,
                "node offline (no heartbeat within the offline threshold)"
            ),
            _ => {
                tracing::info!(node_id = %node.id, mesh_ip = %node.mesh_ip, from = from.as_str(), to = to.as_str(), "node status changed")
            }
        }
    }
    Ok(())
}

/// Updates `known` to the statuses at `now` and answers the nodes whose status changed since
/// the last round (a node seen for the first time is not a change). Pure.
pub(crate) fn transitions<'a>(
    known: &mut HashMap<Uuid, NodeStatus>,
    rows: &'a [NodeRow],
    now: i64,
    offline_after: i64,
) -> Vec<(&'a NodeRow, NodeStatus, NodeStatus)> {
    let mut changed = Vec::new();
    let mut next = HashMap::with_capacity(rows.len());
    for row in rows {
        let status = node_status(row, now, offline_after);
        if let Some(&before) = known.get(&row.id)
            && before != status
        {
            changed.push((row, before, status));
        }
        next.insert(row.id, status);
    }
    *known = next;
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: u128, seen: Option<i64>) -> NodeRow {
        NodeRow {
            last_seen_at: seen,
            ..NodeRow::for_test(n, "10.64.0.1")
        }
    }

    #[test]
    fn first_sight_is_no_change_then_offline_and_back() {
        let mut known = HashMap::new();
        let rows = vec![row(1, Some(100)), row(2, None)];
        assert!(transitions(&mut known, &rows, 100, 90).is_empty());
        let changed = transitions(&mut known, &rows, 191, 90);
        assert_eq!(changed.len(), 1);
        assert_eq!(changed[0].0.id, Uuid::from_u128(1));
        assert_eq!(
            (changed[0].1, changed[0].2),
            (NodeStatus::Online, NodeStatus::Offline)
        );
        let back = vec![row(1, Some(200)), row(2, None)];
        let changed = transitions(&mut known, &back, 200, 90);
        assert_eq!(
            (changed[0].1, changed[0].2),
            (NodeStatus::Offline, NodeStatus::Online)
        );
        // A deleted node is forgotten.
        assert!(transitions(&mut known, &back[1..], 200, 90).is_empty());
        assert_eq!(known.len(), 1);
    }
}
