//! One apply on the mesh thread, in the order that keeps every packet filtered: the
//! policy's filter first, then the peers (docs/policy.md "On the node"). The mesh thread and
//! the core's tests run it.

use std::sync::Arc;

use plexsphere_wire::node::{PeerSpec, PolicyState};

use super::io::MeshAnswer;
use crate::mesh::Mesh;

/// The policy whose filter the mesh has: `None` until one was installed, and again after
/// an install failed (the next apply tries again).
#[derive(Debug, Default)]
pub struct InstalledPolicy(Option<Option<Arc<PolicyState>>>);

impl InstalledPolicy {
    fn is(&self, policy: &Option<Arc<PolicyState>>) -> bool {
        match (&self.0, policy) {
            (Some(None), None) => true,
            (Some(Some(a)), Some(b)) => Arc::ptr_eq(a, b) || a == b,
            _ => false,
        }
    }
}

/// One apply, in the order that keeps every packet filtered: the policy's filter first
/// (when it differs from the installed one), then the peers. While the filter cannot be
/// installed the interface gets NO peers (fail closed: a backend whose filter failed may
/// have none, and no peer may carry a packet unfiltered); the answer says why.
pub fn run_apply(
    mesh: &mut dyn Mesh,
    installed: &mut InstalledPolicy,
    peers: Arc<Vec<PeerSpec>>,
    policy: Option<Arc<PolicyState>>,
) -> MeshAnswer {
    let policy_result = if installed.is(&policy) {
        None
    } else {
        let r = mesh.set_policy(policy.as_deref());
        installed.0 = r.is_ok().then(|| policy.clone());
        Some(r.map_err(Box::new))
    };
    let peers = if installed.0.is_some() {
        peers
    } else {
        Arc::new(Vec::new())
    };
    MeshAnswer::Applied(mesh.apply(peers), policy_result)
}
