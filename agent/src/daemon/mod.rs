//! `plexd run`, what the systemd unit starts: enrol if needed, then keep the node in the mesh.
//!
//! The decisions live in [`core`] (sans-IO: inputs with the time in, effects out, tested by
//! stepping time); [`executor`] is the one loop that feeds it and performs its effects, with
//! HTTP calls and the event stream as tasks, the data plane on [`mesh_thread`] and writes on
//! [`disk`], so the loop never waits on the network, the mesh or the disk. This file sets it
//! up and tears it down.
//!
//! | file            | owns                                                        |
//! |-----------------|-------------------------------------------------------------|
//! | `core/`         | every decision (schedules, backoff, stream, state, leave, reload, watchdog) and the plain types and pure functions they use: verifying signed state (`accept.rs`), the cache file's shape (`cache.rs`), the schedule, the ingest queue, the socket's JSON (`protocol.rs`), the status report (`status.rs`); it imports nothing of this folder (`scripts/import-rules`) |
//! | `executor.rs`   | the loop over [`input::Input`] performing effects           |
//! | `input.rs`      | what wakes the loop: the core's inputs, a signal, a socket request |
//! | `mesh_thread.rs`| the thread that owns the data plane, behind a bounded queue |
//! | `disk.rs`       | the thread that writes the cache and removes files on leave |
//! | `cache.rs`      | the cache file on disk: written 0600 and atomically, read and handed to the core's `decode` |
//! | `leave.rs`      | `plexd leave`: the files removed, the mesh torn down, the leave without a daemon |
//! | `rotate.rs`     | the I/O of a key or credential rotation (files, calls)      |
//! | `sse.rs`, `sse_bound.rs` (tests `sse_tests.rs`; and `crate::node_api`) | the node API calls and the event stream (HTTP), and the bounds on what a stream may make plexd hold |
//! | `socket.rs`     | the status socket (the JSON is `core/protocol.rs`)          |
//! | `status.rs`, `policy_status.rs` | the human tables of `plexd status` and `plexd policy`; the policy's counters read from the data plane |
//! | `metrics.rs`    | the opt-in Prometheus listener                              |
//! | `notify.rs`     | systemd's READY=1, STATUS=, STOPPING=1 and the watchdog     |
//! | `gso_probe.rs`  | the GSO path probe's thread (embedded data plane only)      |
//! | `host_addrs.rs` | the host addresses worth reporting as endpoints             |
//!
//! The backoff the core uses is the crate's (`crate::backoff`).

pub mod cache;
pub mod core;
pub mod disk;
pub mod executor;
pub mod gso_probe;
pub mod host_addrs;
pub mod input;
pub mod leave;
pub mod mesh_thread;
pub mod metrics;
pub mod notify;
pub mod policy_status;
pub mod rotate;
pub mod socket;
pub mod sse;
pub mod sse_bound;
pub mod status;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;
use tracing::Instrument as _;

use self::core::io::{self, Now, Outcome};
use self::core::{Core, Setup};
use crate::api_client::ApiClient;
use crate::config::ApiUrl;
use crate::exit::{ExitCode, Failure};
use crate::join::{self, JoinSettings, Joined};
use crate::mesh::Mesh;
use disk::DiskThread;
use executor::{Executor, INPUT_QUEUE};
use input::{Input, Signal};
use mesh_thread::MeshThread;

/// How long a stopping daemon waits for answers still being written on its socket.
const ANSWER_GRACE: Duration = Duration::from_secs(10);

/// Runs the daemon until a signal, a leave, or the node is revoked/deleted (exit 15).
pub async fn run(settings: &JoinSettings, run_dir: PathBuf) -> Result<(), Failure> {
    let (tx, mut rx) = mpsc::channel::<Input>(INPUT_QUEUE);
    spawn_signals(tx.clone())?;
    // A relayed kernel peer holds a descriptor (its forwarder): take the host's hard limit.
    match crate::fdlimit::raise_open_files() {
        Ok(r) if r.after > r.before => {
            tracing::info!(
                before = r.before,
                after = r.after,
                "raised the open-file limit from {} to {} (a relayed kernel peer holds one)",
                r.before,
                r.after
            );
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(
            "cannot raise the open-file limit to the hard limit ({e}); with the kernel backend each relayed peer holds one descriptor"
        ),
    }
    let identity = match join::join(settings).await? {
        Joined::Registered(id) | Joined::AlreadyEnrolled(id) => id,
    };
    let span =
        tracing::info_span!("plexd", node_id = %identity.node_id, mesh_ip = %identity.mesh_ip);
    async move {
        let bad_identity = |what: String| {
            Failure::new(
                ExitCode::Config,
                format!(
                    "{}: {what}; move it away and enrol the node again",
                    settings.state.identity_file().display()
                ),
            )
        };
        // The pinned Domain key, and the next one when a rotation announced it.
        let acceptor = self::core::accept::Acceptor::from_identity(&identity).map_err(bad_identity)?;
        let url = ApiUrl::parse(&identity.api_url).map_err(|e| bad_identity(format!("api_url: {e}")))?;
        let client = ApiClient::new(url, &settings.trust, settings.dropped_ca.clone())?;
        let host = crate::identity::host::check_or_bind(&settings.state.dir, identity.node_id, &crate::identity::host::machine_id_file(), time::OffsetDateTime::now_utc())?;
        let api = crate::node_api::NodeApi::new(client, identity.node_id, identity.node_credential.clone()).with_host(host);
        // The metrics listener, when configured: bound before anything else listens, so a
        // taken address fails the start with a clear error.
        let metrics_server = match settings.config.metrics.listen {
            Some(addr) => {
                let listener = metrics::bind(addr).await.map_err(|e| Failure::new(ExitCode::Io, e))?;
                tracing::info!(address = %addr, "serving metrics on http://{addr}/metrics");
                Some(tokio::spawn(metrics::serve(listener, tx.clone())))
            }
            None => None,
        };
        let mesh = open_mesh(settings, &identity)?;
        let backend = mesh.backend();
        tracing::info!(api_url = %identity.api_url, backend, interface = %settings.config.wireguard.interface, "starting as node {} with mesh IP {}, against {} with the {backend} data plane on {}", identity.node_id, identity.mesh_ip, identity.api_url, settings.config.wireguard.interface);
        let threads = |e: std::io::Error| Failure::new(ExitCode::Io, format!("cannot start a thread of the daemon: {e}"));
        // The reach handle is taken before the mesh moves to its thread.
        let reach = mesh.reach();
        let udp_offload = mesh.udp_offload();
        let gso_prober = mesh.gso_prober();
        let policy_reader = mesh.policy_reader();
        let mesh = MeshThread::start(mesh, tx.clone()).map_err(threads)?;
        let routes = start_routes(settings, &identity, &api, backend);
        // Each peer's path for the console (issue 28); stops with the daemon.
        let path_report = crate::path_report::PathsHandle::start(api.clone(), reach.clone());
        let disk = DiskThread::start(settings.state.clone(), tx.clone()).map_err(threads)?;

        let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
        let server = match socket::bind(&run_dir) {
            Ok(listener) => Some(tokio::spawn(socket::serve(listener, tx.clone(), alive_tx))),
            Err(e) => {
                drop(alive_tx);
                tracing::warn!("the status socket is not available: {e}; plexd status and plexd leave will not reach this daemon (set PLEXD_RUN_DIR)");
                None
            }
        };

        // The cache is read (and verified) before the loop starts, so the mesh works before
        // the API answers.
        let dns = start_dns(settings, &identity);
        let cached = cache::load(&settings.state.dir.join(cache::STATE_FILE_NAME), &acceptor);
        let (mesh_ip, mesh_cidr) = (identity.mesh_ip, identity.mesh_cidr);
        // The GSO path probe runs with the embedded data plane only (the kernel backend has none).
        let gso_probe = match gso_prober {
            Some(prober) => {
                let setup = gso_probe::ProbeSetup {
                    node_id: identity.node_id,
                    mesh_ip,
                    mtu: usize::from(settings.config.wireguard.mtu),
                };
                Some(gso_probe::GsoProbe::start(prober, setup, tx.clone()).map_err(threads)?)
            }
            None => None,
        };
        let start = Now::new(Instant::now(), SystemTime::now());
        let rotation = rotation_start(settings, &identity);
        let mut core = Core::new(
            Setup {
                identity,
                paths: settings.state.clone(),
                config: settings.config.clone(),
                acceptor,
                backend,
                watchdog: notify::watchdog_interval(),
                jitter: crate::jitter::Jitter::from_os(),
                rotation,
            },
            start,
        );
        core.handle(io::Input::CacheLoaded(cached.map(|c| c.map(Box::new))), start);
        let mut executor = Executor {
            core,
            api,
            tx,
            mesh,
            disk,
            config_file: settings.config_file.clone(),
            mesh_ip,
            mesh_cidr,
            stream: None,
            waiters: HashMap::new(),
            next_control: 0,
            reach,
            paths: settings.state.clone(),
            udp_offload,
            gso_probe,
            policy_reader,
            dns,
            routes: Some(routes),
        };
        let outcome = executor.run(&mut rx).await;
        path_report.stop();
        if let Some(dns) = executor.dns.take() {
            dns.stop().await;
        }
        // Routes are withdrawn and the host's routes, rules and nat table removed while the
        // interface is still there.
        if let Some(routes) = executor.routes.take() {
            routes.stop().await;
        }
        if let Some(server) = metrics_server {
            server.abort();
            let _ = server.await;
        }
        if let Some(server) = server {
            server.abort();
            let _ = server.await;
        }
        // Answers still being written (the one to `plexd leave`) reach their clients first.
        let _ = tokio::time::timeout(ANSWER_GRACE, alive_rx.recv()).await;
        let _ = std::fs::remove_file(socket::socket_path(&run_dir));
        // The last cache write lands; the data plane is released (the embedded one stops).
        // Nothing reads the inputs any more, so a thread's late answer cannot block it.
        drop(rx);
        executor.disk.stop();
        executor.mesh.stop();
        match outcome {
            Outcome::Stopped(signal) => {
                if backend == "userspace" {
                    tracing::info!(signal, "stopping; the embedded data plane and its interface stop with plexd, a restart sets them up again");
                } else {
                    tracing::info!(signal, "stopping; the interface stays as it is");
                }
                notify::notify(&[("STOPPING", "1")]);
                Ok(())
            }
            Outcome::Left => {
                notify::notify(&[("STOPPING", "1")]);
                Ok(())
            }
            Outcome::Gone(message) => Err(Failure::new(ExitCode::NodeGone, message)),
            Outcome::Cloned(message) => Err(Failure::new(ExitCode::Cloned, message)),
        }
    }
    .instrument(span)
    .await
}

/// The routes task: reports, probes and the host's routes (docs/routes.md).
fn start_routes(
    settings: &JoinSettings,
    identity: &crate::identity::Identity,
    api: &crate::node_api::NodeApi,
    backend: &'static str,
) -> crate::routes::RoutesHandle {
    let wg = &settings.config.wireguard;
    let mut ports = vec![wg.listen_port];
    ports.retain(|p| *p != 0);
    crate::routes::RoutesHandle::start(crate::routes::RoutesSetup {
        api: api.clone(),
        iface: wg.interface.clone(),
        mesh: identity.mesh_cidr,
        ports,
        host: backend != "none",
        config: settings.config.routes.clone(),
    })
}

/// The data plane for this node: its key, mesh IP and prefix on the configured backend.
fn open_mesh(
    settings: &JoinSettings,
    identity: &crate::identity::Identity,
) -> Result<Box<dyn Mesh>, Failure> {
    let wg = &settings.config.wireguard;
    if wg.backend == crate::config::Backend::None {
        // Control plane only: no interface, so no key is needed.
        let node =
            crate::mesh::NodeSetup::new([0; 32], identity.mesh_ip, identity.mesh_cidr.prefix_len());
        return crate::mesh::open(wg, &node)
            .map_err(|e| Failure::new(ExitCode::Config, format!("the WireGuard data plane: {e}")));
    }
    let key_file = settings.state.key_file();
    let (key, generated) = crate::identity::NodeKey::load_or_generate(&key_file)
        .map_err(|e| Failure::new(ExitCode::Config, e.to_string()))?;
    if generated {
        return Err(Failure::new(
            ExitCode::Config,
            format!(
                "{} was missing, so this node's registered WireGuard key is lost; run plexd leave and enrol again",
                key_file.display()
            ),
        ));
    }
    let (mesh_ip, cidr) = (identity.mesh_ip, identity.mesh_cidr);
    // The reach runtime's local candidates are the endpoint report's own addresses.
    let mut node = crate::mesh::NodeSetup::new(key.secret().to_bytes(), mesh_ip, cidr.prefix_len())
        .with_local_addrs(move || {
            self::host_addrs::host_addresses()
                .map(|a| self::host_addrs::reportable(a, mesh_ip, &cidr))
                .unwrap_or_default()
        });
    // Relays over TCP check their certificates with the API's trust.
    match crate::tls::client_config(&settings.trust) {
        Ok(c) => node = node.with_relay_tls(c),
        Err(e) => tracing::warn!("relays over TCP with TLS are off: {e}"),
    }
    crate::mesh::open(wg, &node).map_err(|e| {
        let code = if e.is_config() {
            ExitCode::Config
        } else {
            ExitCode::Io
        };
        Failure::new(code, format!("the WireGuard data plane: {e}"))
    })
}

/// How old the key and the credential are, and whether a key rotation was left unfinished.
/// The resolver for mesh names, unless `dns.enabled: false` (docs/dns.md); a port it cannot
/// have is logged and plexd runs without it.
fn start_dns(
    settings: &JoinSettings,
    identity: &crate::identity::Identity,
) -> Option<crate::dns::runtime::Runtime> {
    let config = &settings.config.dns;
    if !config.enabled {
        return None;
    }
    let start = crate::dns::runtime::Start {
        config,
        interface: &settings.config.wireguard.interface,
        mesh_ip: identity.mesh_ip,
        mesh: identity.mesh_cidr,
    };
    crate::dns::runtime::Runtime::start(start)
        .inspect_err(|e| tracing::warn!("{e}"))
        .ok()
}

fn rotation_start(
    settings: &JoinSettings,
    identity: &crate::identity::Identity,
) -> self::core::rotation_state::RotationStart {
    use crate::identity::rotation as files;
    let key_file = settings.state.key_file();
    let now = SystemTime::now();
    let age = |t: SystemTime| now.duration_since(t).unwrap_or_default();
    let pending_key = settings.config.wireguard.backend != crate::config::Backend::None
        && match files::load_pending(&key_file) {
            Ok(p) => p.is_some(),
            Err(e) => {
                tracing::warn!("{e}; a new pending key is made at the next rotation");
                let _ = files::discard(&key_file);
                false
            }
        };
    let credential_at = identity
        .credential_rotated_at
        .unwrap_or(identity.registered_at);
    self::core::rotation_state::RotationStart {
        key_age: files::key_written_at(&key_file).map(age),
        credential_age: Some(age(credential_at.into())),
        pending_key,
    }
}

fn spawn_signals(tx: mpsc::Sender<Input>) -> Result<(), Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let err = |e: std::io::Error| {
        Failure::new(
            ExitCode::Io,
            format!("cannot install the signal handlers: {e}"),
        )
    };
    let mut term = signal(SignalKind::terminate()).map_err(err)?;
    let mut int = signal(SignalKind::interrupt()).map_err(err)?;
    let mut hup = signal(SignalKind::hangup()).map_err(err)?;
    tokio::spawn(async move {
        loop {
            let s = tokio::select! {
                _ = term.recv() => Signal::Term,
                _ = int.recv() => Signal::Int,
                _ = hup.recv() => Signal::Hup,
            };
            if tx.send(Input::Signal(s)).await.is_err() {
                return;
            }
        }
    });
    Ok(())
}
