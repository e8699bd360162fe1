//! What the path routes (`api::paths`) share in [`AppState`](super::state::AppState): each
//! node's report slot and the relays' health, and the console streams open per caller.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use plexsphere_wire::paths::PATHS_MIN_GAP_MS;
use uuid::Uuid;

use crate::relay_health::RelayHealth;

/// A report sooner than this after the node's last one is refused (a little under
/// [`PATHS_MIN_GAP_MS`]: the node's clock and the network's delays are not ours).
pub(crate) const PATHS_MIN_GAP: Duration = Duration::from_millis(PATHS_MIN_GAP_MS - 250);
/// Nodes whose last report time this replica remembers; past it, those older than the gap
/// are forgotten.
const MAX_REMEMBERED: usize = 100_000;

/// What the path routes share in [`AppState`].
#[derive(Default)]
pub struct PathsShared {
    /// Each node's last accepted report on this replica.
    last_report: Mutex<HashMap<Uuid, Instant>>,
    pub relays: RelayHealth,
    /// Console event streams open per caller id on this replica.
    pub console_streams: Mutex<HashMap<String, usize>>,
}

impl PathsShared {
    /// Takes the node's report slot, or answers how many seconds it must wait.
    pub(super) fn take_slot(&self, node: Uuid, now: Instant) -> Result<(), u64> {
        let mut last = self.last_report.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = last.get(&node) {
            let since = now.saturating_duration_since(*t);
            if since < PATHS_MIN_GAP {
                return Err((PATHS_MIN_GAP - since).as_secs().max(1));
            }
        }
        if last.len() >= MAX_REMEMBERED {
            last.retain(|_, t| now.saturating_duration_since(*t) < PATHS_MIN_GAP);
        }
        last.insert(node, now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_report_within_the_gap_waits() {
        let s = PathsShared::default();
        let (n, t0) = (Uuid::from_u128(1), Instant::now());
        assert_eq!(s.take_slot(n, t0), Ok(()));
        assert!(s.take_slot(n, t0 + Duration::from_millis(500)).is_err());
        assert_eq!(s.take_slot(Uuid::from_u128(2), t0), Ok(()), "per node");
        assert_eq!(s.take_slot(n, t0 + PATHS_MIN_GAP), Ok(()));
    }
}
