//! `plexsphere dev`: one process with everything a lab needs (a dev CA and certificates, the
//! built-in lab seed, an operator token and a plexctl config, a STUN responder and an embedded
//! relay), served with the same steps as `plexsphere serve` (`cli::serve`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use time::OffsetDateTime;

use super::admin::{ensure_data_dir, open_store, print_seed_report};
use super::args::DevArgs;
use super::downloads::stage_sibling_plexd;
use super::failure::Failure;
use super::serve::{
    api_config, apply_seed, bind, bind_metrics, broker_config, load_catalog, local_machines,
    open_downloads, parse_listen, reachable, run, serving,
};
use crate::api::{ApiConfig, AppState};
use crate::keys::{Kek, Keyring};
use crate::seed;
use crate::server::Transport;
use crate::store::Store;
use crate::{operator_tokens, tls};

pub(crate) async fn dev(args: DevArgs) -> Result<(), Failure> {
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
    let mut config = api_config(&args.limits, &args.node_api, Some(certs.ca_pem.clone()))?;
    let serving = serving(&args.limits, &args.broker)?;
    let downloads_config = args.downloads.config(&data_dir)?;
    let catalog = load_catalog(&args.broker)?;
    if let Some(url) = &args.public_url
        && !url.starts_with("https://")
    {
        return Err(Failure::Config(format!(
            "--public-url {url:?} must start with https:// (dev serves HTTPS)"
        )));
    }

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

    let machines = local_machines(&args.broker, &data_dir);
    let listener = bind(addr)?;
    let metrics = bind_metrics(args.metrics_listen)?;
    let bound = reachable(
        listener
            .local_addr()
            .context("cannot read the bound address")?,
    );
    // dev keeps its key-encryption key in its data directory.
    let kek = Kek::dev(&data_dir).map_err(|e| Failure::Config(e.to_string()))?;
    let keys = Keyring::new(store.clone(), kek, &data_dir);
    keys.prepare_all().await.map_err(super::keys::key_failure)?;
    let lab = manifest.domains.first().map(|d| d.slug.clone());
    let lab_key = lab_public_key(&store, &keys, lab.as_deref()).await?;
    let reach = dev_reach(&args, addr, &data_dir, &certs, lab_key, &mut config).await?;
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
    // The embedded default serves the plexd built beside this binary.
    if args.downloads.plexd_mirror.is_none()
        && args.downloads.plexd_artifacts.is_none()
        && let Some(file) = stage_sibling_plexd(&data_dir.join("artifacts"))?
    {
        println!(
            "plexd artifact: {} (copied from this build's plexd)",
            file.display()
        );
    }
    let public_url = args.public_url.clone().unwrap_or_else(|| api_url.clone());
    println!("public url (cloud-init): {public_url}");
    match &machines {
        Ok(_) => println!(
            "local machines: on (bridge {} {})",
            args.broker.machine_bridge, args.broker.machine_bridge_address
        ),
        Err(why) => println!("local machines: off ({why})"),
    }
    let broker = broker_config(
        &args.broker,
        catalog,
        public_url,
        Some(certs.ca_pem.clone()),
        machines,
    );
    let auth = args.oidc.auth(&api_url).map_err(Failure::Config)?;
    if let Some(a) = &auth {
        println!(
            "sign-in: {} (redirect URI {})",
            a.config.issuer,
            a.redirect_uri()
        );
    }
    // dev keeps its audit pepper in its data directory too.
    let pepper =
        crate::audit::Pepper::dev(&data_dir).map_err(|e| Failure::Config(e.to_string()))?;
    let state = AppState::with_broker_config(store, &data_dir, config, broker)
        .with_keyring(keys)
        .with_auth(auth)
        .with_audit_pepper(pepper);
    let downloads =
        open_downloads(&args.downloads, downloads_config, &state, lab.as_deref()).await?;
    println!(
        "plexd downloads: {api_url}/downloads/plexd (version {})",
        downloads.version()
    );
    let result = run(
        listener,
        Transport::Tls(tls_config),
        state,
        downloads,
        metrics,
        serving,
    )
    .await;
    let (stun, relay) = reach;
    stun.abort();
    relay.shutdown().await;
    result
}

/// `dev`'s STUN responder and embedded relay, on the listen IP (ports 3478, 3479 and 8444, or
/// free ports when `--listen` asks for port 0), announced in every node's state.
async fn dev_reach(
    args: &DevArgs,
    listen: SocketAddr,
    data_dir: &Path,
    certs: &tls::DevCerts,
    domain_key: String,
    config: &mut ApiConfig,
) -> Result<(tokio::task::JoinHandle<()>, plexsphere_relay::RelayHandle), Failure> {
    let at = |port: u16| SocketAddr::new(listen.ip(), if listen.port() == 0 { 0 } else { port });
    let stun_addr = args.stun_listen.unwrap_or_else(|| at(3478));
    let stun_limits = args.stun_limits.limits()?;
    let stun_socket = tokio::net::UdpSocket::bind(stun_addr)
        .await
        .with_context(|| {
            format!(
                "cannot listen for STUN on UDP {stun_addr}; pass --stun-listen with a free address"
            )
        })?;
    // A wildcard address is announced as the public URL's IP when it has one (machines on
    // the bridge), else as loopback.
    let public_ip = args
        .public_url
        .as_deref()
        .and_then(|u| u.strip_prefix("https://"))
        .and_then(|rest| rest.parse::<SocketAddr>().ok())
        .map(|a| a.ip());
    let announce = |a: SocketAddr| match public_ip {
        Some(ip) if a.ip().is_unspecified() => SocketAddr::new(ip, a.port()),
        _ => reachable(a),
    };
    let stun_bound = announce(
        stun_socket
            .local_addr()
            .context("cannot read the STUN address")?,
    );
    println!("stun: udp {stun_bound}");
    let stun = tokio::spawn(plexsphere_relay::stun::serve(stun_socket, stun_limits));
    let relay = super::relay::start_dev_relay(
        data_dir,
        args.relay_udp.unwrap_or_else(|| at(3479)),
        args.relay_tls.unwrap_or_else(|| at(8444)),
        &certs.server_cert,
        &certs.server_key,
        domain_key,
    )
    .await?;
    let mut spec = relay.spec(None);
    spec.udp = spec.udp.map(announce);
    spec.tls = spec.tls.map(announce);
    spec.tls_server_name = spec.tls.map(|a| a.ip().to_string());
    config.relays.push(spec);
    config.stun_advertise.push(stun_bound);
    Ok((stun, relay))
}

/// The public key of the lab Domain `slug`, which the dev relay trusts.
async fn lab_public_key(
    store: &Store,
    keys: &Keyring,
    slug: Option<&str>,
) -> Result<String, Failure> {
    let none = || Failure::Config("the seed has no Domain for the dev relay to trust".into());
    let slug = slug.ok_or_else(none)?;
    let mut conn = store
        .acquire()
        .await
        .map_err(|e| Failure::Runtime(e.into()))?;
    let domain = crate::store::domains::by_slug(&mut conn, slug)
        .await
        .map_err(|e| Failure::Runtime(e.into()))?
        .ok_or_else(none)?;
    drop(conn);
    let signer = keys
        .signer(&domain)
        .await
        .map_err(super::keys::key_failure)?;
    Ok(signer.public_key_b64())
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
