//! The thread that owns the data plane: the executor hands it [`MeshOp`]s through a bounded
//! queue and never waits for it; each answer comes back on the loop's input channel. A mesh
//! call may block (the WireGuard backends wait up to 15 s for their own worker); only this
//! thread waits. A full queue is answered at once with [`MeshAnswer::Busy`].

use std::sync::Arc;
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::thread::{self, JoinHandle};

use plexsphere_wire::node::{PeerSpec, PolicyState};
use tokio::sync::mpsc::Sender;

use super::core::io::{self, MeshAnswer, MeshJobId, MeshOp};
use super::input::Input;
use crate::mesh::Mesh;

/// Mesh jobs waiting for the thread. The core keeps at most one apply, one heartbeat read,
/// one ingest read and one watchdog probe outstanding, so the rest is room for `plexd status`
/// requests arriving together; past it, they are answered from no live peers.
pub const MESH_QUEUE: usize = 64;

pub struct MeshThread {
    jobs: Option<SyncSender<(MeshJobId, MeshOp)>>,
    thread: Option<JoinHandle<()>>,
}

impl MeshThread {
    /// Starts the thread; answers go to `answers` as core inputs.
    pub fn start(mut mesh: Box<dyn Mesh>, answers: Sender<Input>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel::<(MeshJobId, MeshOp)>(MESH_QUEUE);
        let thread = thread::Builder::new()
            .name("plexd-mesh".into())
            .spawn(move || {
                let mut installed = InstalledPolicy::default();
                for (id, op) in rx {
                    let answer = match op {
                        MeshOp::Apply(set, policy) => {
                            run_apply(&mut *mesh, &mut installed, set, policy)
                        }
                        MeshOp::ReadLive => MeshAnswer::Live(mesh.live_peers()),
                        MeshOp::Teardown => MeshAnswer::TornDown(mesh.teardown()),
                        MeshOp::SetKey(k) => MeshAnswer::KeySet(mesh.set_private_key(k.0)),
                    };
                    if answers
                        .blocking_send(Input::Core(io::Input::Mesh { id, answer }))
                        .is_err()
                    {
                        break;
                    }
                }
                // Dropping the mesh here releases it (the embedded data plane stops its threads).
                drop(mesh);
            })?;
        Ok(Self {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    /// Queues a job; `Err(Busy)` when the queue is full or the thread is gone.
    pub fn ask(&self, id: MeshJobId, op: MeshOp) -> Result<(), MeshAnswer> {
        let Some(jobs) = &self.jobs else {
            return Err(MeshAnswer::Busy);
        };
        match jobs.try_send((id, op)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => Err(MeshAnswer::Busy),
        }
    }

    /// plexd stops: the thread finishes its queue, releases the data plane and ends.
    pub fn stop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

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

impl Drop for MeshThread {
    fn drop(&mut self) {
        self.stop();
    }
}
