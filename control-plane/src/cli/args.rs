//! The `plexsphere` command line's arguments, as clap parses them: the commands and the
//! arguments of each; the option groups `serve` and `dev` share are in `cli::knobs`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::downloads::DownloadArgs;
use super::knobs::{BrokerArgs, LimitArgs, NodeApiArgs, OidcArgs};

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
