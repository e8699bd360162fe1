//! When plexd sends its path report, and what it says (sans-IO: every input carries `now`;
//! the shell samples the reach runtime's paths, hands them in with [`PathReporter::handle_sample`],
//! sends what [`PathReporter::poll_report`] hands out and feeds the answer back).
//!
//! | situation | what goes out |
//! |---|---|
//! | first sample | a report once the paths held still for [`DEBOUNCE`] |
//! | a peer's path (direct endpoint, relay, transport, none) changed | a report once nothing changed for [`DEBOUNCE`] |
//! | only RTTs moved (by more than [`RTT_DRIFT`]) or a handshake happened | a report at most every [`REFRESH`] |
//! | any of the above | never two within [`MIN_GAP`]; one in flight at a time |
//! | answer 404 (an older control plane) | nothing more (logged once) |
//! | answer 429 | again after its `Retry-After` (at least [`MIN_GAP`]) |
//! | another failure | again after [`RETRY`] |
//!
//! A report carries at most `MAX_PATH_PEERS` peers: those with a path first, then by id.

use std::time::{Duration, Instant};

use plexsphere_wire::paths::{
    MAX_PATH_PEERS, PATHS_DEBOUNCE_MS, PATHS_MIN_GAP_MS, PATHS_REFRESH_SECS, PathKind, PathsReport,
    PeerPath,
};

/// A changed path is reported once the paths held still this long.
pub(crate) const DEBOUNCE: Duration = Duration::from_millis(PATHS_DEBOUNCE_MS);
/// Two reports are at least this far apart.
pub(crate) const MIN_GAP: Duration = Duration::from_millis(PATHS_MIN_GAP_MS);
/// RTT or handshake changes alone are reported at most this often.
pub(crate) const REFRESH: Duration = Duration::from_secs(PATHS_REFRESH_SECS);
/// A failed report is sent again after this long.
pub(crate) const RETRY: Duration = Duration::from_secs(5);
/// An RTT change counts as drift past this many milliseconds and this fraction of the last
/// reported RTT (so the jitter of every ping is not a report).
pub(crate) const RTT_DRIFT: (f64, f64) = (2.0, 0.2);

/// How the control plane answered a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Stored,
    /// 404: this control plane has no path route.
    NotSupported,
    /// 429 with the wait it asked for.
    TooSoon(Duration),
    Failed(String),
}

/// The report's schedule and content.
#[derive(Debug, Default)]
pub(crate) struct PathReporter {
    /// The newest sample, sorted and bounded.
    current: Option<Vec<PeerPath>>,
    /// When the paths (not RTTs) of the sample last differed from the sample before.
    moved_at: Option<Instant>,
    /// What the last stored report said.
    sent: Option<Vec<PeerPath>>,
    sent_at: Option<Instant>,
    in_flight: Option<Vec<PeerPath>>,
    not_before: Option<Instant>,
    /// The control plane does not take reports (404).
    pub stopped: bool,
    pub last_error: Option<String>,
}

fn paths_of(peers: &[PeerPath]) -> Vec<(uuid::Uuid, &PathKind)> {
    peers.iter().map(|p| (p.peer_node_id, &p.path)).collect()
}

/// Whether `new` moved from `old` by more than [`RTT_DRIFT`] (appearing or going counts).
fn rtt_drifted(old: Option<f64>, new: Option<f64>) -> bool {
    match (old, new) {
        (Some(o), Some(n)) => (n - o).abs() > RTT_DRIFT.0.max(o * RTT_DRIFT.1),
        (None, None) => false,
        _ => true,
    }
}

/// Whether only RTTs (past the drift) or handshakes changed between two samples with the
/// same paths.
fn drifted(old: &[PeerPath], new: &[PeerPath]) -> bool {
    old.iter()
        .zip(new)
        .any(|(o, n)| o.last_handshake_at != n.last_handshake_at || rtt_drifted(o.rtt_ms, n.rtt_ms))
}

/// Sorts by id, keeps at most [`MAX_PATH_PEERS`] (peers with a path first).
fn bounded(mut peers: Vec<PeerPath>) -> Vec<PeerPath> {
    if peers.len() > MAX_PATH_PEERS {
        peers.sort_by_key(|p| (matches!(p.path, PathKind::None), p.peer_node_id));
        peers.truncate(MAX_PATH_PEERS);
    }
    peers.sort_by_key(|p| p.peer_node_id);
    peers
}

impl PathReporter {
    /// The reach runtime's paths as they are now.
    pub(crate) fn handle_sample(&mut self, peers: Vec<PeerPath>, now: Instant) {
        let peers = bounded(peers);
        let moved = self
            .current
            .as_ref()
            .is_none_or(|c| paths_of(c) != paths_of(&peers));
        if moved {
            self.moved_at = Some(now);
        }
        self.current = Some(peers);
    }

    /// When the current sample is due, ignoring the gap and the one in flight.
    fn due_at(&self) -> Option<Instant> {
        let current = self.current.as_ref()?;
        let Some(sent) = &self.sent else {
            return self.moved_at.map(|t| t + DEBOUNCE);
        };
        if paths_of(sent) != paths_of(current) {
            return self.moved_at.map(|t| t + DEBOUNCE);
        }
        if drifted(sent, current) {
            return self.sent_at.map(|t| t + REFRESH);
        }
        None
    }

    /// When [`Self::poll_report`] may have something next (`None`: nothing planned).
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if self.stopped || self.in_flight.is_some() {
            return None;
        }
        let due = self.due_at()?;
        let gap = self.sent_at.map(|t| t + MIN_GAP);
        Some(
            [Some(due), gap, self.not_before]
                .into_iter()
                .flatten()
                .max()
                .unwrap_or(due),
        )
    }

    /// The report to send now, if one is due.
    pub(crate) fn poll_report(&mut self, now: Instant) -> Option<PathsReport> {
        if self.poll_timeout().is_none_or(|t| t > now) {
            return None;
        }
        let peers = self.current.clone()?;
        self.in_flight = Some(peers.clone());
        Some(PathsReport { peers })
    }

    /// The answer to the report in flight.
    pub(crate) fn handle_answer(&mut self, answer: Answer, now: Instant) {
        let Some(report) = self.in_flight.take() else {
            return;
        };
        match answer {
            Answer::Stored => {
                self.sent = Some(report);
                self.sent_at = Some(now);
                self.not_before = None;
                self.last_error = None;
            }
            Answer::NotSupported => {
                tracing::info!(
                    "the control plane does not take path reports (404; it is older than plexd); the console shows no paths for this node, nothing else is affected"
                );
                self.stopped = true;
            }
            Answer::TooSoon(wait) => {
                self.not_before = Some(now + wait.max(MIN_GAP));
            }
            Answer::Failed(e) => {
                if self.last_error.as_ref() != Some(&e) {
                    tracing::warn!(
                        "the path report failed: {e}; sending it again in {} s",
                        RETRY.as_secs()
                    );
                }
                self.last_error = Some(e);
                self.not_before = Some(now + RETRY);
            }
        }
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
