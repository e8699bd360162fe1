//! The phase machine of a provisioned resource: pure, with no clock and no I/O.
//!
//! Inputs are observations (what the reconcile loop saw: the substrate accepted the composite,
//! the machine booted, a node registered with the resource's token, cloud-init failed...) with
//! the time they were observed, passed in. Outputs are transitions that record what was observed
//! and when. Nothing moves without an observation: there are no timers here. An observation
//! that does not apply to the current phase changes nothing and says why, so the reconcile loop
//! can re-offer every fact it sees on each pass (idempotent re-checks).
//!
//! | from                                   | observation                          | to             |
//! |----------------------------------------|--------------------------------------|----------------|
//! | Pending                                | SubstrateAccepted                    | Provisioning   |
//! | Provisioning (standalone)              | SubstrateReady                       | Ready          |
//! | Provisioning (machine)                 | MachineBooted                        | Enrolling      |
//! | Enrolling (machine)                    | NodeRegistered                       | Ready          |
//! | Pending/Provisioning/Enrolling/Ready/Deprovisioning | SubstrateFailed         | Failed         |
//! | Pending/Provisioning/Enrolling/Ready (machine) | CloudInitFailed, JoinFailed  | Failed         |
//! | Provisioning/Enrolling/Ready           | SubstrateGone (no delete asked)      | Failed         |
//! | any but Deprovisioning/Deleted         | DeleteRequested                      | Deprovisioning |
//! | Deprovisioning                         | SubstrateGone                        | Deleted        |
//!
//! `Deleted` is final. `Failed` is final for provisioning: only a delete leaves it.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::blueprint::Class;

/// The longest history kept; beyond it the oldest entries after the first are dropped.
pub const MAX_HISTORY: usize = 64;

/// Where a resource is in its life. Serialised as the tutorial reads it: `"Pending"`, ...
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Phase {
    Pending,
    Provisioning,
    Enrolling,
    Ready,
    Failed,
    Deprovisioning,
    Deleted,
}

impl Phase {
    pub const ALL: [Phase; 7] = [
        Phase::Pending,
        Phase::Provisioning,
        Phase::Enrolling,
        Phase::Ready,
        Phase::Failed,
        Phase::Deprovisioning,
        Phase::Deleted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Provisioning => "Provisioning",
            Phase::Enrolling => "Enrolling",
            Phase::Ready => "Ready",
            Phase::Failed => "Failed",
            Phase::Deprovisioning => "Deprovisioning",
            Phase::Deleted => "Deleted",
        }
    }

    /// `Failed` and `Deleted`: provisioning moves no further (a delete still leaves Failed).
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Failed | Phase::Deleted)
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Something the reconcile loop observed about a resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Observation {
    /// The substrate accepted the composite (a machine: it was created and started).
    SubstrateAccepted,
    /// The machine booted (is running); the broker now waits for its node.
    MachineBooted,
    /// The substrate reports a standalone resource ready.
    SubstrateReady,
    /// A node registered with the bootstrap token minted for this resource.
    NodeRegistered { node_id: Uuid },
    /// The substrate reported an error.
    SubstrateFailed { reason: String },
    /// cloud-init on the machine finished with an error.
    CloudInitFailed { detail: String },
    /// `plexd join` on the machine exited non-zero.
    JoinFailed { exit_code: i32, detail: String },
    /// An operator asked for the resource to be deleted.
    DeleteRequested,
    /// The substrate confirmed the resource no longer exists.
    SubstrateGone,
}

impl Observation {
    /// One line saying what was observed, as the history records it.
    pub fn describe(&self) -> String {
        match self {
            Observation::SubstrateAccepted => "the substrate accepted the composite".to_owned(),
            Observation::MachineBooted => "the machine booted".to_owned(),
            Observation::SubstrateReady => "the substrate reported the resource ready".to_owned(),
            Observation::NodeRegistered { node_id } => {
                format!("node {node_id} registered with the resource's bootstrap token")
            }
            Observation::SubstrateFailed { reason } => format!("the substrate failed: {reason}"),
            Observation::CloudInitFailed { detail } => {
                format!("cloud-init on the machine failed: {detail}")
            }
            Observation::JoinFailed { exit_code, detail } => {
                format!("plexd join exited with {exit_code}: {detail}")
            }
            Observation::DeleteRequested => "a delete was requested".to_owned(),
            Observation::SubstrateGone => "the substrate confirmed it is gone".to_owned(),
        }
    }
}

/// What one observation does to a phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Move to `to`; `reason` is set for `Failed`.
    Move { to: Phase, reason: Option<String> },
    /// Nothing changes; `why` says why the observation does not apply.
    Ignore { why: &'static str },
}

/// The transition rule: which phase an observation leads to from `phase`, for a resource of
/// `class`. The whole state machine is this one function.
pub fn decide(class: Class, phase: Phase, obs: &Observation) -> Decision {
    use Observation as O;
    use Phase as P;
    let machine = class == Class::Machine;
    let to = |to: Phase| Decision::Move { to, reason: None };
    let fail = || Decision::Move {
        to: P::Failed,
        reason: Some(obs.describe()),
    };
    let ignore = |why| Decision::Ignore { why };
    match (phase, obs) {
        (P::Deleted, _) => ignore("the resource is deleted"),
        (P::Deprovisioning, O::SubstrateGone) => to(P::Deleted),
        (P::Deprovisioning, O::SubstrateFailed { .. }) => fail(),
        (P::Deprovisioning, _) => ignore("the resource is being deprovisioned"),
        (_, O::DeleteRequested) => to(P::Deprovisioning),
        (P::Failed, _) => ignore("the resource failed; only a delete moves it on"),

        (P::Pending, O::SubstrateAccepted) => to(P::Provisioning),
        (_, O::SubstrateAccepted) => ignore("the substrate already accepted it"),

        (P::Provisioning, O::MachineBooted) if machine => to(P::Enrolling),
        (_, O::MachineBooted) if !machine => ignore("a standalone resource has no machine"),
        (_, O::MachineBooted) => ignore("the machine boots only in Provisioning"),

        (P::Provisioning, O::SubstrateReady) if !machine => to(P::Ready),
        (_, O::SubstrateReady) if machine => {
            ignore("a machine is Ready only when its node registers")
        }
        (_, O::SubstrateReady) => ignore("the substrate is ready only after Provisioning"),

        (P::Enrolling, O::NodeRegistered { .. }) if machine => to(P::Ready),
        (_, O::NodeRegistered { .. }) if !machine => ignore("a standalone resource enrols no node"),
        (_, O::NodeRegistered { .. }) => ignore("a node registers only while Enrolling"),

        (_, O::SubstrateFailed { .. }) => fail(),
        (_, O::CloudInitFailed { .. } | O::JoinFailed { .. }) if machine => fail(),
        (_, O::CloudInitFailed { .. } | O::JoinFailed { .. }) => {
            ignore("a standalone resource runs no cloud-init")
        }

        (P::Pending, O::SubstrateGone) => ignore("nothing was composed yet"),
        (_, O::SubstrateGone) => Decision::Move {
            to: P::Failed,
            reason: Some(
                "the substrate no longer has the resource although no delete was requested"
                    .to_owned(),
            ),
        },
    }
}

/// One recorded transition: the phase entered, what was observed, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub phase: Phase,
    pub observed: String,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
}

/// The `provisioning` object of a resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provisioning {
    pub phase: Phase,
    /// Why it failed (set only in `Failed`).
    pub reason: Option<String>,
    /// When the current phase was observed.
    #[serde(with = "time::serde::rfc3339")]
    pub observed_at: OffsetDateTime,
    pub history: Vec<HistoryEntry>,
}

/// What [`Provisioning::observe`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Moved { from: Phase, to: Phase },
    Ignored { phase: Phase, why: &'static str },
}

impl Provisioning {
    /// A resource whose declaration was accepted at `at`.
    pub fn new(at: OffsetDateTime) -> Self {
        Self {
            phase: Phase::Pending,
            reason: None,
            observed_at: at,
            history: vec![HistoryEntry {
                phase: Phase::Pending,
                observed: "the declaration was accepted".to_owned(),
                at,
            }],
        }
    }

    /// Applies one observation made at `at`.
    pub fn observe(&mut self, class: Class, obs: &Observation, at: OffsetDateTime) -> Outcome {
        match decide(class, self.phase, obs) {
            Decision::Ignore { why } => Outcome::Ignored {
                phase: self.phase,
                why,
            },
            Decision::Move { to, reason } => {
                let from = self.phase;
                self.phase = to;
                self.reason = reason;
                self.observed_at = at;
                self.history.push(HistoryEntry {
                    phase: to,
                    observed: obs.describe(),
                    at,
                });
                if self.history.len() > MAX_HISTORY {
                    self.history.remove(1);
                }
                Outcome::Moved { from, to }
            }
        }
    }
}

#[cfg(test)]
#[path = "phase_tests.rs"]
mod tests;
