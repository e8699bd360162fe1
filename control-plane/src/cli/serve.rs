//! `plexsphere serve`, and the steps `plexsphere dev` (`cli::dev`) shares with it.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use time::OffsetDateTime;

use super::admin::open_store;
use super::args::ServeArgs;
use super::downloads::{self as dl, DownloadArgs};
use super::failure::Failure;
use super::knobs::{BrokerArgs, LimitArgs, NodeApiArgs};
use crate::api::{self, ApiConfig, AppState};
use crate::broker::BrokerConfig;
use crate::broker::local_machine::{LocalMachine, LocalMachineConfig};
use crate::broker::substrate::Substrate;
use crate::keys::Keyring;
use crate::seed::{self, Manifest, SeedReport};
use crate::server::{self, Transport};
use crate::store::Store;
use crate::tls;

pub(super) fn parse_listen(listen: &str) -> Result<SocketAddr, Failure> {
    listen.parse().map_err(|_| {
        Failure::Config(format!(
            "--listen {listen:?} is not an address with a port, like 0.0.0.0:8443 or [::]:8443"
        ))
    })
}

pub(super) fn api_config(
    limits: &LimitArgs,
    node_api: &NodeApiArgs,
    ca_pem: Option<String>,
) -> Result<ApiConfig, Failure> {
    let mut config = ApiConfig {
        register_rate_limit: limits.rate_limit().map_err(Failure::Config)?,
        node_rate_limit: api::NodeRateLimit(limits.node_rate_limit().map_err(Failure::Config)?),
        trusted_proxies: limits.trusted_proxies.clone(),
        ca_pem,
        ..ApiConfig::default()
    };
    node_api.apply(&mut config).map_err(Failure::Config)?;
    Ok(config)
}

pub(super) fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, Failure> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )
    .context("cannot make a TCP socket")?;
    // As std's bind: a restarted server takes its port back at once.
    socket
        .set_reuse_address(true)
        .context("cannot set SO_REUSEADDR")?;
    socket
        .bind(&addr.into())
        .with_context(|| format!("cannot listen on {addr}; is another process using it?"))?;
    socket
        .listen(server::LISTEN_BACKLOG)
        .with_context(|| format!("cannot listen on {addr}"))?;
    socket
        .set_nonblocking(true)
        .context("cannot make the listener non-blocking")?;
    Ok(socket.into())
}

/// Binds `--metrics-listen` when given.
pub(super) fn bind_metrics(
    addr: Option<SocketAddr>,
) -> Result<Option<std::net::TcpListener>, Failure> {
    addr.map(|a| {
        bind(a).map_err(|e| match e {
            Failure::Runtime(e) => Failure::Runtime(e.context("--metrics-listen")),
            other => other,
        })
    })
    .transpose()
}

/// How one process serves: its connection bounds and its broker lease.
pub(super) struct Serving {
    limits: server::ServerLimits,
    lease: crate::leader::LeaseTiming,
}

pub(super) fn serving(limits: &LimitArgs, broker: &BrokerArgs) -> Result<Serving, Failure> {
    if broker.leader_lease_secs < 3 {
        return Err(Failure::Config(
            "--leader-lease-secs must be at least 3 (the lease is renewed every third of it)"
                .into(),
        ));
    }
    Ok(Serving {
        limits: limits.server_limits().map_err(Failure::Config)?,
        lease: crate::leader::LeaseTiming {
            ttl: std::time::Duration::from_secs(broker.leader_lease_secs),
        },
    })
}

/// Serves until SIGTERM/SIGINT, after printing the machine-readable `listening on` line (and
/// `metrics on` for `--metrics-listen`).
pub(super) async fn run(
    listener: std::net::TcpListener,
    transport: Transport,
    state: AppState,
    downloads: Arc<plexsphere_downloads::Downloads>,
    metrics: Option<std::net::TcpListener>,
    serving: Serving,
) -> Result<(), Failure> {
    let addr = listener
        .local_addr()
        .context("cannot read the bound address")?;
    // Install the signal handlers before the line that tells supervisors we are up.
    let signal = server::shutdown_signal();
    println!("listening on {}://{addr}", transport.scheme());
    let _ = std::io::stdout().flush();
    tracing::info!(address = %addr, scheme = transport.scheme(), "serving the plexsphere API");
    let store = state.store.clone();
    // One replica of those sharing the database runs the broker and maintenance.
    let leadership = Arc::new(crate::leader::Leadership::lease(
        crate::leader::Leadership::new_holder_id(),
        serving.lease,
    ));
    let state = Arc::new(state.with_leadership(leadership.clone()));
    let (stop_lease, lease_stopped) = tokio::sync::watch::channel(false);
    let lease = crate::leader::spawn(store.clone(), leadership, lease_stopped);
    let maintenance = crate::maintenance::spawn(&state);
    let reconcile = crate::broker::reconcile::spawn(&state);
    let app = api::router(state.clone()).merge(plexsphere_downloads::router(downloads));
    let metrics = match metrics {
        Some(m) => {
            let at = m.local_addr().context("cannot read the metrics address")?;
            println!("metrics on http://{at}/metrics");
            let _ = std::io::stdout().flush();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(server::run(
                m,
                Transport::PlainBehindProxy,
                api::metrics_router(state.clone()),
                async move {
                    let _ = stopped.await;
                },
            ));
            Some((stop, task))
        }
        None => None,
    };
    let shutdown = async move {
        signal.await;
        // Event streams never end by themselves: end them so the drain finishes promptly.
        state.streams.close_all();
    };
    server::run_with(listener, transport, app, shutdown, serving.limits)
        .await
        .context("the server stopped with an error")?;
    if let Some((stop, task)) = metrics {
        let _ = stop.send(());
        if let Ok(Err(e)) = task.await {
            tracing::warn!(error = %e, "the metrics listener stopped with an error");
        }
    }
    maintenance.abort();
    reconcile.abort();
    let _ = stop_lease.send(true);
    if let Some(lease) = lease {
        let _ = lease.await;
    }
    store.close().await;
    tracing::info!("stopped");
    Ok(())
}

pub(super) async fn apply_seed(
    store: &Store,
    manifest: &Manifest,
    origin: &str,
) -> Result<SeedReport, Failure> {
    let report = seed::apply(store, manifest, origin, OffsetDateTime::now_utc())
        .await
        .map_err(|e| Failure::Runtime(e.into()))?;
    Ok(report)
}

pub(crate) async fn serve(args: ServeArgs) -> Result<(), Failure> {
    // Validate everything before binding anything.
    let addr = parse_listen(&args.listen)?;
    let transport = match (&args.tls_cert, &args.tls_key, args.tls_terminated_by_proxy) {
        (Some(cert), Some(key), false) => {
            tls::install_ring_provider();
            Transport::Tls(
                tls::server_config(cert, key).map_err(|e| Failure::Config(e.to_string()))?,
            )
        }
        (None, None, true) => Transport::PlainBehindProxy,
        (_, _, true) => {
            return Err(Failure::Config(
                "--tls-terminated-by-proxy serves plain HTTP; drop --tls-cert/--tls-key or drop the flag".into(),
            ));
        }
        _ => {
            return Err(Failure::Config(
                "serving needs --tls-cert and --tls-key (PEM), or --tls-terminated-by-proxy when a proxy terminates TLS".into(),
            ));
        }
    };
    let manifest = match &args.seed {
        Some(path) => Some(seed::load(path).map_err(|e| Failure::Config(e.to_string()))?),
        None => None,
    };
    if let Some(url) = &args.public_url
        && !(url.starts_with("https://") || url.starts_with("http://"))
    {
        return Err(Failure::Config(format!(
            "--public-url {url:?} must start with https:// or http://"
        )));
    }
    let config = api_config(&args.limits, &args.node_api, None)?;
    let nats = args.bus.config()?;
    let kek = super::keys::replica_kek(args.key_encryption_key_file.as_deref())?;
    let pepper = super::audit::serve_pepper(args.audit_pepper_file.as_deref())?;
    let serving = serving(&args.limits, &args.broker)?;
    let downloads_config = args.downloads.config(&args.data.data_dir)?;
    let catalog = load_catalog(&args.broker)?;
    if matches!(transport, Transport::PlainBehindProxy) {
        tracing::warn!(
            "serving plain HTTP: a reverse proxy must terminate TLS in front of this server"
        );
        if config.trusted_proxies.is_empty() {
            tracing::warn!(
                "no --trusted-proxy is set: every request is rate-limited as the proxy's own address"
            );
        }
    }

    let store = open_store(&args.data).await?;
    if let (Some(m), Some(path)) = (&manifest, &args.seed) {
        let report = apply_seed(&store, m, &path.display().to_string()).await?;
        tracing::info!(changed = report.changed(), file = %path.display(), "seed applied");
    }
    let keys = Keyring::new(store.clone(), kek, &args.data.data_dir);
    keys.prepare_all().await.map_err(super::keys::key_failure)?;
    let machines = local_machines(&args.broker, &args.data.data_dir);
    let listener = bind(addr)?;
    let metrics = bind_metrics(args.metrics_listen)?;
    let bound = reachable(
        listener
            .local_addr()
            .context("cannot read the bound address")?,
    );
    let public_url = args
        .public_url
        .clone()
        .unwrap_or_else(|| format!("{}://{bound}", transport.scheme()));
    let ca_file = args.data.data_dir.join("tls").join("ca.crt");
    let ca_pem = std::fs::read_to_string(&ca_file).ok();
    let auth = args.oidc.auth(&public_url).map_err(Failure::Config)?;
    let broker = broker_config(&args.broker, catalog, public_url, ca_pem, machines);
    let postgres = args
        .data
        .database_url
        .as_deref()
        .is_some_and(|u| u.starts_with("postgres:") || u.starts_with("postgresql:"));
    let (bus, bus_tasks) = super::bus::start(nats, &store, postgres).await?;
    let state = AppState::with_broker_config(store, &args.data.data_dir, config, broker)
        .with_bus(bus)
        .with_keyring(keys)
        .with_audit_pepper(pepper)
        .with_auth(auth);
    let downloads = open_downloads(&args.downloads, downloads_config, &state, None).await?;
    let stun = match args.stun_listen {
        Some(a) => Some(super::relay::start_stun(a, &args.stun_limits).await?),
        None => None,
    };
    let result = run(listener, transport, state, downloads, metrics, serving).await;
    if let Some(task) = stun {
        task.abort();
    }
    drop(bus_tasks);
    result
}

/// The built-in blueprints plus the operator's files.
pub(super) fn load_catalog(args: &BrokerArgs) -> Result<plexsphere_broker::Catalog, Failure> {
    let mut catalog =
        plexsphere_broker::Catalog::builtin().map_err(|e| Failure::Config(e.to_string()))?;
    for path in &args.blueprints {
        catalog
            .add_path(path)
            .map_err(|e| Failure::Config(format!("--blueprints {}: {e}", path.display())))?;
    }
    if args.reconcile_secs == 0 {
        return Err(Failure::Config(
            "--reconcile-secs must be at least 1".into(),
        ));
    }
    Ok(catalog)
}

pub(super) fn broker_config(
    args: &BrokerArgs,
    catalog: plexsphere_broker::Catalog,
    public_url: String,
    ca_pem: Option<String>,
    local_machine: Result<Arc<dyn Substrate>, String>,
) -> BrokerConfig {
    if local_machine.is_ok() {
        let host = args.machine_bridge_address.addr().to_string();
        if !public_url.contains(&host) {
            tracing::warn!(public_url = %public_url, "local machines reach this server at {host}, and the public URL names another host: listen on {host} (or 0.0.0.0 with --san {host}) and pass --public-url https://{host}:<port>");
        }
    }
    BrokerConfig {
        public_url: Some(public_url),
        ca_pem,
        reconcile_every: std::time::Duration::from_secs(args.reconcile_secs),
        local_machine,
        ..BrokerConfig::new(catalog)
    }
}

/// The local-machine substrate when this host can run machines (its bridge is made now, so
/// the server can listen on the bridge address), or why not.
pub(super) fn local_machines(
    args: &BrokerArgs,
    data_dir: &Path,
) -> Result<Arc<dyn Substrate>, String> {
    if args.no_local_machines {
        return Err("local machines are turned off (--no-local-machines)".into());
    }
    let machines = LocalMachine::new(LocalMachineConfig {
        state_dir: data_dir.join("nspawn"),
        image_cache: args.machine_image_cache.clone(),
        bridge: args.machine_bridge.clone(),
        bridge_address: args.machine_bridge_address,
    });
    match machines {
        Ok(m) => {
            tracing::info!(bridge = %args.machine_bridge, address = %args.machine_bridge_address, "local machines are available (systemd-nspawn)");
            Ok(Arc::new(m))
        }
        Err(why) => {
            tracing::info!(reason = %why, "local machines are not available on this host");
            Err(why)
        }
    }
}

pub(super) async fn open_downloads(
    args: &DownloadArgs,
    config: plexsphere_downloads::DownloadsConfig,
    state: &AppState,
    default_domain: Option<&str>,
) -> Result<Arc<plexsphere_downloads::Downloads>, Failure> {
    let slug = args.plexd_signing_domain.as_deref().or(default_domain);
    dl::open(config, &state.store, &state.keys, slug).await
}

/// The address to put in URLs for a bound address (a wildcard becomes loopback).
pub(super) fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
        }
        IpAddr::V6(v6) if v6.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port())
        }
        _ => addr,
    }
}
