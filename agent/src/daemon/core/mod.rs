//! The daemon's core: every decision of `plexd run`, with no sockets, tasks, clocks or files.
//!
//! Like quinn-proto's connection and Firezone's `snownet::Node`: the executor hands it one
//! [`Input`] at a time with the time it happened ([`Now`]) through [`Core::handle`], takes the
//! [`Effect`]s it decided on through [`Core::poll_effect`], and sleeps until
//! [`Core::poll_timeout`]. Jitter comes from the [`Jitter`] it was given, so a test with a fixed
//! seed steps through exactly the delays production would pick. Logging goes through
//! `tracing` (a facade: the subscriber the binary installs decides where lines go).
//!
//! | input                     | what the core decides                                         |
//! |---------------------------|---------------------------------------------------------------|
//! | `Tick`                    | watchdog (only while the mesh answers), due tasks, stream open/stall |
//! | `CacheLoaded`             | apply the cached state before the API answers                 |
//! | `Call(..)`                | success resets backoff; failure backs off; 401/403 end the node |
//! | `Stream{..}`              | connected, frames (verified, applied, cached), ended, resync  |
//! | `Mesh{..}`                | name the changes, READY=1, heartbeat/ingest/status that waited on the live peers |
//! | `Control{..}`             | status (after a live read), leave (call, teardown, files, exit) |
//! | `Reload{..}`              | what changes now, what waits for a restart                    |
//! | `ReachRead{..}`           | paths kept for status; changed own candidates report soon     |
//! | a verified document       | the Domain key's announcement, promotion, or the key chain ([`domain_keys`]) |
//! | `Observe(..)`             | an `error` observation (the GSO probe's lost path)            |
//!
//! The wanted peers, relays and relay tokens go to the reach runtime as `Effect::Reach`
//! ([`reach`]).
//!
//! The parts: [`stream`] (the event stream's lifecycle and frames), [`answers`] (call and mesh
//! answers, the state install, the leave), [`reload`] (SIGHUP), [`report`] (heartbeat, the
//! observations, `plexd status`), [`watchdog`] (is the mesh answering), [`wanted`] (the peer
//! set), [`tick`] (what a deadline starts), [`io`] (the input and effect types).
//!
//! The plain types and pure functions the decisions use live here too, so the core names
//! nothing of the daemon outside this folder (`scripts/import-rules` checks it; the shell may
//! import the core, never the reverse): [`accept`] (verifying signed state and events),
//! [`cache`] (the cache file's shape and its verification), [`schedule`] (the periodic tasks
//! and their jitter), [`ingest`] (the observation queue), [`protocol`] (the status socket's
//! JSON), [`status`] and [`policy_status`] (what `plexd status` and `plexd policy` answer),
//! [`leave`] (what a leave's answer means).

pub mod accept;
pub mod answers;
pub mod api_health;
pub mod cache;
pub mod domain_keys;
pub mod domain_keys_state;
pub mod ingest;
pub mod install;
pub mod io;
pub mod leave;
pub mod mesh_apply;
mod mesh_jobs;
pub mod names;
pub mod owed;
pub mod policy;
pub mod policy_status;
pub mod protocol;
pub mod reach;
pub mod reach_state;
pub mod readiness;
pub mod reload;
pub mod report;
pub mod rotation;
pub mod rotation_state;
pub mod schedule;
pub mod status;
pub mod stream;
pub mod stream_state;
pub mod tick;
pub mod wanted;
pub mod watchdog;

#[cfg(test)]
pub(crate) mod accept_fixtures;
#[cfg(test)]
mod accept_tests;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use plexsphere_wire::Intervals;
use plexsphere_wire::node::Event;
use plexsphere_wire::signed::SignedEnvelope;

use crate::backoff::Backoff;
use crate::config::Config;
use crate::identity::Identity;
use crate::jitter::Jitter;
use crate::paths::StatePaths;
use accept::Acceptor;
use api_health::ApiHealth;
use cache::CachedEvent;
use ingest::IngestQueue;
pub use io::{
    Call, CallResult, ControlId, Effect, Input, MeshAnswer, MeshJobId, MeshOp, Now, Outcome,
    ReachOp, StreamMsg,
};
use mesh_jobs::{LiveFor, MeshJobs, Pending};
use reach_state::ReachFeed;
use readiness::Readiness;
use schedule::Schedule;
use stream_state::EventStream;
use wanted::DesiredPeers;
use watchdog::Watchdog;

pub const DELETED: &str =
    "the node no longer exists on the control plane; run plexd leave and enrol again";
pub const REVOKED: &str = "this node was revoked by an operator (node_revoked); its peers were removed and its credential no longer works; run plexd leave and enrol again with a fresh bootstrap token";

/// Past this many cached events, pull the full state (which folds them in).
pub const MAX_CACHED_EVENTS: usize = 512;
/// While a leave is in flight, other calls that find the node gone wait this long to retry.
pub const LEAVING_RETRY: Duration = Duration::from_secs(30);
/// The executor's loop wakes at least this often, even when [`Core::poll_timeout`] is later
/// (a very long `daemon.stall_timeout_secs`).
pub(crate) const IDLE_WAKE: Duration = Duration::from_secs(3600);

/// A leave asked for on the socket: who waits for the answer, and the control plane's note
/// once it deregistered.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Leaving {
    waiter: ControlId,
    note: Option<String>,
}

/// Everything the core needs to start.
pub struct Setup {
    pub identity: Identity,
    pub paths: StatePaths,
    pub config: Config,
    pub acceptor: Acceptor,
    /// `none`, `kernel` or `userspace`.
    pub backend: &'static str,
    /// How often to send `WATCHDOG=1`, when systemd asked for it.
    pub watchdog: Option<Duration>,
    pub jitter: Jitter,
    /// The age of the key and the credential, and an unfinished key rotation.
    pub rotation: rotation_state::RotationStart,
}

pub struct Core {
    id: Identity,
    paths: StatePaths,
    config: Config,
    acceptor: Acceptor,
    backend: &'static str,
    jitter: Jitter,
    effects: VecDeque<Effect>,
    exited: bool,
    /// What the stream's events owe, done once when the effects run out (`install.rs`).
    owed: owed::Owed,

    wanted: DesiredPeers,
    envelope: Option<SignedEnvelope>,
    state_version: Option<u64>,
    /// The signed state's access policy (None: it carries none), sent with every apply.
    policy: Option<Arc<plexsphere_wire::node::PolicyState>>,
    /// What `plexd status` says of it (`policy`).
    policy_status: policy_status::PolicyStatus,
    /// The signed state's names (docs/dns.md), and the table last handed to the resolver.
    dns: Option<plexsphere_wire::routes::DnsState>,
    dns_sent: Option<Arc<crate::dns::zone::Zone>>,
    /// The hash of the inputs `dns_sent` was built from (`names.rs`).
    dns_key: Option<u64>,
    /// The signed state's UDP GSO/GRO switch, as last handed to the data plane.
    udp_offload: Option<plexsphere_wire::node::UdpOffload>,
    /// Events applied on top of `envelope`, in order.
    events: Vec<(Event, CachedEvent)>,
    last_seq: u64,
    /// The next state pull is unconditional (no `If-None-Match`): after a resync, and once a
    /// state from the API is older than [`STATE_REFRESH`].
    full_pull: bool,
    /// A state older than this is refused (`install.rs`, `state_accept_floor`): the newest
    /// state installed, raised by a resync's seq, and at start the cache's last seq.
    state_floor: u64,
    /// When the last signed state from the API was applied.
    last_api_state: Option<Instant>,

    server_intervals: Intervals,
    schedule: Schedule,
    /// How the control plane answered lately, and the backoff of failed calls.
    api: ApiHealth,
    ingest: IngestQueue,
    /// Per peer public key: last handshake and byte counters seen.
    seen: HashMap<String, (Option<SystemTime>, u64, u64)>,
    /// The event stream's connection, its ids, disconnects and reconnect backoff.
    stream: EventStream,

    /// Mesh jobs asked for and not answered yet, with what they were for.
    mesh_jobs: MeshJobs,
    /// READY=1 and what it waits for (the first apply, its cache write).
    readiness: Readiness,
    watchdog: Watchdog,

    started: Instant,
    last_heartbeat: Option<Instant>,
    last_event: Option<Instant>,
    status_line: String,
    leaving: Option<Leaving>,

    /// What the reach runtime was told last (so it is told only changes) and said last.
    reach: ReachFeed,
    /// Key and credential rotation.
    rotations: rotation_state::Rotations,
    /// The Domain key chain's fetch (a rotation this node missed).
    key_chain: domain_keys_state::KeyChainFetch,
}

/// An unchanged answer (`304`, unsigned) is trusted for this long after the last signed state:
/// then the node pulls the whole signed state again, so a transport that answers `304` forever
/// cannot freeze it for longer without being noticed.
pub const STATE_REFRESH: Duration = Duration::from_secs(3600);
/// A signed state from the API whose `issued_at` is older than this is refused as a replay.
pub const MAX_STATE_AGE: Duration = Duration::from_secs(6 * 3600);

impl Core {
    pub fn new(s: Setup, now: Now) -> Self {
        let d = &s.config.daemon;
        let server_intervals = s.identity.intervals;
        let schedule = Schedule::new(
            d.intervals.apply(server_intervals),
            Duration::from_secs(d.min_interval_secs),
            now.at,
        );
        let backoff = || {
            Backoff::new(
                Duration::from_millis(d.backoff_initial_ms),
                Duration::from_secs(d.backoff_cap_secs),
                Duration::from_secs(d.healthy_after_secs),
            )
        };
        let mut core = Self {
            api: ApiHealth::new(backoff()),
            stream: EventStream::new(backoff(), now.at),
            ingest: IngestQueue::new(d.ingest_capacity),
            id: s.identity,
            paths: s.paths,
            acceptor: s.acceptor,
            backend: s.backend,
            jitter: s.jitter,
            effects: VecDeque::new(),
            exited: false,
            owed: owed::Owed::default(),
            wanted: DesiredPeers::default(),
            envelope: None,
            state_version: None,
            policy: None,
            policy_status: Default::default(),
            udp_offload: None,
            dns: None,
            dns_sent: None,
            dns_key: None,
            events: vec![],
            last_seq: 0,
            full_pull: false,
            state_floor: 0,
            last_api_state: None,
            server_intervals,
            schedule,
            seen: HashMap::new(),
            mesh_jobs: MeshJobs::default(),
            readiness: Readiness::default(),
            watchdog: Watchdog::new(s.watchdog, now.at),
            started: now.at,
            last_heartbeat: None,
            last_event: None,
            status_line: String::new(),
            leaving: None,
            reach: ReachFeed::default(),
            rotations: Default::default(),
            key_chain: Default::default(),
            config: s.config,
        };
        core.start_rotations(s.rotation, now);
        core
    }

    /// The next effect to perform, in the order the core decided them.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        if self.effects.is_empty() {
            self.settle_owed();
        }
        self.effects.pop_front()
    }

    /// Whether the core decided to end (an `Exit` was emitted); later inputs only finish
    /// what is in flight (mesh answers are still named in the journal).
    pub fn exited(&self) -> bool {
        self.exited
    }

    /// Mesh jobs not answered yet (the executor waits for them, with a bound, at exit).
    pub fn mesh_jobs_outstanding(&self) -> usize {
        self.mesh_jobs.outstanding()
    }

    /// The running config (what the last reload kept).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The next deadline: the executor sleeps at most until then (and at most [`IDLE_WAKE`])
    /// and ticks the core (`Input::Tick`); a moment already past means at once. There is always
    /// one, because the event stream always waits for something: its reconnect or its stall
    /// deadline.
    pub fn poll_timeout(&self) -> Instant {
        let mut at = self.stream.poll_timeout(self.stall_timeout());
        if let Some(t) = self.schedule.next_due() {
            at = at.min(t);
        }
        if let Some(t) = self.watchdog.next_due() {
            at = at.min(t);
        }
        if let Some(t) = self.rotations.next_due() {
            at = at.min(t);
        }
        at
    }

    pub fn handle(&mut self, input: Input, now: Now) {
        if self.exited {
            // Only what is already in flight: the revocation's peer removal is still named.
            if let Input::Mesh { id, answer } = input {
                self.on_mesh(id, answer, now);
            }
            return;
        }
        match input {
            Input::Tick => self.on_tick(now),
            Input::Stop(signal) => self.exit(Outcome::Stopped(signal)),
            Input::CacheLoaded(cached) => self.on_cache(cached, now),
            Input::Reload {
                path,
                config,
                log_level_pinned,
            } => self.reload(&path, config, log_level_pinned, now),
            Input::Stream { conn, msg } => {
                if self.stream.is_current(conn) {
                    self.on_stream(msg, now);
                }
            }
            Input::Call(r) => self.on_call(r, now),
            Input::Mesh { id, answer } => self.on_mesh(id, answer, now),
            Input::Control { id, request } => self.on_control(id, request, now),
            Input::NodeFilesRemoved(files) => self.on_files_removed(&files),
            Input::CacheSaved(id) => {
                if self.readiness.saved(id) {
                    self.become_ready_when_settled();
                }
            }
            Input::ReachRead { paths, own } => self.on_reach_read(paths, own, now),
            Input::Observe(message) => self.error_observation(message, now),
        }
    }

    fn emit(&mut self, e: Effect) {
        if let Effect::Exit(_) = e {
            self.exited = true;
        }
        self.effects.push_back(e);
    }

    fn exit(&mut self, o: Outcome) {
        self.emit(Effect::Exit(o));
    }

    fn stall_timeout(&self) -> Duration {
        Duration::from_secs(self.config.daemon.stall_timeout_secs)
    }

    /// Asks the mesh thread for a job and remembers what for.
    fn ask_mesh(&mut self, op: MeshOp, pending: Pending, now: Now) {
        let id = self.mesh_jobs.ask(pending);
        self.watchdog.asked(id, now.at);
        self.emit(Effect::Mesh { id, op });
    }

    fn read_live(&mut self, why: LiveFor, now: Now) {
        self.ask_mesh(MeshOp::ReadLive, Pending::Live(why), now);
    }

    fn error_observation(&mut self, message: String, now: Now) {
        self.ingest.push(plexsphere_wire::node::Observation {
            at: now.unix(),
            kind: plexsphere_wire::node::ObservationKind::Error { message },
        });
    }

    /// Whether `plexd leave` asked this daemon to deregister and the answer is outstanding.
    fn is_leaving(&self) -> bool {
        self.leaving.is_some()
    }

    /// The control plane refused this host's use of the credential (`clone_refused`): this
    /// state dir is a copy. End at once (exit 16) and change nothing: the mesh, the files
    /// and the node on the control plane belong to the original.
    fn cloned(&mut self) {
        let message = crate::identity::host::clone_message(
            &self.paths.dir,
            self.id.node_id,
            crate::identity::host::NoticedBy::ControlPlane,
        );
        self.exit(Outcome::Cloned(message));
    }

    /// The revocation: remove every peer, then end (exit 15).
    fn revoked(&mut self, now: Now) {
        self.wanted = DesiredPeers::default();
        self.feed_reach_peers();
        self.mesh_jobs.set_apply_again(false);
        self.ask_apply(Arc::new(vec![]), now);
        self.exit(Outcome::Gone(REVOKED.to_owned()));
    }
}
