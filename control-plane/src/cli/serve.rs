//! `plexsphere serve` and `plexsphere dev`.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use time::OffsetDateTime;

use super::admin::{ensure_data_dir, open_store, print_seed_report};
use super::{DevArgs, Failure, LimitArgs, NodeApiArgs, ServeArgs};
use crate::api::{self, ApiConfig, AppState};
use crate::seed::{self, Manifest, SeedReport};
use crate::server::{self, Transport};
use crate::store::Store;
use crate::{operator_tokens, tls};

fn parse_listen(listen: &str) -> Result<SocketAddr, Failure> {
    listen.parse().map_err(|_| {
        Failure::Config(format!(
            "--listen {listen:?} is not an address with a port, like 0.0.0.0:8443 or [::]:8443"
        ))
    })
}

fn api_config(
    limits: &LimitArgs,
    node_api: &NodeApiArgs,
    ca_pem: Option<String>,
) -> Result<ApiConfig, Failure> {
    let mut config = ApiConfig {
        register_rate_limit: limits.rate_limit().map_err(Failure::Config)?,
        trusted_proxies: limits.trusted_proxies.clone(),
        ca_pem,
        ..ApiConfig::default()
    };
    node_api.apply(&mut config).map_err(Failure::Config)?;
    Ok(config)
}

fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, Failure> {
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("cannot listen on {addr}; is another process using it?"))?;
    listener
        .set_nonblocking(true)
        .context("cannot make the listener non-blocking")?;
    Ok(listener)
}

/// Serves until SIGTERM/SIGINT, after printing the machine-readable `listening on` line.
async fn run(
    listener: std::net::TcpListener,
    transport: Transport,
    state: AppState,
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
    let state = Arc::new(state);
    let maintenance = crate::maintenance::spawn(&state);
    let app = api::router(state.clone());
    let shutdown = async move {
        signal.await;
        // Event streams never end by themselves: end them so the drain finishes promptly.
        state.streams.close_all();
    };
    server::run(listener, transport, app, shutdown)
        .await
        .context("the server stopped with an error")?;
    maintenance.abort();
    store.close().await;
    tracing::info!("stopped");
    Ok(())
}

async fn apply_seed(
    store: &Store,
    manifest: &Manifest,
    origin: &str,
) -> Result<SeedReport, Failure> {
    let report = seed::apply(store, manifest, origin, OffsetDateTime::now_utc())
        .await
        .map_err(|e| Failure::Runtime(e.into()))?;
    Ok(report)
}

pub async fn serve(args: ServeArgs) -> Result<(), Failure> {
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
    let listener = bind(addr)?;
    let state = AppState::new(store, &args.data.data_dir, config);
    run(listener, transport, state).await
}

/// The address to put in URLs for a bound address (a wildcard becomes loopback).
fn reachable(addr: SocketAddr) -> SocketAddr {
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

pub async fn dev(args: DevArgs) -> Result<(), Failure> {
    let addr = parse_listen(&args.listen)?;
    let (manifest, origin) = match &args.seed {
        Some(path) => (
            seed::load(path).map_err(|e| Failure::Config(e.to_string()))?,
            path.display().to_string(),
        ),
        None => (
            seed::parse(seed::LAB_SEED, "built-in lab seed")
                .map_err(|e| Failure::Config(e.to_string()))?,
            "built-in lab seed".to_owned(),
        ),
    };
    ensure_data_dir(&args.data.data_dir)?;
    let data_dir = std::path::absolute(&args.data.data_dir).context("cannot resolve --data-dir")?;
    let certs = tls::ensure_dev_certs(&data_dir.join("tls"), &args.sans)
        .context("cannot prepare the lab CA")?;
    tls::install_ring_provider();
    let tls_config = tls::server_config(&certs.server_cert, &certs.server_key)
        .context("cannot load the lab certificate")?;
    let config = api_config(&args.limits, &args.node_api, Some(certs.ca_pem.clone()))?;

    let store = open_store(&args.data).await?;
    let report = apply_seed(&store, &manifest, &origin).await?;
    let token_file = data_dir.join("operator-token");
    if !token_file.exists() {
        let token = operator_tokens::create(&store, "dev", OffsetDateTime::now_utc())
            .await
            .context("cannot create the dev operator token")?;
        tls::write_private(&token_file, format!("{}\n", token.expose()).as_bytes())
            .context("cannot write the operator token file")?;
    }

    let listener = bind(addr)?;
    let bound = reachable(
        listener
            .local_addr()
            .context("cannot read the bound address")?,
    );
    let api_url = format!("https://{bound}");
    let plexctl_config = data_dir.join("plexctl.yaml");
    write_plexctl_config(&plexctl_config, &api_url, &token_file, &certs.ca_cert)?;

    print_seed_report(&report);
    println!("plexsphere dev: a local control plane with a lab CA");
    println!("api url: {api_url}");
    println!("ca fingerprint (sha256): {}", certs.ca_fingerprint);
    println!("ca file: {}", certs.ca_cert.display());
    for (what, id) in &report.ids {
        println!("{what}: {id}");
    }
    println!("operator token file: {}", token_file.display());
    println!("export PLEXCTL_CONFIG={}", plexctl_config.display());
    let state = AppState::new(store, &data_dir, config);
    run(listener, Transport::Tls(tls_config), state).await
}

fn write_plexctl_config(
    path: &Path,
    server: &str,
    token_file: &Path,
    ca_file: &Path,
) -> Result<(), Failure> {
    let abs = |p: &Path| -> PathBuf { std::path::absolute(p).unwrap_or_else(|_| p.to_owned()) };
    let text = format!(
        "# written by `plexsphere dev`; use it with: export PLEXCTL_CONFIG={}\nserver: {server}\ntoken_file: {}\nca_file: {}\n",
        abs(path).display(),
        abs(token_file).display(),
        abs(ca_file).display()
    );
    tls::write_private(path, text.as_bytes()).context("cannot write the plexctl config")?;
    Ok(())
}
