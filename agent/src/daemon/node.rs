//! The daemon's state and what it does with each input. Decisions come from the pure modules
//! (schedule, backoff, accept, peers, ingest); this file wires them to the mesh, the cache,
//! systemd and the spawned calls. Nothing here waits on the network.

use std::collections::HashMap;
use std::future::Future;
use std::ops::ControlFlow;
use std::time::{Duration, Instant, SystemTime};

use plexsphere_wire::Intervals;
use plexsphere_wire::node::{
    EndpointReport, EventKind, Heartbeat, NodeState, Observation, ObservationKind, PeerSummary,
};
use plexsphere_wire::signed::SignedEnvelope;
use rand_core::{OsRng, RngCore as _};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::accept::Acceptor;
use super::backoff::{self, Backoff};
use super::cache::{self, CachedEvent};
use super::calls::{CallError, NodeApi, StateAnswer};
use super::endpoints;
use super::ingest::IngestQueue;
use super::input::{Answer, CallResult, Input, Request, Signal};
use super::leave;
use super::mesh::Mesh;
use super::notify;
use super::peers::{self, Delta, DesiredPeers, PeerChange};
use super::schedule::{Schedule, Task};
use super::sse::{self, StreamMsg};
use super::status::{ApiStatus, IngestStatus, PeerStatus, StatusReport};
use crate::config::Config;
use crate::exit::ExitCode;
use crate::identity::Identity;
use crate::paths::StatePaths;

/// Why the loop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A signal: exit 0, the interface stays as it is.
    Stopped(&'static str),
    /// `plexd leave` through the socket finished.
    Left,
    /// Revoked or deleted on the control plane (exit 15); the message says what to do.
    Gone(String),
}

pub const DELETED: &str =
    "the node no longer exists on the control plane; run plexd leave and enrol again";
pub const REVOKED: &str = "this node was revoked by an operator (node_revoked); its peers were removed and its credential no longer works; run plexd leave and enrol again with a fresh bootstrap token";

/// A handshake counts as "connected" this long.
const CONNECTED_WINDOW: Duration = Duration::from_secs(180);
/// Past this many cached events, pull the full state (which folds them in).
const MAX_CACHED_EVENTS: usize = 512;
/// While a leave is in flight, other calls that find the node gone wait this long to retry.
const LEAVING_RETRY: Duration = Duration::from_secs(30);

enum Stream {
    Waiting {
        until: Instant,
    },
    Open {
        conn: u64,
        task: JoinHandle<()>,
        connected_at: Option<Instant>,
        last_activity: Instant,
    },
}

pub struct Daemon {
    id: Identity,
    paths: StatePaths,
    config_file: std::path::PathBuf,
    pub config: Config,
    api: NodeApi,
    acceptor: Acceptor,
    mesh: Box<dyn Mesh>,
    tx: mpsc::Sender<Input>,

    desired: DesiredPeers,
    envelope: Option<SignedEnvelope>,
    state_version: Option<u64>,
    /// Events applied on top of `envelope`, in order.
    events: Vec<(plexsphere_wire::node::Event, CachedEvent)>,
    last_seq: u64,

    server_intervals: Intervals,
    schedule: Schedule,
    api_backoff: Backoff,
    stream_backoff: Backoff,
    ingest: IngestQueue,
    /// Per peer public key: last handshake and byte counters seen.
    seen: HashMap<String, (Option<SystemTime>, u64, u64)>,
    stream: Stream,
    next_conn: u64,

    started: Instant,
    last_ok: Option<Instant>,
    last_error: Option<(Instant, String)>,
    reachable: bool,
    last_heartbeat: Option<Instant>,
    last_event: Option<Instant>,
    ready: bool,
    status_line: String,
    watchdog: Option<(Duration, Instant)>,
    leave_waiter: Option<oneshot::Sender<Answer>>,
}

fn jitter() -> f64 {
    (OsRng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

impl Daemon {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: Identity,
        paths: StatePaths,
        config_file: std::path::PathBuf,
        config: Config,
        api: NodeApi,
        acceptor: Acceptor,
        mesh: Box<dyn Mesh>,
        tx: mpsc::Sender<Input>,
        now: Instant,
    ) -> Self {
        let d = &config.daemon;
        let server_intervals = id.intervals;
        let schedule = Schedule::new(
            d.intervals.apply(server_intervals),
            Duration::from_secs(d.min_interval_secs),
            now,
        );
        let backoff = || {
            Backoff::new(
                Duration::from_millis(d.backoff_initial_ms),
                Duration::from_secs(d.backoff_cap_secs),
                Duration::from_secs(d.healthy_after_secs),
            )
        };
        Self {
            api_backoff: backoff(),
            stream_backoff: backoff(),
            ingest: IngestQueue::new(d.ingest_capacity),
            id,
            paths,
            config_file,
            api,
            acceptor,
            mesh,
            tx,
            desired: DesiredPeers::default(),
            envelope: None,
            state_version: None,
            events: vec![],
            last_seq: 0,
            server_intervals,
            schedule,
            seen: HashMap::new(),
            stream: Stream::Waiting { until: now },
            next_conn: 0,
            started: now,
            last_ok: None,
            last_error: None,
            reachable: false,
            last_heartbeat: None,
            last_event: None,
            ready: false,
            status_line: String::new(),
            watchdog: notify::watchdog_interval().map(|i| (i, now)),
            leave_waiter: None,
            config,
        }
    }

    /// Applies the cached state (verified again) so the mesh works before the API answers.
    pub fn load_cache(&mut self) {
        let path = self.paths.dir.join(cache::STATE_FILE_NAME);
        match cache::load(&path, &self.acceptor) {
            Ok(None) => tracing::info!("no cached state yet; waiting for the control plane"),
            Ok(Some(c)) => {
                tracing::info!(
                    state_version = c.state.version,
                    last_event_id = c.last_seq,
                    peers = c.state.peers.len(),
                    "applying the cached state"
                );
                self.events = c.events;
                self.last_seq = c.last_seq;
                self.install_state(c.state, c.envelope, false);
            }
            Err(e) => tracing::warn!("{e}; starting without it"),
        }
    }

    /// The next instant the loop must wake up at.
    pub fn next_wake(&self, now: Instant) -> Instant {
        let mut at = now + Duration::from_secs(3600);
        if let Some(t) = self.schedule.next_due() {
            at = at.min(t);
        }
        at = at.min(match &self.stream {
            Stream::Waiting { until } => *until,
            Stream::Open { last_activity, .. } => *last_activity + self.stall_timeout(),
        });
        if let Some((_, t)) = self.watchdog {
            at = at.min(t);
        }
        at
    }

    fn stall_timeout(&self) -> Duration {
        Duration::from_secs(self.config.daemon.stall_timeout_secs)
    }

    pub fn handle(&mut self, input: Input, now: Instant) -> ControlFlow<Outcome> {
        match input {
            Input::Tick => self.on_tick(now),
            Input::Signal(Signal::Hup) => {
                self.reload(now);
                ControlFlow::Continue(())
            }
            Input::Signal(s) => ControlFlow::Break(Outcome::Stopped(s.name())),
            Input::Stream { conn, msg } => match &self.stream {
                Stream::Open { conn: c, .. } if *c == conn => self.on_stream(msg, now),
                _ => ControlFlow::Continue(()),
            },
            Input::Call(r) => self.on_call(r, now),
            Input::Control(Request::Status, answer) => {
                let _ = answer.send(Answer::Status(Box::new(self.report(now))));
                ControlFlow::Continue(())
            }
            Input::Control(Request::Leave, answer) => {
                if self.leave_waiter.is_some() {
                    let _ = answer.send(Answer::error(
                        "a leave is already in progress",
                        ExitCode::Io,
                    ));
                } else {
                    tracing::info!("leaving the mesh: deregistering from the control plane");
                    self.leave_waiter = Some(answer);
                    let api = self.api.clone();
                    self.spawn(async move { api.leave().await }, CallResult::Leave);
                }
                ControlFlow::Continue(())
            }
        }
    }

    fn spawn<T: Send + 'static>(
        &self,
        fut: impl Future<Output = T> + Send + 'static,
        wrap: fn(T) -> CallResult,
    ) {
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let r = fut.await;
            let _ = tx.send(Input::Call(wrap(r))).await;
        });
    }

    fn on_tick(&mut self, now: Instant) -> ControlFlow<Outcome> {
        if let Some((interval, at)) = self.watchdog
            && at <= now
        {
            notify::notify(&[("WATCHDOG", "1")]);
            self.watchdog = Some((interval, now + interval));
        }
        for task in self.schedule.take_due(now) {
            self.start(task, now);
        }
        match &self.stream {
            Stream::Waiting { until } if *until <= now => self.open_stream(now),
            Stream::Open { last_activity, .. } if *last_activity + self.stall_timeout() <= now => {
                let reason = format!(
                    "no bytes for {} s, the stream stalled",
                    self.stall_timeout().as_secs()
                );
                if let Stream::Open { task, .. } = &self.stream {
                    task.abort();
                }
                self.stream_ended(reason, None, now);
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn start(&mut self, task: Task, now: Instant) {
        let api = self.api.clone();
        match task {
            Task::Heartbeat => {
                let live = self.mesh.live_peers().unwrap_or_default();
                let connected = live
                    .iter()
                    .filter(|p| {
                        p.last_handshake
                            .is_some_and(|t| t.elapsed().is_ok_and(|e| e < CONNECTED_WINDOW))
                    })
                    .count();
                let hb = Heartbeat {
                    uptime_secs: now.duration_since(self.started).as_secs(),
                    plexd_version: env!("CARGO_PKG_VERSION").to_owned(),
                    state_version: self.state_version,
                    peers: PeerSummary {
                        configured: u32::try_from(live.len()).unwrap_or(u32::MAX),
                        connected: u32::try_from(connected).unwrap_or(u32::MAX),
                    },
                };
                self.spawn(
                    async move { api.heartbeat(&hb).await },
                    CallResult::Heartbeat,
                );
            }
            Task::EndpointReport => {
                let addrs = match endpoints::host_addresses() {
                    Ok(a) => endpoints::reportable(a, self.id.mesh_ip, &self.id.mesh_cidr),
                    Err(e) => {
                        tracing::warn!("cannot read the host's addresses: {e}; reporting none");
                        vec![]
                    }
                };
                let report = EndpointReport {
                    listen_port: self.config.wireguard.listen_port,
                    addresses: addrs,
                };
                self.spawn(
                    async move { api.endpoints(&report).await },
                    CallResult::Endpoints,
                );
            }
            Task::StatePoll => {
                let applied = self.state_version;
                self.spawn(async move { api.state(applied).await }, CallResult::State);
            }
            Task::IngestFlush => {
                self.observe();
                match self.ingest.take_batch() {
                    Some(batch) => {
                        self.spawn(async move { api.ingest(&batch).await }, CallResult::Ingest)
                    }
                    None => self.schedule.done(Task::IngestFlush, now, jitter()),
                }
            }
        }
    }

    /// Turns changes on the interface (handshakes, bytes) into observations.
    fn observe(&mut self) {
        let Ok(live) = self.mesh.live_peers() else {
            return;
        };
        let desired = self.desired.list();
        let by_key: HashMap<&str, uuid::Uuid> = desired
            .iter()
            .map(|p| (p.public_key.as_str(), p.node_id))
            .collect();
        let at = unix_now();
        let mut obs = vec![];
        for p in &live {
            let Some(peer) = by_key.get(p.public_key.as_str()).copied() else {
                continue;
            };
            let prev = self.seen.insert(
                p.public_key.clone(),
                (p.last_handshake, p.rx_bytes, p.tx_bytes),
            );
            if p.last_handshake.is_some() && prev.map(|x| x.0) != Some(p.last_handshake) {
                obs.push(ObservationKind::Handshake {
                    peer_node_id: peer,
                    endpoint: p.endpoint,
                });
            }
            if prev.map(|x| (x.1, x.2)) != Some((p.rx_bytes, p.tx_bytes))
                && (p.rx_bytes, p.tx_bytes) != (0, 0)
            {
                obs.push(ObservationKind::Traffic {
                    peer_node_id: peer,
                    rx_bytes: p.rx_bytes,
                    tx_bytes: p.tx_bytes,
                });
            }
        }
        for kind in obs {
            self.ingest.push(Observation { at, kind });
        }
    }

    fn error_observation(&mut self, message: String) {
        self.ingest.push(Observation {
            at: unix_now(),
            kind: ObservationKind::Error { message },
        });
    }

    /// The common part of every call's result. `Break` for revoked or deleted.
    fn settle<T>(
        &mut self,
        task: Task,
        res: &Result<T, CallError>,
        now: Instant,
    ) -> ControlFlow<Outcome> {
        match res {
            Ok(_) => {
                self.reachable = true;
                self.last_ok = Some(now);
                self.api_backoff.reset();
                self.schedule.done(task, now, jitter());
            }
            Err(CallError::Unauthorized | CallError::Revoked) if self.leaving() => {
                // The server forgot this node because it is leaving: the leave's own answer
                // ends the daemon (and answers `plexd leave`), not this call.
                tracing::debug!(
                    task = task.name(),
                    "the control plane no longer knows this node; waiting for the leave to finish"
                );
                self.schedule.failed(task, now, LEAVING_RETRY, jitter());
            }
            Err(CallError::Unauthorized) => {
                return ControlFlow::Break(Outcome::Gone(DELETED.to_owned()));
            }
            Err(CallError::Revoked) => return ControlFlow::Break(self.revoked()),
            Err(e) => {
                self.reachable = !matches!(e, CallError::Unreachable(_));
                let delay = self.api_backoff.next_delay(jitter(), e.retry_after());
                tracing::warn!(
                    task = task.name(),
                    "{} failed: {e}; retrying in {} s",
                    task.name(),
                    backoff::secs_text(delay)
                );
                self.last_error = Some((now, format!("{}: {e}", task.name())));
                self.schedule.failed(task, now, delay, jitter());
            }
        }
        ControlFlow::Continue(())
    }

    fn on_call(&mut self, r: CallResult, now: Instant) -> ControlFlow<Outcome> {
        match r {
            CallResult::Heartbeat(res) => {
                self.settle(Task::Heartbeat, &res, now)?;
                if let Ok(ack) = res {
                    self.last_heartbeat = Some(now);
                    self.server_intervals = ack.intervals;
                    let merged = self.config.daemon.intervals.apply(ack.intervals);
                    self.schedule.set_intervals(merged, now, jitter());
                    let known = self.state_version.unwrap_or(0).max(self.last_seq);
                    if ack.state_version > known || self.state_version.is_none() {
                        self.schedule.run_soon(Task::StatePoll, now);
                    }
                }
            }
            CallResult::Endpoints(res) => {
                self.settle(Task::EndpointReport, &res, now)?;
                if let Ok(ack) = res {
                    tracing::debug!(observed = %ack.observed, endpoints = ?ack.endpoints, "endpoints reported");
                }
            }
            CallResult::State(res) => {
                self.settle(Task::StatePoll, &res, now)?;
                match res {
                    Ok(StateAnswer::Body(body)) => match self
                        .acceptor
                        .state_json(&body, self.state_version)
                    {
                        Ok((state, env)) => self.install_state(state, env, true),
                        Err(refusal) => {
                            tracing::warn!(applied_version = ?self.state_version, "refused a state document from the control plane: {refusal}; keeping the last good state");
                            self.error_observation(format!("state document refused: {refusal}"));
                        }
                    },
                    Ok(StateAnswer::NotModified) => tracing::debug!("state unchanged (304)"),
                    Err(_) => {}
                }
            }
            CallResult::Ingest(res) => {
                match &res {
                    Ok(()) => self.ingest.acknowledge(),
                    Err(e) if e.is_final() => {
                        let n = self.ingest.discard();
                        tracing::warn!(
                            "the control plane refused an ingest batch of {n} observations: {e}; they are counted as dropped"
                        );
                    }
                    Err(_) => self.ingest.retry_later(),
                }
                self.settle(Task::IngestFlush, &res, now)?;
            }
            CallResult::Leave(res) => {
                let waiter = self.leave_waiter.take();
                let (answer, flow) =
                    match leave::finish(&self.id, res, &self.paths, self.mesh.as_mut()) {
                        Ok(message) => {
                            tracing::info!("{message}");
                            (Answer::Left { message }, ControlFlow::Break(Outcome::Left))
                        }
                        Err(f) => {
                            tracing::warn!("{}", f.message);
                            (Answer::error(f.message, f.code), ControlFlow::Continue(()))
                        }
                    };
                if let Some(w) = waiter {
                    let _ = w.send(answer);
                }
                return flow;
            }
        }
        self.update_status();
        ControlFlow::Continue(())
    }

    /// A verified state: replaces the desired set; events newer than it are applied again.
    fn install_state(&mut self, state: NodeState, env: SignedEnvelope, save: bool) {
        let version = state.version;
        self.desired = DesiredPeers::from_state(&state);
        self.events.retain(|(e, _)| e.seq > version);
        for (e, _) in &self.events {
            self.desired.apply(&e.kind);
        }
        self.state_version = Some(version);
        self.envelope = Some(env);
        self.last_seq = self.last_seq.max(version);
        tracing::info!(
            state_version = version,
            peers = self.desired.len(),
            "applied the signed state version {version} with {} peers",
            self.desired.len()
        );
        self.apply_mesh();
        if save {
            self.save_cache();
        }
        self.become_ready();
    }

    fn apply_mesh(&mut self) {
        match self.mesh.apply(&self.desired.list()) {
            Ok(changes) => log_changes(&changes),
            Err(e) => {
                tracing::error!("cannot apply the peers: {e}");
                self.error_observation(e.to_string());
            }
        }
        self.update_status();
    }

    fn save_cache(&mut self) {
        let Some(env) = &self.envelope else { return };
        let frames: Vec<CachedEvent> = self.events.iter().map(|(_, f)| f.clone()).collect();
        let path = self.paths.dir.join(cache::STATE_FILE_NAME);
        if let Err(e) = cache::save(&path, env, &frames, self.last_seq) {
            tracing::warn!(
                "cannot save the state cache: {e}; a restart without the API would start without peers"
            );
        }
    }

    fn become_ready(&mut self) {
        if self.ready {
            return;
        }
        self.ready = true;
        self.status_line = self.current_status_line();
        tracing::info!(peers = self.desired.len(), state_version = ?self.state_version, "ready: {} peers, state version {}", self.desired.len(), self.state_version.map_or_else(|| "none".to_owned(), |v| v.to_string()));
        notify::notify(&[("READY", "1"), ("STATUS", self.status_line.as_str())]);
    }

    fn current_status_line(&self) -> String {
        let connected = matches!(
            self.stream,
            Stream::Open {
                connected_at: Some(_),
                ..
            }
        );
        notify::status_line(
            &self.id.node_id.to_string(),
            &self.id.mesh_ip.to_string(),
            self.desired.len(),
            connected,
        )
    }

    /// Whether `plexd leave` asked this daemon to deregister and the answer is outstanding.
    fn leaving(&self) -> bool {
        self.leave_waiter.is_some()
    }

    fn update_status(&mut self) {
        let line = self.current_status_line();
        if self.ready && line != self.status_line {
            notify::notify(&[("STATUS", line.as_str())]);
        }
        self.status_line = line;
    }

    /// Removes every peer (the revocation) and returns the outcome.
    fn revoked(&mut self) -> Outcome {
        self.desired = DesiredPeers::default();
        match self.mesh.apply(&[]) {
            Ok(changes) => log_changes(&changes),
            Err(e) => tracing::error!("cannot remove the peers after the revocation: {e}"),
        }
        Outcome::Gone(REVOKED.to_owned())
    }

    fn open_stream(&mut self, now: Instant) {
        self.next_conn += 1;
        let conn = self.next_conn;
        let resume = (self.last_seq > 0).then_some(self.last_seq);
        tracing::debug!(conn, last_event_id = ?resume, "opening the event stream");
        let task = tokio::spawn(sse::connect_once(
            self.api.clone(),
            resume,
            conn,
            self.tx.clone(),
        ));
        self.stream = Stream::Open {
            conn,
            task,
            connected_at: None,
            last_activity: now,
        };
    }

    fn stream_ended(&mut self, reason: String, retry_after: Option<Duration>, now: Instant) {
        if let Stream::Open {
            connected_at: Some(t),
            ..
        } = &self.stream
        {
            self.stream_backoff
                .connection_lasted(now.duration_since(*t));
        }
        let delay = self.stream_backoff.next_delay(jitter(), retry_after);
        tracing::warn!(
            "event stream disconnected ({reason}), retrying in {} s",
            backoff::secs_text(delay)
        );
        self.last_error = Some((now, format!("event stream: {reason}")));
        self.stream = Stream::Waiting { until: now + delay };
        self.update_status();
    }

    fn on_stream(&mut self, msg: StreamMsg, now: Instant) -> ControlFlow<Outcome> {
        if let Stream::Open { last_activity, .. } = &mut self.stream {
            *last_activity = now;
        }
        match msg {
            StreamMsg::Connected => {
                if let Stream::Open { connected_at, .. } = &mut self.stream {
                    *connected_at = Some(now);
                }
                self.reachable = true;
                self.last_ok = Some(now);
                tracing::info!(
                    last_event_id = self.last_seq,
                    "event stream connected (resuming after event {})",
                    self.last_seq
                );
                self.update_status();
            }
            StreamMsg::Activity => {}
            StreamMsg::Frame { id, event, data } => {
                self.last_event = Some(now);
                return self.on_frame(id, &event, data, now);
            }
            StreamMsg::Ended {
                fatal: Some(CallError::Revoked),
                ..
            } if !self.leaving() => return ControlFlow::Break(self.revoked()),
            StreamMsg::Ended { fatal: Some(_), .. } if !self.leaving() => {
                return ControlFlow::Break(Outcome::Gone(DELETED.to_owned()));
            }
            // While leaving, a stream the server ends for good is expected: the leave's own
            // answer ends the daemon.
            StreamMsg::Ended {
                reason,
                retry_after,
                ..
            } => self.stream_ended(reason, retry_after, now),
        }
        ControlFlow::Continue(())
    }

    fn on_frame(
        &mut self,
        id: Option<String>,
        event: &str,
        data: String,
        now: Instant,
    ) -> ControlFlow<Outcome> {
        let ev = match self.acceptor.event(id.as_deref(), &data) {
            Ok(ev) => ev,
            Err(refusal) => {
                tracing::warn!(
                    event,
                    "refused an event from the stream: {refusal}; keeping the last good state"
                );
                self.error_observation(format!("event refused: {refusal}"));
                return ControlFlow::Continue(());
            }
        };
        if let EventKind::Resync { reason } = &ev.kind {
            // A resync always wins, even with a seq at or below ours: the server's log may have
            // been reset behind our position. Forget the applied version so the next pull is a
            // full one and may carry a lower version than the one we had.
            tracing::info!(
                seq = ev.seq,
                last_event_id = self.last_seq,
                "the control plane asked for a resync ({reason}); pulling the full state"
            );
            self.last_seq = ev.seq;
            self.state_version = None;
            self.schedule.run_soon(Task::StatePoll, now);
            return ControlFlow::Continue(());
        }
        if ev.seq <= self.last_seq {
            tracing::debug!(
                seq = ev.seq,
                last_event_id = self.last_seq,
                "event already applied"
            );
            return ControlFlow::Continue(());
        }
        tracing::debug!(seq = ev.seq, event, "event");
        let delta = self.desired.apply(&ev.kind);
        self.last_seq = ev.seq;
        let frame = CachedEvent { id: ev.seq, data };
        match delta {
            Delta::Revoked if self.leaving() => {
                // The server ends a leaving node's stream this way; the leave's answer ends the
                // daemon.
                tracing::debug!("the control plane closed this node's stream for its leave");
            }
            Delta::Revoked => return ControlFlow::Break(self.revoked()),
            Delta::Resync(reason) => {
                tracing::info!(
                    seq = ev.seq,
                    "the control plane asked for a resync ({reason}); pulling the full state"
                );
                self.schedule.run_soon(Task::StatePoll, now);
            }
            Delta::UnknownPeer(peer) => {
                tracing::info!(%peer, "an endpoint change for an unknown peer; pulling the full state");
                self.events.push((ev, frame));
                self.schedule.run_soon(Task::StatePoll, now);
            }
            Delta::Changed => {
                self.events.push((ev, frame));
                self.apply_mesh();
            }
            Delta::Unchanged => self.events.push((ev, frame)),
        }
        if self.events.len() > MAX_CACHED_EVENTS {
            self.schedule.run_soon(Task::StatePoll, now);
        }
        self.save_cache();
        ControlFlow::Continue(())
    }

    /// SIGHUP: re-read the config; apply what can change at run time, name what cannot.
    /// What waits for a restart keeps its running value in `self.config`, so nothing reads a
    /// value the data plane does not use yet (the endpoint report's port, the status's
    /// interface), and the next SIGHUP names it again while it is still pending.
    fn reload(&mut self, now: Instant) {
        let path = self.config_path();
        let mut new = match Config::load(&path) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(
                    "SIGHUP: the config was not reloaded: {e}; keeping the running config"
                );
                return;
            }
        };
        let old = self.config.clone();
        let mut changed = vec![];
        if old.log.level != new.log.level {
            let level = new
                .log
                .level
                .as_ref()
                .map_or("info", |l| l.as_str())
                .to_owned();
            if crate::logging::level_pinned() {
                tracing::info!(
                    "SIGHUP: log.level changed to {level}, but PLEXD_LOG/--log-level overrides it"
                );
            } else if let Err(e) = crate::logging::set_level(&level) {
                tracing::warn!("SIGHUP: cannot change the log level: {e}");
            }
            changed.push(format!("log.level -> {level}"));
        }
        if old.daemon != new.daemon {
            let merged = new.daemon.intervals.apply(self.server_intervals);
            self.schedule.set_intervals(merged, now, jitter());
            changed.push("daemon (intervals and stall timeout apply now; the backoff and ingest sizes after a restart)".to_owned());
        }
        if old.api_url != new.api_url {
            // An enrolled node keeps the origin saved in its identity, also across restarts.
            let to = new.api_url.as_ref().map_or("(none)", |u| u.as_str());
            tracing::warn!(
                "SIGHUP: api_url changed to {to}, but this node stays with {} where it registered (saved in {}), also after a restart; a new api_url is used when the node enrols again (plexd leave, then start plexd with a fresh bootstrap token)",
                self.id.api_url,
                self.paths.identity_file().display()
            );
            changed.push("api_url (used when the node enrols again)".to_owned());
        }
        for (key, differs) in [
            ("tls", old.tls != new.tls),
            ("wireguard", old.wireguard != new.wireguard),
            ("state_dir", old.state_dir != new.state_dir),
        ] {
            if differs {
                tracing::warn!("SIGHUP: {key} changed; it takes effect when plexd restarts");
                changed.push(format!("{key} (after a restart)"));
            }
        }
        new.api_url = old.api_url;
        new.tls = old.tls;
        new.wireguard = old.wireguard;
        new.state_dir = old.state_dir;
        self.config = new;
        if changed.is_empty() {
            tracing::info!(config = %path.display(), "SIGHUP: config reloaded; nothing changed");
        } else {
            tracing::info!(config = %path.display(), "SIGHUP: config reloaded: {}", changed.join(", "));
        }
    }

    fn config_path(&self) -> std::path::PathBuf {
        self.config_file.clone()
    }

    pub fn report(&self, now: Instant) -> StatusReport {
        let age = |t: Option<Instant>| t.map(|t| now.saturating_duration_since(t).as_secs());
        let live = self.mesh.live_peers().unwrap_or_default();
        let peers = self
            .desired
            .list()
            .into_iter()
            .map(|p| {
                let l = live.iter().find(|l| l.public_key == p.public_key);
                PeerStatus {
                    node_id: p.node_id,
                    endpoint: l
                        .and_then(|l| l.endpoint)
                        .or_else(|| peers::first_endpoint(&p)),
                    last_handshake_age_secs: l
                        .and_then(|l| l.last_handshake)
                        .and_then(|t| t.elapsed().ok())
                        .map(|d| d.as_secs()),
                    rx_bytes: l.map_or(0, |l| l.rx_bytes),
                    tx_bytes: l.map_or(0, |l| l.tx_bytes),
                    hostname: p.hostname,
                    mesh_ip: p.mesh_ip,
                }
            })
            .collect();
        StatusReport {
            node_id: self.id.node_id,
            mesh_ip: self.id.mesh_ip,
            mesh_cidr: self.id.mesh_cidr.to_string(),
            domain_id: self.id.domain_id,
            project_id: self.id.project_id,
            plexd_version: env!("CARGO_PKG_VERSION").to_owned(),
            uptime_secs: now.duration_since(self.started).as_secs(),
            api: ApiStatus {
                url: self.id.api_url.clone(),
                reachable: self.reachable,
                last_success_age_secs: age(self.last_ok),
                last_error: self.last_error.as_ref().map(|(_, e)| e.clone()),
                last_error_age_secs: age(self.last_error.as_ref().map(|(t, _)| *t)),
            },
            last_heartbeat_age_secs: age(self.last_heartbeat),
            last_event_age_secs: age(self.last_event),
            event_stream_connected: matches!(
                self.stream,
                Stream::Open {
                    connected_at: Some(_),
                    ..
                }
            ),
            last_event_id: self.last_seq,
            state_version: self.state_version,
            backend: self.mesh.backend().to_owned(),
            interface: self.config.wireguard.interface.clone(),
            ingest: IngestStatus {
                waiting: self.ingest.waiting(),
                dropped_unreported: self.ingest.dropped(),
            },
            peers,
        }
    }

    /// Stops the stream task (shutdown).
    pub fn stop(&mut self) {
        if let Stream::Open { task, .. } = &self.stream {
            task.abort();
        }
    }
}

fn log_changes(changes: &[PeerChange]) {
    for c in changes {
        let p = c.peer();
        let endpoint = peers::first_endpoint(p);
        tracing::info!(
            peer = %p.node_id,
            hostname = %p.hostname,
            peer_mesh_ip = %p.mesh_ip,
            endpoint = ?endpoint,
            "{} {} ({}, mesh IP {}, endpoint {})",
            c.verb(),
            p.node_id,
            p.hostname,
            p.mesh_ip,
            endpoint.map_or_else(|| "none yet".to_owned(), |e| e.to_string())
        );
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
