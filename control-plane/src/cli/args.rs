//! The `plexsphere` command line's arguments, as clap parses them, and the checks of the
//! knobs that need more than a type (`LimitArgs::rate_limit`, `NodeApiArgs::apply`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use ipnet::IpNet;
use plexsphere_wire::duration::{Rules, parse_with};

use super::downloads::DownloadArgs;
use super::reach::ReachArgs;
use crate::ratelimit::RateLimit;

#[derive(Debug, Parser)]
#[command(
    name = "plexsphere",
    version,
    about = "The lean plexsphere control plane"
)]
pub struct Cli {
    /// Log filter (`info`, `debug`, `plexsphere=debug,sqlx=warn`...); logs go to stderr.
    #[arg(long, env = "PLEXSPHERE_LOG", default_value = "info", global = true)]
    pub log_level: String,
    /// How log lines look: `text` for people, `json` (one JSON object per line) for log
    /// collectors.
    #[arg(long, env = "PLEXSPHERE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the API (HTTPS from a cert/key pair, or HTTP behind a TLS-terminating proxy).
    Serve(ServeArgs),
    /// One-command local start: lab CA, lab seed, an operator token, a plexctl config.
    Dev(DevArgs),
    /// Seed manifests (Domains and Projects).
    #[command(subcommand)]
    Seed(SeedCommand),
    /// Operator API tokens.
    #[command(subcommand)]
    OperatorToken(OperatorTokenCommand),
    /// Bring the database schema up to date and exit.
    Migrate(DataArgs),
    /// Copy the embedded database (online, while the server runs; the Domain keys are in it,
    /// sealed) and the dev certificates into a new directory, with a manifest keyed under the
    /// key-encryption key. Secrets stay out unless --include-secrets.
    Backup {
        #[command(flatten)]
        data: DataArgs,
        /// The directory to write the backup to (created 0700; must be new or empty).
        #[arg(long)]
        out: PathBuf,
        /// The key-encryption key the Domain keys are sealed under: it keys the manifest (and
        /// is checked against the sealed keys); default: `key-encryption-key` in the data
        /// directory (`plexsphere dev`), or the systemd credential.
        #[arg(long, env = "PLEXSPHERE_KEY_ENCRYPTION_KEY_FILE")]
        key_encryption_key_file: Option<PathBuf>,
        /// Also copy the secrets of the data directory: dev's key-encryption key, older Domain
        /// seed files, dev's TLS private keys and operator token (each named on stderr, with
        /// what a holder of the backup can do with it).
        #[arg(long)]
        include_secrets: bool,
    },
    /// Bring a backup back into an empty data directory (with --database-url: after
    /// `pg_restore`, bring the Domain keys back, migrate, and move the event logs ahead).
    Restore {
        /// The directory `plexsphere backup` wrote (with --database-url: a directory holding
        /// what was kept besides the dump: `plexsphere dev`'s `key-encryption-key`, older
        /// `domain-keys/`; it may be empty).
        #[arg(long)]
        from: PathBuf,
        #[command(flatten)]
        data: DataArgs,
        /// The key-encryption key the restored Domain keys are sealed under (the manifest's MAC
        /// and the sealed keys are checked with it); default: `key-encryption-key` in the data
        /// directory, the systemd credential, or (a backup taken with --include-secrets) the
        /// one in --from.
        #[arg(long, env = "PLEXSPHERE_KEY_ENCRYPTION_KEY_FILE")]
        key_encryption_key_file: Option<PathBuf>,
        /// Accept a backup of an older plexsphere whose manifest has no MAC (format 1): its
        /// files are checked for damage only, not for tampering.
        #[arg(long)]
        allow_unkeyed_backup: bool,
    },
    /// Run a relay for nodes that cannot reach each other directly (or `relay keygen`).
    Relay(super::relay::RelayCommand),
    /// Print a Domain's signing public key, and the next one during a rotation's overlap (what
    /// `plexsphere relay --domain-key` takes: give a relay both meanwhile).
    DomainKey(super::keys::DomainKeyArgs),
    /// The key-encryption key the Domain keys are sealed under in the database.
    #[command(subcommand)]
    Kek(super::keys::KekCommand),
    /// The audit pepper people's identifiers and the audit chains are keyed with (docs/audit.md).
    #[command(subcommand)]
    AuditPepper(super::audit::AuditPepperCommand),
    /// Release-signing keys for plexd releases served from a mirror (docs/downloads.md).
    #[command(subcommand)]
    ReleaseKey(super::downloads::ReleaseKeyCommand),
    /// Sign a plexd release: its manifest, plexd-release.json (docs/downloads.md).
    #[command(subcommand)]
    Release(super::downloads::ReleaseCommand),
}

#[derive(Debug, Clone, Args)]
pub struct DataArgs {
    /// Where the database, Domain keys and dev certificates live.
    #[arg(
        long,
        env = "PLEXSPHERE_DATA_DIR",
        default_value = "/var/lib/plexsphere"
    )]
    pub data_dir: PathBuf,
    /// `sqlite://...` or `postgres://...`; default: `<data-dir>/plexsphere.db`.
    #[arg(long, env = "PLEXSPHERE_DATABASE_URL")]
    pub database_url: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Registration requests a client may send at once.
    #[arg(long, env = "PLEXSPHERE_REGISTER_BURST", default_value_t = 10)]
    pub register_burst: u32,
    /// Seconds until a client gets one more registration request (a number, or e.g. 3s).
    #[arg(
        long,
        env = "PLEXSPHERE_REGISTER_REFILL_SECS",
        default_value_t = 3,
        value_parser = secs_flag
    )]
    pub register_refill_secs: u64,
    /// A reverse proxy's address range whose X-Forwarded-For is believed (repeatable).
    #[arg(
        long = "trusted-proxy",
        env = "PLEXSPHERE_TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    pub trusted_proxies: Vec<IpNet>,
    /// Requests one node may send to the node routes at once (heartbeat, endpoints, state,
    /// ingest, events...).
    #[arg(long, env = "PLEXSPHERE_NODE_BURST", default_value_t = 120)]
    pub node_burst: u32,
    /// Milliseconds until a node gets one more request of its node-route budget.
    #[arg(long, env = "PLEXSPHERE_NODE_REFILL_MS", default_value_t = 250)]
    pub node_refill_ms: u64,
    /// Open connections beyond which each request is answered 503 with Retry-After and its
    /// connection closed.
    #[arg(long, env = "PLEXSPHERE_MAX_CONNECTIONS", default_value_t = crate::server::MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Seconds a client has to send a request's header (and an HTTP/1.1 connection may sit
    /// idle between requests) before the connection is closed.
    #[arg(
        long,
        env = "PLEXSPHERE_HEADER_READ_TIMEOUT_SECS",
        default_value_t = 10,
        value_parser = secs_flag
    )]
    pub header_read_timeout_secs: u64,
}

impl LimitArgs {
    /// The node routes' budget.
    pub(super) fn node_rate_limit(&self) -> Result<RateLimit, String> {
        if self.node_burst == 0 {
            return Err("--node-burst must be at least 1".into());
        }
        if self.node_refill_ms == 0 {
            return Err("--node-refill-ms must be at least 1".into());
        }
        Ok(RateLimit {
            burst: self.node_burst,
            refill: Duration::from_millis(self.node_refill_ms),
        })
    }

    /// The connection bounds of the listener.
    pub(super) fn server_limits(&self) -> Result<crate::server::ServerLimits, String> {
        if self.max_connections == 0 {
            return Err("--max-connections must be at least 1".into());
        }
        if self.header_read_timeout_secs == 0 {
            return Err("--header-read-timeout-secs must be at least 1".into());
        }
        Ok(crate::server::ServerLimits {
            header_read_timeout: Duration::from_secs(self.header_read_timeout_secs),
            max_connections: self.max_connections,
        })
    }

    pub(super) fn rate_limit(&self) -> Result<RateLimit, String> {
        if self.register_burst == 0 {
            return Err("--register-burst must be at least 1".into());
        }
        if self.register_refill_secs == 0 {
            return Err("--register-refill-secs must be at least 1".into());
        }
        Ok(RateLimit {
            burst: self.register_burst,
            refill: Duration::from_secs(self.register_refill_secs),
        })
    }
}

/// The node API's knobs.
#[derive(Debug, Clone, Args)]
pub struct NodeApiArgs {
    /// Seconds between node heartbeats (nodes get it at registration and with every ack).
    #[arg(
        long,
        env = "PLEXSPHERE_HEARTBEAT_SECS",
        default_value_t = 30,
        value_parser = secs_flag_u32
    )]
    pub heartbeat_secs: u32,
    /// A node is offline after this many seconds without a call; default: 3 heartbeats.
    #[arg(long, env = "PLEXSPHERE_OFFLINE_AFTER_SECS", value_parser = secs_flag)]
    pub offline_after_secs: Option<u64>,
    /// How long events stay replayable for a stream resuming with Last-Event-ID.
    #[arg(
        long,
        env = "PLEXSPHERE_EVENT_RETENTION_SECS",
        default_value_t = 86_400,
        value_parser = secs_flag
    )]
    pub event_retention_secs: u64,
    /// Seconds between keep-alive comments on an idle event stream.
    #[arg(
        long,
        env = "PLEXSPHERE_SSE_KEEPALIVE_SECS",
        default_value_t = plexsphere_wire::node::SSE_KEEPALIVE_SECS,
        value_parser = secs_flag
    )]
    pub sse_keepalive_secs: u64,
    /// The relays and STUN servers every node's state lists (`--relay`, `--stun-advertise`).
    #[command(flatten)]
    pub reach: ReachArgs,
}

impl NodeApiArgs {
    /// Applies the knobs to an API config, or says which one is out of range.
    pub(super) fn apply(&self, config: &mut crate::api::ApiConfig) -> Result<(), String> {
        if self.heartbeat_secs == 0 {
            return Err("--heartbeat-secs must be at least 1".into());
        }
        if self.sse_keepalive_secs == 0 {
            return Err("--sse-keepalive-secs must be at least 1".into());
        }
        if self.offline_after_secs == Some(0) {
            return Err("--offline-after-secs must be at least 1".into());
        }
        self.reach.check()?;
        config.relays = self.reach.relays.clone();
        config.stun_advertise = self.reach.stun_advertise.clone();
        config.intervals.heartbeat_secs = self.heartbeat_secs;
        config.offline_after = self.offline_after_secs.map(Duration::from_secs);
        config.events.retention = Duration::from_secs(self.event_retention_secs);
        config.events.keepalive = Duration::from_secs(self.sse_keepalive_secs);
        // Prune and sweep often enough for the shortest window configured.
        let offline = u64::try_from(config.offline_after_secs()).unwrap_or(u64::MAX);
        let every = (self.event_retention_secs / 2)
            .min(offline / 2)
            .clamp(1, 30);
        config.events.maintenance_every = Duration::from_secs(every);
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// Address to listen on; port 0 picks a free port (the `listening on` line shows it).
    #[arg(long, env = "PLEXSPHERE_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: String,
    /// PEM certificate chain (leaf first).
    #[arg(long, env = "PLEXSPHERE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the leaf certificate.
    #[arg(long, env = "PLEXSPHERE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP because a reverse proxy in front terminates TLS.
    #[arg(long, env = "PLEXSPHERE_TLS_TERMINATED_BY_PROXY")]
    pub tls_terminated_by_proxy: bool,
    /// A seed manifest to apply before serving.
    #[arg(long, env = "PLEXSPHERE_SEED")]
    pub seed: Option<PathBuf>,
    /// The URL nodes reach this server at (used in documents the server writes).
    #[arg(long, env = "PLEXSPHERE_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Answer STUN Binding requests on this UDP address (e.g. 0.0.0.0:3478).
    #[arg(long, env = "PLEXSPHERE_STUN_LISTEN")]
    pub stun_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub stun_limits: super::relay::StunLimitArgs,
    /// Also serve `GET /metrics` without authentication on this plain-HTTP address (meant
    /// for loopback or a private network; the API's own `/metrics` needs a read-only token).
    #[arg(long, env = "PLEXSPHERE_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The key-encryption key the Domain keys are sealed under (`plexsphere kek generate`
    /// makes one; every replica needs the same); default: the systemd credential
    /// `$CREDENTIALS_DIRECTORY/plexsphere-kek`.
    #[arg(long, env = "PLEXSPHERE_KEY_ENCRYPTION_KEY_FILE")]
    pub key_encryption_key_file: Option<PathBuf>,
    /// The audit pepper (`plexsphere audit-pepper generate` makes one; every replica needs the
    /// same); default: the systemd credential `$CREDENTIALS_DIRECTORY/plexsphere-audit-pepper`,
    /// else derived from the key-encryption key (docs/audit.md).
    #[arg(long, env = "PLEXSPHERE_AUDIT_PEPPER_FILE")]
    pub audit_pepper_file: Option<PathBuf>,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub node_api: NodeApiArgs,
    #[command(flatten)]
    pub downloads: DownloadArgs,
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// The event bus between replicas (`--nats-url`).
    #[command(flatten)]
    pub bus: super::bus::BusArgs,
    #[command(flatten)]
    pub oidc: OidcArgs,
}

/// Sign-in through an OpenID Connect issuer (docs/auth.md); off without `--oidc-issuer`.
#[derive(Debug, Clone, Args)]
pub struct OidcArgs {
    /// The issuer URL (https; http only on loopback). Enables the console's sign-in and
    /// `plexctl login`.
    #[arg(long, env = "PLEXSPHERE_OIDC_ISSUER")]
    pub oidc_issuer: Option<String>,
    /// The console's client id at the issuer (redirect URI `<public url>/v1/auth/callback`).
    #[arg(long, env = "PLEXSPHERE_OIDC_CLIENT_ID")]
    pub oidc_client_id: Option<String>,
    /// A file holding the console client's secret.
    #[arg(long, env = "PLEXSPHERE_OIDC_CLIENT_SECRET_FILE")]
    pub oidc_client_secret_file: Option<PathBuf>,
    /// plexctl's (public) client id at the issuer; without it `plexctl login` is off.
    #[arg(long, env = "PLEXSPHERE_OIDC_CLI_CLIENT_ID")]
    pub oidc_cli_client_id: Option<String>,
    /// The ID token claim that lists a person's groups.
    #[arg(long, env = "PLEXSPHERE_OIDC_GROUPS_CLAIM", default_value = "groups")]
    pub oidc_groups_claim: String,
    /// The scopes asked of the issuer.
    #[arg(long, env = "PLEXSPHERE_OIDC_SCOPES", default_value = crate::api::auth::SCOPES)]
    pub oidc_scopes: String,
    /// A CA file for an issuer under a private CA (beside the system's roots).
    #[arg(long, env = "PLEXSPHERE_OIDC_CA_FILE")]
    pub oidc_ca_file: Option<PathBuf>,
    /// A session's lifetime from sign-in, in seconds.
    #[arg(long, env = "PLEXSPHERE_SESSION_LIFETIME_SECS", default_value_t = crate::auth::session::SESSION_LIFETIME.as_secs())]
    pub session_lifetime_secs: u64,
    /// A session ends after this many seconds without a request.
    #[arg(long, env = "PLEXSPHERE_SESSION_IDLE_TIMEOUT_SECS", default_value_t = crate::auth::session::SESSION_IDLE_TIMEOUT.as_secs())]
    pub session_idle_timeout_secs: u64,
}

impl OidcArgs {
    /// The sign-in of these flags (`None` without `--oidc-issuer`) for an API reached at
    /// `public_url`.
    pub fn auth(
        &self,
        public_url: &str,
    ) -> Result<Option<std::sync::Arc<crate::auth::Auth>>, String> {
        let Some(issuer) = &self.oidc_issuer else {
            return Ok(None);
        };
        let client_id = self
            .oidc_client_id
            .clone()
            .ok_or("--oidc-client-id is required with --oidc-issuer")?;
        let secret_file = self
            .oidc_client_secret_file
            .as_ref()
            .ok_or("--oidc-client-secret-file is required with --oidc-issuer")?;
        let secret = std::fs::read_to_string(secret_file)
            .map_err(|e| {
                format!(
                    "cannot read --oidc-client-secret-file {}: {e}",
                    secret_file.display()
                )
            })?
            .trim()
            .to_owned();
        if self.session_lifetime_secs == 0 || self.session_idle_timeout_secs == 0 {
            return Err(
                "--session-lifetime-secs and --session-idle-timeout-secs must be at least 1".into(),
            );
        }
        let public_origin = crate::auth::session::origin_of(public_url)
            .ok_or_else(|| format!("the public URL {public_url:?} is not a URL"))?;
        let config = crate::auth::AuthConfig {
            issuer: issuer.trim_end_matches('/').to_owned(),
            client_id,
            client_secret: secret,
            cli_client_id: self.oidc_cli_client_id.clone(),
            groups_claim: self.oidc_groups_claim.clone(),
            scopes: self.oidc_scopes.clone(),
            public_origin,
            session_lifetime: Duration::from_secs(self.session_lifetime_secs),
            session_idle_timeout: Duration::from_secs(self.session_idle_timeout_secs),
            ca_file: self.oidc_ca_file.clone(),
        };
        crate::auth::Auth::new(config).map(|a| Some(std::sync::Arc::new(a)))
    }
}

/// The broker's knobs.
#[derive(Debug, Clone, Args)]
pub struct BrokerArgs {
    /// A blueprint file or a directory of them, added to the built-in catalog (repeatable).
    #[arg(
        long = "blueprints",
        env = "PLEXSPHERE_BLUEPRINTS",
        value_delimiter = ','
    )]
    pub blueprints: Vec<PathBuf>,
    /// Seconds between the broker's periodic re-checks of every resource.
    #[arg(
        long,
        env = "PLEXSPHERE_RECONCILE_SECS",
        default_value_t = 3,
        value_parser = secs_flag
    )]
    pub reconcile_secs: u64,
    /// Seconds the broker lease lasts: one replica of those sharing the database runs the
    /// broker and maintenance; another takes over within this plus a third of it after the
    /// leader dies (at least 3).
    #[arg(
        long,
        env = "PLEXSPHERE_LEADER_LEASE_SECS",
        default_value_t = 15,
        value_parser = secs_flag
    )]
    pub leader_lease_secs: u64,
    /// Turn the local-machine substrate off (by default it is on when running as root with
    /// systemd-nspawn, debootstrap and /dev/net/tun). Machines reach the server on the bridge
    /// address: listen there (`--listen 172.30.231.1:8443`, or 0.0.0.0 with `--san
    /// 172.30.231.1` and `--public-url https://172.30.231.1:8443`).
    #[arg(
        long,
        env = "PLEXSPHERE_NO_LOCAL_MACHINES",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub no_local_machines: bool,
    /// Where the local machines' Debian base image is cached.
    #[arg(long, env = "PLEXSPHERE_MACHINE_IMAGE_CACHE", default_value = plexsphere_nspawn::DEFAULT_IMAGE_CACHE)]
    pub machine_image_cache: PathBuf,
    /// The host bridge local machines sit on.
    #[arg(long, env = "PLEXSPHERE_MACHINE_BRIDGE", default_value = plexsphere_nspawn::DEFAULT_BRIDGE)]
    pub machine_bridge: String,
    /// The bridge's host address with the machines' prefix.
    #[arg(long, env = "PLEXSPHERE_MACHINE_BRIDGE_ADDRESS", default_value = plexsphere_nspawn::DEFAULT_BRIDGE_ADDRESS)]
    pub machine_bridge_address: ipnet::Ipv4Net,
}

#[derive(Debug, Args)]
pub struct DevArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, env = "PLEXSPHERE_LISTEN", default_value = "127.0.0.1:8443")]
    pub listen: String,
    /// Extra DNS name or IP for the server certificate (repeatable).
    #[arg(long = "san")]
    pub sans: Vec<String>,
    /// A seed manifest to apply instead of the built-in lab seed.
    #[arg(long, env = "PLEXSPHERE_SEED")]
    pub seed: Option<PathBuf>,
    /// The URL machines reach this server at (cloud-init documents); default: the listen
    /// address. Local machines need `--listen 172.30.231.1:8443` (or 0.0.0.0 with
    /// `--san 172.30.231.1`) and this URL on the bridge address.
    #[arg(long, env = "PLEXSPHERE_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// STUN on UDP; default: the listen IP, port 3478 (port 0 when --listen has port 0).
    #[arg(long, env = "PLEXSPHERE_STUN_LISTEN")]
    pub stun_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub stun_limits: super::relay::StunLimitArgs,
    /// Also serve `GET /metrics` without authentication on this plain-HTTP address (meant
    /// for loopback or a private network; the API's own `/metrics` needs a read-only token).
    #[arg(long, env = "PLEXSPHERE_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The embedded relay's UDP address; default: the listen IP, port 3479 (0 likewise).
    #[arg(long, env = "PLEXSPHERE_DEV_RELAY_UDP")]
    pub relay_udp: Option<std::net::SocketAddr>,
    /// The embedded relay's TLS address; default: the listen IP, port 8444 (0 likewise).
    #[arg(long, env = "PLEXSPHERE_DEV_RELAY_TLS")]
    pub relay_tls: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub node_api: NodeApiArgs,
    #[command(flatten)]
    pub downloads: DownloadArgs,
    #[command(flatten)]
    pub broker: BrokerArgs,
    #[command(flatten)]
    pub oidc: OidcArgs,
}

#[derive(Debug, Subcommand)]
pub enum SeedCommand {
    /// Apply a seed manifest (idempotent; refused changes apply nothing).
    Apply {
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum OperatorTokenCommand {
    /// Create a token and print it once on stdout.
    Create {
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        name: String,
        /// What the token may do: read-only (GET only), operator (bootstrap tokens, nodes,
        /// resources) or admin (everything, operator tokens and cloud credentials included)
        #[arg(long, default_value = "operator", value_parser = ["read-only", "operator", "admin"])]
        scope: String,
        /// Limit the token to one project (id or slug); not for admin tokens
        #[arg(long, value_name = "PROJECT")]
        project: Option<String>,
        /// When the token stops working: 90d, 12h, 1d12h... or `never` (admin only)
        #[arg(long, default_value = crate::operator_tokens::DEFAULT_EXPIRES_IN, value_name = "DURATION")]
        expires_in: String,
        #[command(flatten)]
        audit: super::audit::AuditKeyArgs,
    },
    /// List tokens (never their secrets).
    List {
        #[command(flatten)]
        data: DataArgs,
    },
    /// Revoke a token by id.
    Revoke {
        #[command(flatten)]
        data: DataArgs,
        id: String,
        #[command(flatten)]
        audit: super::audit::AuditKeyArgs,
    },
}

/// A `--*-secs` flag (and its environment variable): a bare number of seconds, as before, or a
/// duration in the one syntax (`90s`, `30m`, `1h30m`, `2d`). Zero parses; each flag's own check
/// says why it is refused.
fn secs_flag(text: &str) -> Result<u64, String> {
    let rules = Rules {
        bare_seconds: true,
        zero: true,
    };
    parse_with(text, rules).map_err(|e| e.to_string())
}

/// [`secs_flag`] for a flag counted in `u32` seconds.
fn secs_flag_u32(text: &str) -> Result<u32, String> {
    let secs = secs_flag(text)?;
    u32::try_from(secs).map_err(|_| {
        format!(
            "`{text}` is too long for this flag (at most {} seconds)",
            u32::MAX
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secs_flags_take_seconds_or_the_duration_syntax() {
        assert_eq!(secs_flag("90"), Ok(90));
        assert_eq!(secs_flag("1m30s"), Ok(90));
        assert_eq!(secs_flag("1d"), Ok(86_400));
        // Zero parses; the flag's own check refuses it with its name.
        assert_eq!(secs_flag("0"), Ok(0));
        assert!(secs_flag("5w").is_err_and(|e| e.contains("unknown unit `w`")));
        assert!(secs_flag("1h30").is_err());
        assert_eq!(secs_flag_u32("30s"), Ok(30));
        assert!(secs_flag_u32("200000d").is_err_and(|e| e.contains("too long")));
    }
}
