//! The mesh jobs the core asked for and what each was for, kept until its answer comes; the
//! peer set last sent (the "before" of the next change lines); and whether the wanted set
//! changed while an apply ran (applies never queue up behind each other: the latest set goes
//! when the running one answers).

use std::collections::BTreeMap;
use std::sync::Arc;

use plexsphere_wire::node::PeerSpec;

use super::io::{ControlId, KeyDone, MeshJobId};

/// What a live-peer read is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LiveFor {
    Heartbeat,
    Observe,
    Status(ControlId),
    Probe,
}

/// What a mesh job was for, kept until its answer comes.
#[derive(Debug, Clone)]
pub(super) enum Pending {
    /// The peers and the policy version sent with them.
    Apply(Arc<Vec<PeerSpec>>, Option<u64>),
    Live(LiveFor),
    Teardown,
    /// A key rotation's switch of the interface key.
    SetKey(Box<KeyDone>),
}

/// The mesh jobs' state, owned here and changed only through these methods.
#[derive(Debug, Default)]
pub(super) struct MeshJobs {
    pending: BTreeMap<MeshJobId, Pending>,
    next: MeshJobId,
    /// The peer set last sent to the mesh.
    applied: Arc<Vec<PeerSpec>>,
    /// An apply is running and the wanted set changed since.
    apply_again: bool,
}

impl MeshJobs {
    /// A job is asked for: its id, remembered with what it is for.
    pub(super) fn ask(&mut self, pending: Pending) -> MeshJobId {
        self.next += 1;
        self.pending.insert(self.next, pending);
        self.next
    }

    /// Job `id` answered: what it was for (`None` for an id not asked for, or answered).
    pub(super) fn answered(&mut self, id: MeshJobId) -> Option<Pending> {
        self.pending.remove(&id)
    }

    pub(super) fn outstanding(&self) -> usize {
        self.pending.len()
    }

    /// Whether an apply is running.
    pub(super) fn apply_running(&self) -> bool {
        self.pending
            .values()
            .any(|p| matches!(p, Pending::Apply(..)))
    }

    /// Whether the watchdog's probe of the mesh is still out.
    pub(super) fn probe_running(&self) -> bool {
        self.pending
            .values()
            .any(|p| matches!(p, Pending::Live(LiveFor::Probe)))
    }

    /// The peer set last sent to the mesh.
    pub(super) fn applied(&self) -> &Arc<Vec<PeerSpec>> {
        &self.applied
    }

    pub(super) fn set_applied(&mut self, sent: Arc<Vec<PeerSpec>>) {
        self.applied = sent;
    }

    /// Whether the latest wanted set must go when the running apply answers.
    pub(super) fn set_apply_again(&mut self, again: bool) {
        self.apply_again = again;
    }

    /// Whether an apply must follow (it is then no longer owed).
    pub(super) fn take_apply_again(&mut self) -> bool {
        std::mem::take(&mut self.apply_again)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_kept_until_answered_and_an_apply_again_is_owed_once() {
        let mut j = MeshJobs::default();
        let apply = j.ask(Pending::Apply(Arc::new(vec![]), None));
        let probe = j.ask(Pending::Live(LiveFor::Probe));
        assert_ne!(apply, probe);
        assert!(j.apply_running() && j.probe_running());
        assert_eq!(j.outstanding(), 2);
        j.set_apply_again(true);
        assert!(matches!(j.answered(apply), Some(Pending::Apply(..))));
        assert!(j.answered(apply).is_none(), "an answer counts once");
        assert!(!j.apply_running() && j.probe_running());
        assert!(j.take_apply_again());
        assert!(!j.take_apply_again(), "owed once");
        assert!(j.answered(probe).is_some());
        assert_eq!(j.outstanding(), 0);
    }
}
