//! What goes into the core and what comes out of it, as plain values.
//!
//! [`Input`] is everything that can happen to `plexd run` (a deadline, a signal's reload, a
//! call's answer, a stream message, a mesh answer, a request on the socket); [`Effect`] is
//! everything the core asks the executor to do. No channel, task or handle crosses this
//! line: answers to socket requests and mesh jobs are matched by the ids the core hands out.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use std::net::SocketAddr;

use plexsphere_wire::node::{
    EndpointAck, EndpointReport, Heartbeat, HeartbeatAck, IngestBatch, PeerSpec, PolicyState,
    RelaySpec,
};
use plexsphere_wire::signed::SignedEnvelope;

use super::cache::{CacheError, Cached, CachedEvent};
use super::protocol::{Answer, Request};
use super::reload::ReloadError;
use crate::config::Config;
use crate::mesh::LivePeer;
use crate::mesh::MeshError;
use crate::mesh::diff::MeshChange;
use crate::node_api::{CallError, LeaveAnswer, StateAnswer};
use crate::reach::io::{OwnCandidates, PeerPathView, PeerReach};

/// The two clocks an input arrives with: `at` for deadlines and ages, `wall` for what the
/// interface reports (handshake times) and the observations' timestamps. One type for every
/// sans-IO machine of the project (docs/architecture.md).
pub use plexsphere_wire::clock::Now;

/// Identifies a request on the status socket, so its answer finds its client.
pub type ControlId = u64;
/// Identifies a mesh job, so its answer finds what asked for it.
pub type MeshJobId = u64;

/// Everything that can happen to the daemon.
#[derive(Debug)]
pub enum Input {
    /// A deadline may have passed (a task is due, the stream may reconnect or has stalled,
    /// the watchdog).
    Tick,
    /// SIGTERM or SIGINT (named): stop, leaving the interface as it is.
    Stop(&'static str),
    /// What the cache file held at start (already verified), or why it could not be used.
    CacheLoaded(Result<Option<Box<Cached>>, CacheError>),
    /// SIGHUP: the config file read again (or why it could not be), and whether
    /// `PLEXD_LOG`/`--log-level` pins the log level.
    Reload {
        path: PathBuf,
        config: Result<Box<Config>, ReloadError>,
        log_level_pinned: bool,
    },
    /// A message of event-stream connection `conn` (stale connections are ignored).
    Stream { conn: u64, msg: StreamMsg },
    /// A call the core asked for finished.
    Call(CallResult),
    /// The mesh answered job `id`.
    Mesh { id: MeshJobId, answer: MeshAnswer },
    /// A request on the status socket.
    Control { id: ControlId, request: Request },
    /// The node's files were removed for a leave (the ones that existed).
    NodeFilesRemoved(Vec<PathBuf>),
    /// The disk thread is done with cache write `id` (written, or failed with a warning), and
    /// so with every earlier one.
    CacheSaved(u64),
    /// What the reach runtime says now, read by the executor right before it hands over each
    /// live-peer answer: the paths (so `plexd status` shows them as they are) and this node's
    /// own candidates (a change brings the endpoint report forward).
    ReachRead {
        paths: Vec<PeerPathView>,
        own: OwnCandidates,
    },
    /// Something a helper thread saw that the control plane should hear, as an `error`
    /// observation (the GSO probe's lost path, with what to do).
    Observe(String),
}

/// What the reach runtime is told ([`crate::reach::io::ReachHandle`]); none of it waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReachOp {
    /// The wanted peers, the whole set, whenever it changed.
    Peers(Vec<PeerReach>),
    /// The relays and STUN servers of the newest signed state, when they changed.
    Relays {
        relays: Vec<RelaySpec>,
        stun: Vec<SocketAddr>,
    },
    /// A newer relay token (from the state or a heartbeat answer).
    RelayToken(SignedEnvelope),
}

/// What one event-stream connection reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamMsg {
    /// The server answered 200 and the stream is open.
    Connected,
    /// One event frame (checked and applied by the core).
    Frame {
        id: Option<String>,
        event: String,
        data: String,
    },
    /// A comment (`: keep-alive`): proof the connection is alive.
    Activity,
    /// The attempt is over; `fatal` is a revocation or a deleted node.
    Ended {
        reason: String,
        retry_after: Option<Duration>,
        fatal: Option<CallError>,
    },
}

/// The answer of a node API call.
#[derive(Debug)]
pub enum CallResult {
    Heartbeat(Result<HeartbeatAck, CallError>),
    Endpoints(Result<EndpointAck, CallError>),
    State(Result<StateAnswer, CallError>),
    Ingest(Result<(), CallError>),
    Leave(Result<LeaveAnswer, CallError>),
    /// A key rotation's calls (challenge and rotation) finished.
    RotateKey(Result<KeyDone, CallError>),
    /// A credential rotation finished: the new credential is saved and in use.
    RotateCredential(Result<(), CallError>),
    /// `GET /v1/nodes/{id}/signing-keys`.
    SigningKeys(Result<plexsphere_wire::signing_keys::SigningKeyChain, CallError>),
}

/// What a successful key rotation call brings: the pending key (for the interface) and what
/// the control plane answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDone {
    pub secret: crate::identity::rotation::KeySecret,
    pub old_public_key: String,
    pub answer: plexsphere_wire::rotation::KeyRotated,
}

/// A node API call to make.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    Heartbeat(Heartbeat),
    /// The endpoint report: the executor adds the host's addresses, filtered by
    /// `host_addrs::reportable` for this node's mesh IP and range.
    Endpoints(EndpointReport),
    /// `GET /state`, conditional on the applied version.
    State {
        applied: Option<u64>,
    },
    Ingest(IngestBatch),
    Leave,
    /// Rotate the WireGuard key: the executor takes the pending key (writing a new one when
    /// there is none), asks for a challenge and sends the rotation.
    RotateKey,
    /// Rotate the credential: the executor asks for one, saves it in the identity and uses it.
    RotateCredential,
    /// Fetch the Domain's key chain (`GET /v1/nodes/{id}/signing-keys`).
    SigningKeys,
}

/// A job for the mesh thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeshOp {
    /// Make the interface's peers equal to these (shared: the core keeps the same list to
    /// name what changed), under this policy (the signed state's; `None`: no filter). The
    /// mesh thread installs the policy's filter FIRST when it differs from the installed
    /// one, and applies no peers while it cannot (the mesh thread's `run_apply`).
    Apply(Arc<Vec<PeerSpec>>, Option<Arc<PolicyState>>),
    /// Read the live peers.
    ReadLive,
    /// Remove the interface (leave).
    Teardown,
    /// Replace the interface's private key (a key rotation).
    SetKey(crate::identity::rotation::KeySecret),
}

/// The mesh thread's answer to one [`MeshOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeshAnswer {
    /// The peers applied, and the policy's install when it was (re)installed first.
    Applied(
        Result<Vec<MeshChange>, MeshError>,
        Option<Result<(), Box<MeshError>>>,
    ),
    Live(Result<Vec<LivePeer>, MeshError>),
    TornDown(Result<(), MeshError>),
    KeySet(Result<(), MeshError>),
    /// The mesh thread's queue was full; the job was not run.
    Busy,
}

/// The cache file's content: the last good signed state and the events on top of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheWrite {
    /// Increases with every write the core asks for; [`Input::CacheSaved`] names it.
    pub id: u64,
    pub envelope: SignedEnvelope,
    pub events: Vec<CachedEvent>,
    pub last_seq: u64,
}

/// Why the daemon ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A signal: exit 0, the interface stays as it is.
    Stopped(&'static str),
    /// `plexd leave` through the socket finished.
    Left,
    /// Revoked or deleted on the control plane (exit 15); the message says what to do.
    Gone(String),
    /// The control plane refused this state dir's credential from this host: it is a copy
    /// (exit 16); the message says what to do.
    Cloned(String),
}

/// What the core asks the executor to do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Make a node API call; its answer comes back as [`Input::Call`].
    Call(Call),
    /// Open event-stream connection `conn`, resuming after `resume`; its messages come back
    /// as [`Input::Stream`].
    OpenStream { conn: u64, resume: Option<u64> },
    /// Stop event-stream connection `conn` (it stalled).
    CloseStream { conn: u64 },
    /// Give the mesh thread a job; its answer comes back as [`Input::Mesh`].
    Mesh { id: MeshJobId, op: MeshOp },
    /// Write the state cache (only the latest write matters); answered by
    /// [`Input::CacheSaved`].
    SaveCache(CacheWrite),
    /// Remove the identity, the cached state and the key (a leave); answered by
    /// [`Input::NodeFilesRemoved`].
    RemoveNodeFiles,
    /// Tell systemd (`READY=1`, `STATUS=...`, `WATCHDOG=1`).
    Notify(Vec<(&'static str, String)>),
    /// Change the log level (SIGHUP).
    SetLogLevel(String),
    /// Answer the socket request `id`.
    Answer { id: ControlId, answer: Answer },
    /// Tell the reach runtime (it answers nothing).
    Reach(ReachOp),
    /// The interface uses the pending key: make it `wireguard.key` (answers nothing; a
    /// failure is logged, and the next start repeats the rotation, which is answered as done).
    PromoteKey,
    /// The control plane refused the pending key for good: remove it.
    DiscardPendingKey,
    /// The signed state's UDP GSO/GRO switch changed: hand it to the data plane (`None`: its
    /// default, on). Answers nothing; `plexd status` shows what the socket does.
    UdpOffload(Option<plexsphere_wire::node::UdpOffload>),
    /// The Domain keys the node trusts changed (an announcement, a promotion, the key chain):
    /// write them to the identity file (answers nothing; a failure is logged, and the node
    /// keeps using them until it stops).
    SaveDomainKeys(super::accept::DomainKeys),
    /// The names the resolver answers changed (docs/dns.md; `None`: no names, every query
    /// REFUSED). Answers nothing.
    Dns(Option<Arc<crate::dns::zone::Zone>>),
    /// Tell the routes task (docs/routes.md; answers nothing).
    Routes(crate::routes::RoutesOp),
    /// End the daemon.
    Exit(Outcome),
}
