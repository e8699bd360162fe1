//! `--wait`: follow a resource's phases, the tutorial's watch loop built in.
//!
//! [`phase_lines`] turns two consecutive polls into the lines to print (`14:31:12 Provisioning
//! (the substrate accepted the composite)`, UTC) and [`verdict`] says whether the resource has
//! settled; both are pure. [`watch`] is the thin loop that polls `GET /v1/resources/{id}`.

use std::io::Write;
use std::time::Duration;

use time::OffsetDateTime;
use time::macros::format_description;
use uuid::Uuid;

use crate::broker_output::{ProvisioningView, Resource};
use crate::client::{Api, ClientError};

/// What the wait is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goal {
    /// `create --wait`, `get --wait`: Ready.
    Ready,
    /// `delete --wait`: Deleted.
    Deleted,
}

impl Goal {
    pub fn phase(self) -> &'static str {
        match self {
            Goal::Ready => "Ready",
            Goal::Deleted => "Deleted",
        }
    }
}

/// Where a resource stands for a goal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    Reached,
    /// Settled without reaching the goal, with the observed reason.
    Failed(String),
}

/// `HH:MM:SS Phase (observed)` in UTC; without the parenthesis when nothing was recorded.
pub fn line(at: OffsetDateTime, phase: &str, observed: Option<&str>) -> String {
    let at = at.to_offset(time::UtcOffset::UTC);
    let clock = at
        .format(format_description!("[hour]:[minute]:[second]"))
        .unwrap_or_else(|_| at.time().to_string());
    match observed.map(str::trim).filter(|o| !o.is_empty()) {
        Some(observed) => format!("{clock} {phase} ({observed})"),
        None => format!("{clock} {phase}"),
    }
}

/// The lines for what changed between the previous poll (`None` on the first) and this one.
///
/// The first poll shows the current phase. Later polls show every history entry recorded since
/// the previous one, so a phase passed between two polls is not lost; an answer without a
/// (longer) history falls back to the phase itself when it changed.
pub fn phase_lines(before: Option<&ProvisioningView>, now: &ProvisioningView) -> Vec<String> {
    let current = || {
        let observed = match now.history.last() {
            Some(h) if h.phase == now.phase => Some(h.observed.as_str()),
            _ => now.reason.as_deref(),
        };
        vec![line(now.observed_at, &now.phase, observed)]
    };
    let Some(before) = before else {
        return current();
    };
    if now.history.len() > before.history.len() {
        return now.history[before.history.len()..]
            .iter()
            .map(|h| line(h.at, &h.phase, Some(&h.observed)))
            .collect();
    }
    if now.phase != before.phase || now.observed_at != before.observed_at {
        return current();
    }
    Vec::new()
}

/// Whether the resource has settled for `goal`.
pub fn verdict(goal: Goal, now: &ProvisioningView) -> Verdict {
    let reason = || {
        now.reason
            .clone()
            .or_else(|| now.history.last().map(|h| h.observed.clone()))
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "no reason was recorded".to_owned())
    };
    match (goal, now.phase.as_str()) {
        (Goal::Ready, "Ready") | (Goal::Deleted, "Deleted") => Verdict::Reached,
        (_, "Failed") => Verdict::Failed(reason()),
        (Goal::Ready, "Deleted") => Verdict::Failed("it was deleted".to_owned()),
        _ => Verdict::Continue,
    }
}

/// How a wait ended; each carries the last resource seen.
#[derive(Debug)]
pub enum Ended {
    Reached(Resource),
    Failed(Resource, String),
    TimedOut(Resource),
}

/// Polls the resource every `interval` from `first` (or a first GET) until it settles or
/// `timeout` passes, writing each phase line to `out` as it is seen.
pub async fn watch(
    api: &Api,
    id: Uuid,
    first: Option<Resource>,
    goal: Goal,
    interval: Duration,
    timeout: Duration,
    out: &mut dyn Write,
) -> Result<Ended, ClientError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let id = id.to_string();
    let path = ["v1", "resources", id.as_str()];
    let mut current = match first {
        Some(r) => r,
        None => api.get(&path, &[]).await?,
    };
    let mut before: Option<ProvisioningView> = None;
    loop {
        for text in phase_lines(before.as_ref(), &current.view.provisioning) {
            let _ = writeln!(out, "{text}");
        }
        let _ = out.flush();
        match verdict(goal, &current.view.provisioning) {
            Verdict::Reached => return Ok(Ended::Reached(current)),
            Verdict::Failed(reason) => return Ok(Ended::Failed(current, reason)),
            Verdict::Continue => {}
        }
        if tokio::time::Instant::now() + interval > deadline {
            return Ok(Ended::TimedOut(current));
        }
        tokio::time::sleep(interval).await;
        before = Some(current.view.provisioning.clone());
        current = api.get(&path, &[]).await?;
    }
}

#[cfg(test)]
#[path = "wait_tests.rs"]
mod tests;
