//! The [`Mesh`] both WireGuard backends share: one worker thread owns every blocking
//! `wireguard-control` call (or data plane call). A [`Mesh`] call hands it a job and waits for
//! the answer at most [`CALL_BOUND`]; the caller is the daemon's mesh thread
//! (`daemon/mesh_thread.rs`), never its event loop, which gets every answer back as an input.
//! The worker also reconciles on its own every [`RECONCILE_EVERY`]: that drives the
//! endpoint rotation (a candidate that completes no handshake in 15 s gives way to the next)
//! and puts back what someone changed by hand on the interface.

use std::io;
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use plexsphere_wire::node::{PeerSpec, PolicyState};

use super::contract::{LivePeer, Mesh, MeshError};
use super::diff::{self, EndpointOwners, LiveConfig, MeshChange, MeshUpdate, RotationOnly};
use super::endpoints::EndpointBook;
use crate::reach::io::{NoReach, ReachHandle};
use crate::reach::runtime::Runtime;

/// How often the worker reconciles without being asked.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(5);
/// How long the daemon waits for the worker's answer.
pub const CALL_BOUND: Duration = Duration::from_secs(15);

/// How the worker reads and writes the interface's peers: through wireguard-control for the
/// kernel (`super::wg::WgControl`), straight into the embedded data plane for userspace
/// (`super::userspace::DirectControl`).
pub trait Control: Send + 'static {
    /// The peers on the interface, with their counters.
    fn live(&self) -> std::io::Result<Vec<LiveConfig>>;
    /// Applies a peer update (nothing for an empty one).
    fn apply(&self, update: &MeshUpdate) -> std::io::Result<()>;
    /// Replaces the interface's private key; the peers stay.
    fn set_private_key(&self, key: [u8; 32]) -> std::io::Result<()>;
    /// Installs the policy's filter ([`Mesh::set_policy`]); on `Err` nothing from a peer
    /// may pass (fail closed).
    fn set_policy(&self, policy: Option<&PolicyState>) -> std::io::Result<()>;
    /// Puts `policy`'s filter back if something outside plexd removed it (the kernel
    /// backend's nftables table after an `nft flush ruleset`); `Ok(true)` when it did. The
    /// worker asks every [`RECONCILE_EVERY`]. A filter in plexd's memory cannot be lost.
    fn restore_policy(&self, _policy: &PolicyState) -> std::io::Result<bool> {
        Ok(false)
    }
}

/// What a backend adds to the shared code: is its data plane alive, and how it goes away.
pub trait Plane: Send + 'static {
    /// Why the interface cannot be configured right now (the embedded data plane stopped).
    fn check(&mut self) -> Result<(), WorkerError>;
    /// Removes the interface (leave).
    fn teardown(&mut self) -> Result<(), WorkerError>;
    /// plexd stops (SIGTERM): release what this process holds, leave the interface.
    fn stop(&mut self) {}
}

/// What failed in the worker or its backend. The daemon gets it as [`MeshError::what`], its
/// Display text: what a person reads in the journal and in `plexd status`.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The embedded data plane's threads ended; `why` is what they reported.
    #[error("the embedded data plane stopped ({why}); restart plexd")]
    PlaneStopped { why: String },
    /// Deleting the interface (leave) failed.
    #[error("cannot delete the interface ({source}); run `ip link del {iface}`")]
    DeleteInterface { iface: String, source: io::Error },
    /// Removing the kernel backend's policy table (leave) failed (`super::nft`'s text).
    #[error("{0}")]
    PolicyTable(String),
    #[error("cannot read the peers: {0}")]
    ReadPeers(#[source] io::Error),
    #[error("cannot apply {ops} peer operation(s): {source}")]
    ApplyPeers { ops: usize, source: io::Error },
    #[error("cannot set the new private key: {0}")]
    SetKey(#[source] io::Error),
    #[error("cannot install the policy filter: {0}")]
    SetPolicy(#[source] io::Error),
    /// The worker took no more jobs: the interface was torn down.
    #[error("the interface was torn down (plexd leave)")]
    TornDown,
    /// The worker gave no answer within [`CALL_BOUND`].
    #[error(
        "no answer from the wireguard control thread within {} s; the interface may be wedged",
        CALL_BOUND.as_secs()
    )]
    NoAnswer,
    /// The worker thread ended without answering.
    #[error("the wireguard control thread stopped; restart plexd")]
    WorkerStopped,
}

type Reply<T> = mpsc::Sender<Result<T, WorkerError>>;

enum Job {
    Apply(Arc<Vec<PeerSpec>>, Reply<Vec<MeshChange>>),
    Live(Reply<Vec<LiveConfig>>),
    Teardown(Reply<()>),
    Stop(Reply<()>),
    SetKey([u8; 32], Reply<()>),
    SetPolicy(Option<Box<PolicyState>>, Reply<()>),
}

/// A WireGuard interface driven through wireguard-control by a worker thread.
pub struct WgMesh {
    backend: &'static str,
    iface: String,
    jobs: mpsc::Sender<Job>,
    reach: Option<Arc<Runtime>>,
    udp_offload: Option<Arc<plexd_dataplane::UdpOffloadSwitch>>,
    gso_prober: Option<plexd_dataplane::Prober>,
    policy_reader: Option<plexd_dataplane::PolicyReader>,
}

struct Worker<P: Plane, C: Control> {
    ctl: C,
    plane: P,
    iface: String,
    desired: Option<Arc<Vec<PeerSpec>>>,
    book: EndpointBook,
    last_error: Option<String>,
    /// The reach runtime, whose peers' endpoints the diff leaves alone.
    reach: Option<Arc<Runtime>>,
    /// The policy last installed (for [`Control::restore_policy`]).
    policy: Option<Box<PolicyState>>,
    /// The last restore error, logged once until it changes.
    restore_error: Option<String>,
}

impl WgMesh {
    /// Starts the worker; with `reach`, the runtime owns the endpoints of the peers it
    /// carries, and stops with the interface.
    pub fn start<P: Plane, C: Control>(
        backend: &'static str,
        iface: &str,
        ctl: C,
        plane: P,
        reach: Option<Arc<Runtime>>,
    ) -> Result<Self, MeshError> {
        let (tx, rx) = mpsc::channel();
        let worker = Worker {
            ctl,
            plane,
            iface: iface.to_owned(),
            desired: None,
            book: EndpointBook::new(),
            last_error: None,
            reach: reach.clone(),
            policy: None,
            restore_error: None,
        };
        thread::Builder::new()
            .name("wg-control".into())
            .spawn(move || worker.run(&rx))
            .map_err(|e| MeshError {
                backend,
                interface: iface.to_owned(),
                what: format!("cannot start the wireguard control thread: {e}"),
            })?;
        Ok(Self {
            backend,
            iface: iface.to_owned(),
            jobs: tx,
            reach,
            udp_offload: None,
            gso_prober: None,
            policy_reader: None,
        })
    }

    /// The embedded data plane's UDP offload switch ([`Mesh::udp_offload`]).
    pub fn with_udp_offload(mut self, switch: Arc<plexd_dataplane::UdpOffloadSwitch>) -> Self {
        self.udp_offload = Some(switch);
        self
    }

    /// The embedded data plane's segmentation probe ([`Mesh::gso_prober`]).
    pub fn with_gso_prober(mut self, prober: plexd_dataplane::Prober) -> Self {
        self.gso_prober = Some(prober);
        self
    }

    /// The embedded data plane's policy counters ([`Mesh::policy_reader`]).
    pub fn with_policy_reader(mut self, reader: plexd_dataplane::PolicyReader) -> Self {
        self.policy_reader = Some(reader);
        self
    }

    /// The reach runtime, when reach is on (tests pin paths through it).
    pub fn runtime(&self) -> Option<Arc<Runtime>> {
        self.reach.clone()
    }

    fn error(&self, e: &WorkerError) -> MeshError {
        MeshError {
            backend: self.backend,
            interface: self.iface.clone(),
            what: e.to_string(),
        }
    }

    fn call<T>(&self, job: impl FnOnce(Reply<T>) -> Job) -> Result<T, MeshError> {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .send(job(tx))
            .map_err(|_| self.error(&WorkerError::TornDown))?;
        match rx.recv_timeout(CALL_BOUND) {
            Ok(r) => r.map_err(|e| self.error(&e)),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(self.error(&WorkerError::NoAnswer)),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(self.error(&WorkerError::WorkerStopped))
            }
        }
    }
}

/// plexd stops: the worker releases the data plane (the embedded one stops its threads and
/// removes its UAPI socket) before the process exits; a kernel interface stays.
impl Drop for WgMesh {
    fn drop(&mut self) {
        let _ = self.call(Job::Stop);
    }
}

impl Mesh for WgMesh {
    fn backend(&self) -> &'static str {
        self.backend
    }

    /// The changes the worker's diff made on the interface.
    fn apply(&mut self, desired: Arc<Vec<PeerSpec>>) -> Result<Vec<MeshChange>, MeshError> {
        self.call(|tx| Job::Apply(desired, tx))
    }

    fn live_peers(&self) -> Result<Vec<LivePeer>, MeshError> {
        let live = self.call(Job::Live)?;
        Ok(live.iter().map(LivePeer::from).collect())
    }

    fn teardown(&mut self) -> Result<(), MeshError> {
        self.call(Job::Teardown)
    }

    fn set_private_key(&mut self, key: [u8; 32]) -> Result<(), MeshError> {
        self.call(|tx| Job::SetKey(key, tx))
    }

    fn set_policy(&mut self, policy: Option<&PolicyState>) -> Result<(), MeshError> {
        let policy = policy.map(|p| Box::new(p.clone()));
        self.call(|tx| Job::SetPolicy(policy, tx))
    }

    fn reach(&self) -> Arc<dyn ReachHandle> {
        match &self.reach {
            Some(r) => r.clone(),
            None => Arc::new(NoReach),
        }
    }

    fn udp_offload(&self) -> Option<Arc<plexd_dataplane::UdpOffloadSwitch>> {
        self.udp_offload.clone()
    }

    fn gso_prober(&self) -> Option<plexd_dataplane::Prober> {
        self.gso_prober.clone()
    }

    fn policy_reader(&self) -> Option<plexd_dataplane::PolicyReader> {
        self.policy_reader.clone()
    }
}

impl<P: Plane, C: Control> Worker<P, C> {
    fn run(mut self, jobs: &mpsc::Receiver<Job>) {
        loop {
            match jobs.recv_timeout(RECONCILE_EVERY) {
                Ok(Job::Apply(desired, reply)) => {
                    self.desired = Some(desired);
                    let r = self.reconcile(false);
                    let _ = reply.send(r);
                }
                Ok(Job::Live(reply)) => {
                    let r = self
                        .plane
                        .check()
                        .and_then(|()| self.ctl.live().map_err(WorkerError::ReadPeers));
                    let _ = reply.send(r);
                }
                Ok(Job::SetKey(key, reply)) => {
                    let r = self
                        .plane
                        .check()
                        .and_then(|()| self.ctl.set_private_key(key).map_err(WorkerError::SetKey));
                    if r.is_ok()
                        && let Some(reach) = &self.reach
                    {
                        reach.set_secret(key);
                    }
                    let _ = reply.send(r);
                }
                Ok(Job::SetPolicy(policy, reply)) => {
                    let r = self.plane.check().and_then(|()| {
                        self.ctl
                            .set_policy(policy.as_deref())
                            .map_err(WorkerError::SetPolicy)
                    });
                    self.policy = if r.is_ok() { policy } else { None };
                    let _ = reply.send(r);
                }
                Ok(Job::Teardown(reply)) => {
                    if let Some(r) = &self.reach {
                        r.stop();
                    }
                    let _ = reply.send(self.plane.teardown());
                    return;
                }
                Ok(Job::Stop(reply)) => {
                    if let Some(r) = &self.reach {
                        r.stop();
                    }
                    self.plane.stop();
                    let _ = reply.send(Ok(()));
                    return;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.restore_policy();
                    if self.desired.is_none() {
                        continue;
                    }
                    match self.reconcile(true) {
                        Ok(_) => self.last_error = None,
                        Err(e) => {
                            let e = e.to_string();
                            if self.last_error.as_ref() != Some(&e) {
                                tracing::warn!(interface = %self.iface, "wireguard reconcile failed: {e}; retrying every {} s", RECONCILE_EVERY.as_secs());
                            }
                            self.last_error = Some(e);
                        }
                    }
                }
                // The daemon stopped (SIGTERM): the interface stays as it is.
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn restore_policy(&mut self) {
        let Some(policy) = &self.policy else {
            return;
        };
        let r = self.ctl.restore_policy(policy);
        let error = r.as_ref().err().map(ToString::to_string);
        match r {
            Ok(false) => {}
            Ok(true) => {
                tracing::warn!(interface = %self.iface, policy_version = policy.version, "policy: the filter was gone (removed outside plexd, e.g. `nft flush ruleset` or an nftables.service restart); installed it again");
            }
            Err(e) if self.restore_error != error => {
                tracing::error!(interface = %self.iface, policy_version = policy.version, "policy: the filter was gone and cannot be installed again: {e}; retrying every {} s", RECONCILE_EVERY.as_secs());
            }
            Err(_) => {}
        }
        self.restore_error = error;
    }

    fn reconcile(&mut self, periodic: bool) -> Result<Vec<MeshChange>, WorkerError> {
        let Some(desired) = &self.desired else {
            return Ok(vec![]);
        };
        self.plane.check()?;
        let live = self.ctl.live().map_err(WorkerError::ReadPeers)?;
        let owners: &dyn EndpointOwners = match &self.reach {
            Some(r) => &**r,
            None => &RotationOnly,
        };
        let d = diff::diff_with(
            desired,
            &live,
            &mut self.book,
            owners,
            Instant::now(),
            SystemTime::now(),
        );
        self.ctl
            .apply(&d.update)
            .map_err(|source| WorkerError::ApplyPeers {
                ops: d.update.ops.len(),
                source,
            })?;
        log_changes(&self.iface, &d.changes, periodic);
        Ok(d.changes)
    }
}

/// Journal lines for the interface's changes. Additions and removals the daemon asked for are
/// already logged by it ("peer added"), so here they are debug unless the periodic pass
/// found them (someone changed the interface by hand).
fn log_changes(iface: &str, changes: &[MeshChange], periodic: bool) {
    for c in changes {
        match c {
            MeshChange::Added {
                key,
                node_id,
                endpoint,
            } if periodic => {
                tracing::info!(interface = iface, peer = %node_id, peer_key = %key, endpoint = ?endpoint, "wireguard: a desired peer was missing from the interface; configured it again");
            }
            MeshChange::Added {
                key,
                node_id,
                endpoint,
            } => {
                tracing::debug!(interface = iface, peer = %node_id, peer_key = %key, endpoint = ?endpoint, "wireguard: peer configured");
            }
            MeshChange::Removed { key } if periodic => {
                tracing::info!(interface = iface, peer_key = %key, "wireguard: removed a peer nobody wants from the interface");
            }
            MeshChange::Removed { key } => {
                tracing::debug!(interface = iface, peer_key = %key, "wireguard: peer removed");
            }
            MeshChange::EndpointChanged { key, from, to } => {
                tracing::info!(interface = iface, peer_key = %key, from = ?from, to = %to, "wireguard: endpoint of peer {key} set to {to}");
            }
            MeshChange::AllowedIpsChanged { key, from, to } => {
                tracing::info!(interface = iface, peer_key = %key, from = ?from, to = ?to, "wireguard: allowed IPs replaced");
            }
            MeshChange::KeepaliveChanged { key, from, to } => {
                tracing::info!(interface = iface, peer_key = %key, from, to, "wireguard: persistent keepalive changed");
            }
            // The daemon names the peers its apply skipped.
            MeshChange::Skipped { node_id, reason } if periodic => {
                tracing::warn!(interface = iface, peer = %node_id, "wireguard: peer not configured: {reason}");
            }
            MeshChange::Skipped { .. } => {}
        }
    }
}
