//! `plexsphere relay` (run a relay, or `keygen` its key), and the STUN and dev-relay pieces that
//! `serve` and `dev` start.

use std::fs;
use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use clap::{Args, Subcommand};
use plexsphere_relay::limits as rl;
use plexsphere_relay::prefix::PrefixLimits;
use plexsphere_relay::{Limits, RelayConfig, RelayHandle, TlsListen};
use ring::rand::{SecureRandom as _, SystemRandom};

use super::failure::Failure;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RelayCommand {
    #[command(subcommand)]
    pub sub: Option<RelaySub>,
    #[command(flatten)]
    pub run: RelayArgs,
}

#[derive(Debug, Subcommand)]
pub enum RelaySub {
    /// Create the relay's X25519 secret key (a 0600 file, base64 like `wg genkey`) and print
    /// its public key. Refuses to overwrite an existing file.
    Keygen {
        #[arg(long, env = "PLEXSPHERE_RELAY_KEY_FILE")]
        key_file: PathBuf,
    },
}

/// Running a relay.
#[derive(Debug, Args)]
pub struct RelayArgs {
    /// The relay's name, unique within the Domain (what nodes' `home_relay` names).
    #[arg(long, env = "PLEXSPHERE_RELAY_NAME")]
    pub name: Option<String>,
    /// The secret key file `plexsphere relay keygen` wrote.
    #[arg(long, env = "PLEXSPHERE_RELAY_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// UDP address for relay frames and STUN (e.g. 0.0.0.0:3478).
    #[arg(long, env = "PLEXSPHERE_RELAY_UDP")]
    pub udp: Option<SocketAddr>,
    /// TCP address for relay frames over TLS (normally 0.0.0.0:443).
    #[arg(long, env = "PLEXSPHERE_RELAY_TLS")]
    pub tls: Option<SocketAddr>,
    /// PEM certificate chain for --tls (leaf first).
    #[arg(long, env = "PLEXSPHERE_RELAY_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls.
    #[arg(long, env = "PLEXSPHERE_RELAY_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// A Domain's signing public key (base64, `plexsphere domain-key` prints it) whose relay
    /// tokens this relay accepts (repeatable: several during a key rotation).
    #[arg(
        long = "domain-key",
        env = "PLEXSPHERE_RELAY_DOMAIN_KEYS",
        value_delimiter = ','
    )]
    pub domain_keys: Vec<String>,
    /// A file with Domain public keys, one a line (`#` comments allowed; repeatable).
    #[arg(long = "domain-key-file", env = "PLEXSPHERE_RELAY_DOMAIN_KEY_FILE")]
    pub domain_key_files: Vec<PathBuf>,
    #[command(flatten)]
    pub limits: RelayLimitArgs,
}

/// The relay's limits (plexsphere_relay::limits documents each).
#[derive(Debug, Clone, Args)]
pub struct RelayLimitArgs {
    /// Nodes registered at once; past it registrations are refused as busy.
    #[arg(long, env = "PLEXSPHERE_RELAY_MAX_NODES", default_value_t = rl::DEFAULT_MAX_NODES)]
    pub max_nodes: usize,
    /// TCP connections open at once; past it new ones are closed.
    #[arg(long, env = "PLEXSPHERE_RELAY_MAX_TCP_CONNECTIONS", default_value_t = rl::DEFAULT_MAX_TCP_CONNECTIONS)]
    pub max_tcp_connections: usize,
    /// TCP connections open at once from one source address (IPv6: one /64); past it new ones
    /// are closed at accept. At most --max-tcp-connections minus one is in force.
    #[arg(long, env = "PLEXSPHERE_RELAY_MAX_TCP_PER_SOURCE", default_value_t = rl::DEFAULT_MAX_TCP_PER_SOURCE)]
    pub max_tcp_per_source: usize,
    /// Seconds a TCP connection has from its accept to register (TLS, hello, register); then
    /// it is closed.
    #[arg(long, env = "PLEXSPHERE_RELAY_TCP_REGISTER_WITHIN_SECS", default_value_t = rl::DEFAULT_TCP_REGISTER_WITHIN.as_secs())]
    pub tcp_register_within_secs: u64,
    /// Answers a second (STUN, challenge, refused) to one unregistered source /24 or /48.
    #[arg(long, env = "PLEXSPHERE_RELAY_PREFIX_ANSWERS_PER_SEC", default_value_t = rl::DEFAULT_PREFIX_ANSWERS_PER_SEC)]
    pub prefix_answers_per_sec: u64,
    /// Answers one such /24 or /48 may get at once.
    #[arg(long, env = "PLEXSPHERE_RELAY_PREFIX_ANSWERS_BURST", default_value_t = rl::DEFAULT_PREFIX_ANSWERS_BURST)]
    pub prefix_answers_burst: u64,
    /// Source prefixes with an answer budget of their own; past it they share one.
    #[arg(long, env = "PLEXSPHERE_RELAY_MAX_ANSWER_PREFIXES", default_value_t = rl::DEFAULT_MAX_ANSWER_PREFIXES)]
    pub max_answer_prefixes: usize,
    /// Frames a second one node may send (0: no limit).
    #[arg(long, env = "PLEXSPHERE_RELAY_NODE_FRAMES_PER_SEC", default_value_t = rl::DEFAULT_NODE_FRAMES_PER_SEC)]
    pub node_frames_per_sec: u64,
    /// Payload bytes a second one node may send (0: no limit).
    #[arg(long, env = "PLEXSPHERE_RELAY_NODE_BYTES_PER_SEC", default_value_t = rl::DEFAULT_NODE_BYTES_PER_SEC)]
    pub node_bytes_per_sec: u64,
    /// `peer gone` and `busy` answers a second to one node.
    #[arg(long, env = "PLEXSPHERE_RELAY_NODE_ANSWERS_PER_SEC", default_value_t = rl::DEFAULT_NODE_ANSWERS_PER_SEC)]
    pub node_answers_per_sec: u64,
    /// `refused` answers a second, all senders together.
    #[arg(long, env = "PLEXSPHERE_RELAY_REFUSALS_PER_SEC", default_value_t = rl::DEFAULT_REFUSALS_PER_SEC)]
    pub refusals_per_sec: u64,
    /// UDP threads, each with its own socket on the UDP address (0: one a core; at most 16).
    #[arg(long, env = "PLEXSPHERE_RELAY_UDP_THREADS", default_value_t = 0)]
    pub udp_threads: usize,
}

/// The control plane's STUN responder's budget per source /24 or /48 (`serve --stun-listen`,
/// `dev`); the same defaults as a relay's `--prefix-answers-*`.
#[derive(Debug, Clone, Args)]
pub struct StunLimitArgs {
    /// STUN answers a second to one source /24 (IPv4) or /48 (IPv6).
    #[arg(long, env = "PLEXSPHERE_STUN_ANSWERS_PER_SEC", default_value_t = rl::DEFAULT_PREFIX_ANSWERS_PER_SEC)]
    pub stun_answers_per_sec: u64,
    /// STUN answers one such /24 or /48 may get at once.
    #[arg(long, env = "PLEXSPHERE_STUN_ANSWERS_BURST", default_value_t = rl::DEFAULT_PREFIX_ANSWERS_BURST)]
    pub stun_answers_burst: u64,
    /// Source prefixes with a STUN budget of their own; past it they share one.
    #[arg(long, env = "PLEXSPHERE_STUN_MAX_PREFIXES", default_value_t = rl::DEFAULT_MAX_ANSWER_PREFIXES)]
    pub stun_max_prefixes: usize,
}

impl StunLimitArgs {
    pub(super) fn limits(&self) -> Result<PrefixLimits, Failure> {
        let l = PrefixLimits {
            per_sec: self.stun_answers_per_sec,
            burst: self.stun_answers_burst,
            max_prefixes: self.stun_max_prefixes,
        };
        l.check([
            "--stun-answers-per-sec",
            "--stun-answers-burst",
            "--stun-max-prefixes",
        ])
        .map_err(Failure::Config)?;
        Ok(l)
    }
}

impl RelayLimitArgs {
    fn limits(&self) -> Result<Limits, Failure> {
        let l = Limits {
            max_nodes: self.max_nodes,
            max_tcp_connections: self.max_tcp_connections,
            max_tcp_per_source: self.max_tcp_per_source,
            tcp_register_within: std::time::Duration::from_secs(self.tcp_register_within_secs),
            prefix_answers: PrefixLimits {
                per_sec: self.prefix_answers_per_sec,
                burst: self.prefix_answers_burst,
                max_prefixes: self.max_answer_prefixes,
            },
            node_frames_per_sec: self.node_frames_per_sec,
            node_bytes_per_sec: self.node_bytes_per_sec,
            node_answers_per_sec: self.node_answers_per_sec,
            refusals_per_sec: self.refusals_per_sec,
            udp_threads: self.udp_threads,
        };
        l.check().map_err(Failure::Config)?;
        Ok(l)
    }
}

pub(crate) async fn relay(cmd: RelayCommand) -> Result<(), Failure> {
    match cmd.sub {
        Some(RelaySub::Keygen { key_file }) => keygen(&key_file),
        None => run(cmd.run).await,
    }
}

/// A fresh X25519 secret key, clamped like `wg genkey` so WireGuard tools read it too.
fn new_secret() -> Result<[u8; 32], Failure> {
    let mut secret = [0u8; 32];
    SystemRandom::new()
        .fill(&mut secret)
        .map_err(|_| anyhow::anyhow!("the system random generator failed"))?;
    secret[0] &= 248;
    secret[31] = (secret[31] & 127) | 64;
    Ok(secret)
}

fn keygen(path: &Path) -> Result<(), Failure> {
    let secret = new_secret()?;
    let mut file = match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(Failure::Config(format!(
                "{} exists already; keygen never overwrites a key (nodes know the relay by it): move it away first",
                path.display()
            )));
        }
        Err(e) => {
            return Err(Failure::Config(format!(
                "cannot create {}: {e}",
                path.display()
            )));
        }
    };
    file.write_all(format!("{}\n", STANDARD.encode(secret)).as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!(
        "{}",
        plexsphere_wire::reach::public_key(&secret).to_base64()
    );
    Ok(())
}

fn read_key(path: &Path) -> Result<[u8; 32], Failure> {
    let text = fs::read_to_string(path).map_err(|e| {
        Failure::Config(format!(
            "cannot read the relay key {}: {e}; create it with `plexsphere relay keygen --key-file {}`",
            path.display(),
            path.display()
        ))
    })?;
    if let Ok(meta) = fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(path = %path.display(), "the relay key file is readable by others; chmod 600 it");
    }
    STANDARD
        .decode(text.trim())
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| {
            Failure::Config(format!(
                "{} does not hold a key (32 bytes of base64, as `plexsphere relay keygen` writes)",
                path.display()
            ))
        })
}

fn domain_keys(args: &RelayArgs) -> Result<Vec<String>, Failure> {
    let mut keys: Vec<String> = args
        .domain_keys
        .iter()
        .map(|k| k.trim().to_owned())
        .collect();
    for path in &args.domain_key_files {
        let text = fs::read_to_string(path).map_err(|e| {
            Failure::Config(format!(
                "cannot read --domain-key-file {}: {e}",
                path.display()
            ))
        })?;
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned),
        );
    }
    for k in &keys {
        plexsphere_wire::signed::DomainVerifier::from_b64(k).map_err(|_| {
            Failure::Config(format!(
                "the Domain key {k:?} is not 32 bytes of base64; `plexsphere domain-key` prints the right one"
            ))
        })?;
    }
    if keys.is_empty() {
        return Err(Failure::Config(
            "the relay needs at least one --domain-key (or --domain-key-file): `plexsphere domain-key --data-dir ... --domain ...` on the control plane prints it".into(),
        ));
    }
    Ok(keys)
}

/// A rustls server config for the relay from PEM files (no ALPN: the relay speaks one protocol).
fn relay_tls(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, Failure> {
    crate::tls::install_ring_provider();
    let config =
        crate::tls::server_config(cert, key).map_err(|e| Failure::Config(e.to_string()))?;
    let mut config = (*config).clone();
    config.alpn_protocols.clear();
    Ok(Arc::new(config))
}

async fn run(args: RelayArgs) -> Result<(), Failure> {
    let name = args.name.clone().ok_or_else(|| {
        Failure::Config("the relay needs --name (unique within the Domain)".into())
    })?;
    let key_file = args.key_file.clone().ok_or_else(|| {
        Failure::Config(
            "the relay needs --key-file (create one with `plexsphere relay keygen --key-file FILE`)"
                .into(),
        )
    })?;
    let secret_key = read_key(&key_file)?;
    let tls = match (args.tls, &args.tls_cert, &args.tls_key) {
        (Some(addr), Some(cert), Some(key)) => Some(TlsListen {
            addr,
            config: relay_tls(cert, key)?,
        }),
        (None, None, None) => None,
        _ => {
            return Err(Failure::Config(
                "--tls needs --tls-cert and --tls-key (PEM), and they need --tls".into(),
            ));
        }
    };
    if args.udp.is_none() && tls.is_none() {
        return Err(Failure::Config(
            "the relay needs --udp ADDR, --tls ADDR, or both".into(),
        ));
    }
    let config = RelayConfig {
        name,
        secret_key,
        udp: args.udp,
        tls,
        domain_keys: domain_keys(&args)?,
        limits: args.limits.limits()?,
    };
    let signal = crate::server::shutdown_signal();
    let handle = plexsphere_relay::start(config)
        .await
        .map_err(|e| Failure::Runtime(e.into()))?;
    print_relay(&handle);
    signal.await;
    tracing::info!(stats = ?handle.stats(), "relay stopping");
    handle.shutdown().await;
    Ok(())
}

/// The lines a relay prints at start (name, public key, addresses).
pub(super) fn print_relay(handle: &RelayHandle) {
    println!("relay: {}", handle.name);
    println!("relay public key: {}", handle.public_key_b64());
    if let Some(a) = handle.udp_addr {
        println!("relay udp: {a}");
    }
    if let Some(a) = handle.tls_addr {
        println!("relay tls: {a}");
    }
    let _ = std::io::stdout().flush();
}

/// Binds the STUN responder (`--stun-listen`) before the server starts; the task answers until
/// it is aborted.
pub(super) async fn start_stun(
    addr: SocketAddr,
    limits: &StunLimitArgs,
) -> Result<tokio::task::JoinHandle<()>, Failure> {
    let limits = limits.limits()?;
    let socket = tokio::net::UdpSocket::bind(addr).await.with_context(|| {
        format!("cannot listen for STUN on UDP {addr}; is another process using it?")
    })?;
    let bound = socket.local_addr().unwrap_or(addr);
    println!("stun: udp {bound}");
    tracing::info!(address = %bound, "answering STUN Binding requests");
    Ok(tokio::spawn(plexsphere_relay::stun::serve(socket, limits)))
}

/// The relay `plexsphere dev` embeds: UDP and TLS on the dev address, the lab certificate,
/// trusting the lab Domain; its key lives in `<data-dir>/relay.key`.
pub(super) async fn start_dev_relay(
    data_dir: &Path,
    udp: SocketAddr,
    tls: SocketAddr,
    cert: &Path,
    key: &Path,
    domain_key: String,
) -> Result<RelayHandle, Failure> {
    let key_file = data_dir.join("relay.key");
    if !key_file.exists() {
        keygen_quiet(&key_file)?;
    }
    let config = RelayConfig {
        name: "dev".into(),
        secret_key: read_key(&key_file)?,
        udp: Some(udp),
        tls: Some(TlsListen {
            addr: tls,
            config: relay_tls(cert, key)?,
        }),
        domain_keys: vec![domain_key],
        limits: Limits::default(),
    };
    let handle = plexsphere_relay::start(config)
        .await
        .map_err(|e| Failure::Runtime(e.into()))?;
    print_relay(&handle);
    Ok(handle)
}

fn keygen_quiet(path: &Path) -> Result<(), Failure> {
    let secret = new_secret()?;
    crate::tls::write_private(path, format!("{}\n", STANDARD.encode(secret)).as_bytes())
        .with_context(|| format!("cannot write the dev relay key {}", path.display()))?;
    Ok(())
}
