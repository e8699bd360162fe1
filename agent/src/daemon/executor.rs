//! The executor: one loop over [`Input`], performing the core's effects. It never waits for
//! the network (calls and the event stream are tasks that post their answers back), the mesh
//! ([`MeshThread`], a queue of [`super::mesh_thread::MESH_QUEUE`]) or the disk
//! ([`DiskThread`], a queue of one cache write plus the leave's removal); the input channel
//! holds [`INPUT_QUEUE`] inputs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::core::io::{self, Call, CallResult, Effect, MeshAnswer, Now, Outcome, ReachOp};
use super::core::protocol::Answer;
use super::core::reload::ReloadError;
use super::core::{ControlId, Core, IDLE_WAKE};
use super::disk::DiskThread;
use super::host_addrs;
use super::input::{Input, Signal};
use super::mesh_thread::MeshThread;
use super::notify;
use super::sse;
use crate::config::Config;
use crate::node_api::NodeApi;
use crate::reach::io::ReachHandle;

/// Inputs waiting for the loop: answers of calls, stream messages, mesh answers, socket
/// requests and signals. Senders wait when it is full (the loop drains it between effects).
pub const INPUT_QUEUE: usize = 256;
/// At most this many inputs already waiting are fed to the core in one turn before its effects
/// run: a burst of events (1,000 nodes registering) is settled once per turn, not once per event
/// (`Core::poll_effect`), and a turn still ends after a bounded amount of work.
pub const MAX_TURN_INPUTS: usize = INPUT_QUEUE;
/// At exit, how long the loop waits for mesh jobs still running (the revocation's removal of
/// every peer): the WireGuard worker's own bound plus a little.
const MESH_DRAIN: Duration = Duration::from_secs(20);

fn now() -> Now {
    Now::new(Instant::now(), SystemTime::now())
}

pub struct Executor {
    pub core: Core,
    pub api: NodeApi,
    pub tx: mpsc::Sender<Input>,
    pub mesh: MeshThread,
    pub disk: DiskThread,
    pub config_file: PathBuf,
    /// For the endpoint report: which host addresses are worth reporting.
    pub mesh_ip: std::net::IpAddr,
    pub mesh_cidr: ipnet::IpNet,
    pub stream: Option<(u64, JoinHandle<()>)>,
    pub waiters: HashMap<ControlId, oneshot::Sender<Answer>>,
    pub next_control: ControlId,
    /// The reach runtime (paths, relays, own candidates); [`crate::reach::io::NoReach`]
    /// without one.
    pub reach: Arc<dyn ReachHandle>,
    /// The state dir (a rotation's files).
    pub paths: crate::paths::StatePaths,
    /// The embedded data plane's UDP GSO/GRO switch ([`crate::mesh::Mesh::udp_offload`]).
    pub udp_offload: Option<Arc<plexd_dataplane::UdpOffloadSwitch>>,
    /// The GSO path probe's thread and results (embedded data plane only).
    pub gso_probe: Option<super::gso_probe::GsoProbe>,
    /// The policy filter's counters (embedded data plane only).
    pub policy_reader: Option<plexd_dataplane::PolicyReader>,
    /// The resolver for mesh names (`dns.enabled`, docs/dns.md).
    pub dns: Option<crate::dns::runtime::Runtime>,
    /// The routes task (reports, probes, the host's routes); docs/routes.md.
    pub routes: Option<crate::routes::RoutesHandle>,
}

impl Executor {
    /// Runs until the core exits; returns why.
    pub async fn run(&mut self, rx: &mut mpsc::Receiver<Input>) -> Outcome {
        let outcome = loop {
            if let Some(o) = self.perform_all() {
                break o;
            }
            let at = self.core.poll_timeout().min(Instant::now() + IDLE_WAKE);
            let deadline = tokio::time::Instant::from_std(at);
            let input = tokio::select! {
                Some(i) = rx.recv() => i,
                () = tokio::time::sleep_until(deadline) => Input::Core(io::Input::Tick),
            };
            self.feed(input);
            for _ in 1..MAX_TURN_INPUTS {
                match rx.try_recv() {
                    Ok(input) => self.feed(input),
                    Err(_) => break,
                }
            }
        };
        // What the mesh still does (the revocation's removal) is named in the journal.
        let until = tokio::time::Instant::now() + MESH_DRAIN;
        while self.core.mesh_jobs_outstanding() > 0 {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(Input::Core(i @ io::Input::Mesh { .. }))) => {
                    self.core.handle(i, now());
                    self.perform_all();
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        if let Some((_, task)) = self.stream.take() {
            task.abort();
        }
        outcome
    }

    fn feed(&mut self, input: Input) {
        match input {
            Input::Core(i) => {
                // What the live peers are read for (status among them) sees the paths too.
                if let io::Input::Mesh {
                    answer: MeshAnswer::Live(_),
                    ..
                } = &i
                {
                    let (paths, own) = (self.reach.paths(), self.reach.own_candidates());
                    self.core.handle(io::Input::ReachRead { paths, own }, now());
                }
                self.core.handle(i, now());
            }
            Input::Signal(Signal::Hup) => {
                let (path, tx) = (self.config_file.clone(), self.tx.clone());
                tokio::spawn(async move {
                    let p = path.clone();
                    let config = tokio::task::spawn_blocking(move || Config::load(&p))
                        .await
                        .map_err(|e| ReloadError::Reader(e.to_string()))
                        .and_then(|r| r.map(Box::new).map_err(ReloadError::from));
                    let _ = tx
                        .send(Input::Core(io::Input::Reload {
                            path,
                            config,
                            log_level_pinned: crate::logging::level_pinned(),
                        }))
                        .await;
                });
            }
            Input::Signal(s) => self.core.handle(io::Input::Stop(s.name()), now()),
            Input::Control(super::core::protocol::Request::ProbeGso, answer)
                if self.gso_probe.is_some() =>
            {
                // A round now; then the status, through the loop like any status request.
                if let Some(probe) = &self.gso_probe {
                    let (done, tx) = (probe.run_now(), self.tx.clone());
                    tokio::spawn(async move {
                        let _ = done.await;
                        let _ = tx
                            .send(Input::Control(
                                super::core::protocol::Request::Status,
                                answer,
                            ))
                            .await;
                    });
                }
            }
            Input::Control(request, answer) => {
                self.next_control += 1;
                let id = self.next_control;
                self.waiters.insert(id, answer);
                self.core.handle(io::Input::Control { id, request }, now());
            }
        }
    }

    /// Performs every effect the core decided on; `Some` when one was the exit.
    fn perform_all(&mut self) -> Option<Outcome> {
        let mut exit = None;
        while let Some(e) = self.core.poll_effect() {
            if let Some(o) = self.perform(e) {
                exit.get_or_insert(o);
            }
        }
        exit
    }

    fn perform(&mut self, e: Effect) -> Option<Outcome> {
        match e {
            Effect::Call(call) => self.call(call),
            Effect::OpenStream { conn, resume } => {
                let task = tokio::spawn(sse::connect_once(
                    self.api.clone(),
                    resume,
                    conn,
                    self.tx.clone(),
                ));
                if let Some((_, old)) = self.stream.replace((conn, task)) {
                    old.abort();
                }
            }
            Effect::CloseStream { conn } => {
                if let Some((c, task)) = self.stream.take() {
                    if c == conn {
                        task.abort();
                    } else {
                        self.stream = Some((c, task));
                    }
                }
            }
            Effect::Mesh { id, op } => {
                if let Err(answer) = self.mesh.ask(id, op) {
                    self.core.handle(io::Input::Mesh { id, answer }, now());
                }
            }
            Effect::SaveCache(w) => self.disk.save(w),
            Effect::SaveDomainKeys(keys) => self.disk.save_keys(keys),
            Effect::RemoveNodeFiles => self.disk.remove_node_files(),
            Effect::Notify(pairs) => {
                let pairs: Vec<(&str, &str)> =
                    pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
                notify::notify(&pairs);
            }
            Effect::SetLogLevel(level) => {
                if let Err(e) = crate::logging::set_level(&level) {
                    tracing::warn!("SIGHUP: cannot change the log level: {e}");
                }
            }
            Effect::Answer { id, mut answer } => {
                // The core knows the setting; what the socket does is the data plane's.
                if let (Answer::Status(report), Some(switch)) = (&mut answer, &self.udp_offload) {
                    let s = switch.state();
                    report.udp_offload.gso = Some(s.gso);
                    report.udp_offload.gro = Some(s.gro);
                    report.udp_offload.applied = Some(s.applied);
                }
                if let (Answer::Status(report), Some(probe)) = (&mut answer, &self.gso_probe) {
                    report.gso_probe = Some(probe.status(Instant::now()));
                }
                if let (Answer::Status(report), Some(dns)) = (&mut answer, &self.dns) {
                    report.dns = Some(dns.status());
                }
                if let Some(reader) = &self.policy_reader {
                    let status = match &mut answer {
                        Answer::Status(report) => report.policy.as_mut(),
                        Answer::Policy(report) => Some(&mut report.status),
                        _ => None,
                    };
                    if let Some(status) = status {
                        super::policy_status::add_counters(status, reader);
                    }
                }
                if let (Answer::Status(report), Some(routes)) = (&mut answer, &self.routes) {
                    report.routes = Some(routes.status());
                }
                if let Some(w) = self.waiters.remove(&id) {
                    let _ = w.send(answer);
                }
            }
            Effect::UdpOffload(setting) => match &self.udp_offload {
                Some(switch) => {
                    let allowed = setting != Some(plexsphere_wire::node::UdpOffload::Off);
                    tracing::info!(
                        udp_offload = setting.map_or("default", |s| s.as_str()),
                        "the signed state switches UDP GSO/GRO {}",
                        if allowed { "on" } else { "off" }
                    );
                    switch.set(allowed);
                }
                None => {
                    tracing::info!(udp_offload = ?setting, "the signed state sets UDP offload; this backend has no switch for it (the kernel module decides its own)")
                }
            },
            Effect::Reach(op) => match op {
                ReachOp::Peers(peers) => self.reach.set_peers(peers),
                ReachOp::Relays { relays, stun } => self.reach.set_relays(relays, stun),
                ReachOp::RelayToken(token) => self.reach.set_relay_token(token),
            },
            Effect::Routes(op) => {
                if let Some(routes) = &self.routes {
                    routes.send(op);
                }
            }
            Effect::PromoteKey => {
                tokio::spawn(super::rotate::promote(self.paths.clone()));
            }
            Effect::DiscardPendingKey => {
                tokio::spawn(super::rotate::discard(self.paths.clone()));
            }
            Effect::Dns(zone) => {
                if let Some(dns) = &self.dns {
                    dns.update(zone);
                }
            }
            Effect::Exit(o) => return Some(o),
        }
        None
    }

    /// Runs a node API call as a task that posts its answer back.
    fn call(&self, call: Call) {
        let (api, tx) = (self.api.clone(), self.tx.clone());
        let paths = self.paths.clone();
        let (mesh_ip, mesh_cidr) = (self.mesh_ip, self.mesh_cidr);
        let own = match &call {
            Call::Endpoints(_) => self.reach.own_candidates(),
            _ => Default::default(),
        };
        tokio::spawn(async move {
            let result = match call {
                Call::Heartbeat(hb) => CallResult::Heartbeat(api.heartbeat(&hb).await),
                Call::Endpoints(mut report) => {
                    let addresses = match host_addrs::host_addresses() {
                        Ok(a) => host_addrs::reportable(a, mesh_ip, &mesh_cidr),
                        Err(e) => {
                            tracing::warn!("cannot read the host's addresses: {e}; reporting none");
                            vec![]
                        }
                    };
                    host_addrs::fill_report(&mut report, addresses, own);
                    CallResult::Endpoints(api.endpoints(&report).await)
                }
                Call::State { applied } => CallResult::State(api.state(applied).await),
                Call::Ingest(batch) => CallResult::Ingest(api.ingest(&batch).await),
                Call::Leave => CallResult::Leave(api.leave().await),
                Call::RotateKey => {
                    CallResult::RotateKey(super::rotate::rotate_key(api, paths).await)
                }
                Call::RotateCredential => {
                    CallResult::RotateCredential(super::rotate::rotate_credential(api, paths).await)
                }
                Call::SigningKeys => CallResult::SigningKeys(api.signing_keys().await),
            };
            let _ = tx.send(Input::Core(io::Input::Call(result))).await;
        });
    }
}
