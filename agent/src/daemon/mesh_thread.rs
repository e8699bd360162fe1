//! The thread that owns the data plane: the executor hands it [`MeshOp`]s through a bounded
//! queue and never waits for it; each answer comes back on the loop's input channel. A mesh
//! call may block (the WireGuard backends wait up to 15 s for their own worker); only this
//! thread waits. A full queue is answered at once with [`MeshAnswer::Busy`].

use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::thread::{self, JoinHandle};

use tokio::sync::mpsc::Sender;

use super::core::io::{self, MeshAnswer, MeshJobId, MeshOp};
use super::core::mesh_apply::{InstalledPolicy, run_apply};
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

impl Drop for MeshThread {
    fn drop(&mut self) {
        self.stop();
    }
}
