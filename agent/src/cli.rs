//! The command line (clap). `main.rs` parses it and hands it to `app::main`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::paths::{DEFAULT_CONFIG_FILE, DEFAULT_UNIT_DIR};

#[derive(Debug, Parser)]
#[command(
    name = "plexd",
    version,
    about = "plexd, the plexsphere node agent: enrols this host and keeps it in the WireGuard mesh",
    after_help = crate::exit::HELP
)]
pub struct Cli {
    /// The config file; its directory holds ca.crt and the default token file.
    #[arg(long, env = "PLEXD_CONFIG", default_value = DEFAULT_CONFIG_FILE, global = true)]
    pub config: PathBuf,
    /// The state dir (key and identity); overrides the config's `state_dir`.
    #[arg(long, env = "PLEXD_STATE_DIR", global = true)]
    pub state_dir: Option<PathBuf>,
    /// The run dir holding the status socket plexd.sock.
    #[arg(long, env = "PLEXD_RUN_DIR", default_value = crate::daemon::socket::DEFAULT_RUN_DIR, global = true)]
    pub run_dir: PathBuf,
    /// The log level or filter (error, warn, info, debug, trace); overrides `log.level`.
    #[arg(long, env = "PLEXD_LOG", global = true)]
    pub log_level: Option<String>,
    /// `table` for people, `json` for scripts (every command; a failure is then a JSON object
    /// on stdout too: `{"ok":false,"exit_code":3,"error":"not_running","message":"..."}`).
    #[arg(long, short = 'o', value_enum, default_value = "table", global = true)]
    pub output: Output,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write the config and the systemd unit (does not start the service).
    Install(InstallArgs),
    /// Register this node once and print `node_id: <id>` and `mesh_ip: <ip>`.
    Join(JoinArgs),
    /// Run the agent (what the systemd unit starts): join if needed, then stay up.
    Run(RunArgs),
    /// Show what the running daemon is doing (identity, API, event stream, peers).
    Status(StatusArgs),
    /// Deregister this node, tear the mesh down and remove its identity and key.
    Leave(LeaveArgs),
    /// Show the access policy this node enforces: its version, whether the filter is
    /// installed or closed (and why), drops, and per peer what may be opened each way.
    Policy,
    /// Leave, then stop and disable the unit and remove it and the state dir (and with
    /// --purge the config and token).
    Uninstall(UninstallArgs),
    /// Rotate this node's WireGuard key now (through the running daemon): a new key pair,
    /// proven to and stored by the control plane, then used by the interface; peers switch.
    RotateKey,
    /// Rotate this node's credential now (through the running daemon).
    RotateCredential,
    /// Parse and validate the config (--config) as join and run would, without running:
    /// print what plexd would use, or the problem with its file and line (exit 78).
    CheckConfig,
    /// Print the version.
    Version,
    /// Ping a peer (name, node id or mesh IP) over the mesh: its path, endpoint and RTT.
    Ping(PingArgs),
    /// Check the network: the API over TCP and TLS, UDP out (STUN), the NAT's mapping, MTU.
    Netcheck(NetcheckArgs),
    /// Write a tar.gz for a bug report: config without secrets, status, versions, interface
    /// state, the recent journal and a netcheck. Never tokens, credentials or private keys.
    Bugreport(BugreportArgs),
}

#[derive(Debug, Args)]
pub struct PingArgs {
    /// The peer: its name (the hostname its signed state carries), node id (or a unique
    /// prefix of at least 4 characters) or mesh IP, as `plexd status` lists it.
    pub peer: String,
    /// Echo requests to send (1 to 100).
    #[arg(long, short = 'c', default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub count: u32,
    /// The wait between two requests (200ms to 60s).
    #[arg(long, short = 'i', default_value = "1s", value_parser = parse_ping_interval)]
    pub interval: Duration,
    /// How long to wait for each reply (100ms to 30s).
    #[arg(long, short = 'W', default_value = "2s", value_parser = parse_ping_timeout)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct NetcheckArgs {
    /// A STUN server to ask (IP:PORT, repeatable) instead of the ones the node's cached state
    /// lists (the control plane's STUN and the relays' UDP ports).
    #[arg(long, value_name = "IP:PORT")]
    pub stun: Vec<std::net::SocketAddr>,
    /// An extra CA (PEM) to trust for the TLS check besides the system store and ca.crt.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BugreportArgs {
    /// Where the tar.gz goes [default: ./plexd-bugreport-<unix time>.tar.gz].
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Skip the netcheck (it takes a few seconds and sends packets to the control plane).
    #[arg(long)]
    pub no_netcheck: bool,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The control plane's origin, e.g. https://plexsphere.example.
    #[arg(long)]
    pub api_url: String,
    /// The bootstrap token file [default: <config dir>/bootstrap-token].
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// An extra CA (PEM) to trust; its path is recorded as tls.ca_file.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Replace api_url, token_file or tls.ca_file when the config sets other values.
    #[arg(long)]
    pub force: bool,
    /// Where the systemd unit goes.
    #[arg(long, env = "PLEXD_UNIT_DIR", default_value = DEFAULT_UNIT_DIR)]
    pub unit_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct JoinArgs {
    /// How long to keep retrying while the API is unreachable (refused, DNS, timeout) or
    /// answers 429 (e.g. 300s, 5m).
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    pub max_wait: Duration,
    /// An extra CA (PEM) to trust besides the system store, ca.crt and tls.ca_file.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// On failure, write `{"exit_code": N, "message": "..."}` here (0644, atomically); on
    /// success, remove a stale one. Cloud-init's runcmd uses /run/plexd/join-result.json.
    #[arg(long, value_name = "PATH")]
    pub result_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// An extra CA (PEM) to trust besides the system store, ca.crt and tls.ca_file.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// How long the join keeps retrying while the API is unreachable or answers 429 (e.g.
    /// 300s, 5m); the unit restarts plexd after that.
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    pub max_wait: Duration,
}

/// `plexd status` takes the global `--output`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Run the GSO path probe on up to 3 peers with a recent handshake first (embedded data
    /// plane only; takes a few seconds), then show the status with its results.
    #[arg(long)]
    pub probe_gso: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Args)]
pub struct LeaveArgs {
    /// An extra CA (PEM) to trust when plexd deregisters without a running daemon.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct UninstallArgs {
    /// Also remove the config file, the token file and the CA dropped beside them.
    #[arg(long)]
    pub purge: bool,
    /// Remove plexd from this host even when the node cannot deregister (the control plane is
    /// unreachable or refuses); the node then stays registered until an operator revokes it.
    #[arg(long)]
    pub force: bool,
    /// An extra CA (PEM) to trust when plexd deregisters without a running daemon.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Where the systemd unit is.
    #[arg(long, env = "PLEXD_UNIT_DIR", default_value = DEFAULT_UNIT_DIR)]
    pub unit_dir: PathBuf,
}

/// A duration flag in the one syntax of `plexsphere_wire::duration` (`300s`, `5m`, `1h30m`,
/// `2d`); a bare number is seconds, as before that syntax; zero is refused.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    use plexsphere_wire::duration::{Rules, parse_std};
    parse_std(s, Rules::SECONDS_OK).map_err(|e| e.to_string())
}

/// The shortest and longest `plexd ping --interval`.
pub(crate) const PING_INTERVAL_RANGE: (Duration, Duration) =
    (Duration::from_millis(200), Duration::from_secs(60));
/// The shortest and longest `plexd ping --timeout`.
pub(crate) const PING_TIMEOUT_RANGE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(30));

fn parse_ping_interval(s: &str) -> Result<Duration, String> {
    parse_bounded(s, PING_INTERVAL_RANGE)
}

fn parse_ping_timeout(s: &str) -> Result<Duration, String> {
    parse_bounded(s, PING_TIMEOUT_RANGE)
}

/// A duration (`ms` too) within `(min, max)`.
fn parse_bounded(s: &str, (min, max): (Duration, Duration)) -> Result<Duration, String> {
    let d = match s.trim().strip_suffix("ms") {
        Some(ms) => Duration::from_millis(
            ms.parse()
                .map_err(|_| format!("`{s}` is not a duration such as 500ms or 2s"))?,
        ),
        None => parse_duration(s)?,
    };
    if d < min || d > max {
        return Err(format!(
            "{s} is outside {}ms..{}s",
            min.as_millis(),
            max.as_secs()
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("300s"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("300"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("0").is_err());
        assert!(
            parse_duration("5w")
                .unwrap_err()
                .contains("unknown unit `w`")
        );
    }

    #[test]
    fn ping_flags_have_defaults_and_limits() {
        let cli = Cli::try_parse_from(["plexd", "ping", "web-3"]).unwrap();
        let Command::Ping(a) = cli.command else {
            panic!("not ping")
        };
        assert_eq!(
            (a.count, a.interval, a.timeout),
            (4, Duration::from_secs(1), Duration::from_secs(2))
        );
        let cli = Cli::try_parse_from([
            "plexd",
            "ping",
            "-c",
            "2",
            "-i",
            "250ms",
            "10.64.0.3",
            "-o",
            "json",
        ])
        .unwrap();
        assert_eq!(cli.output, Output::Json);
        assert!(matches!(
            cli.command,
            Command::Ping(PingArgs { count: 2, .. })
        ));
        for bad in [
            ["-c", "0"],
            ["-c", "101"],
            ["-i", "100ms"],
            ["-i", "2m"],
            ["-W", "50ms"],
        ] {
            assert!(
                Cli::try_parse_from(["plexd", "ping", bad[0], bad[1], "x"]).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn output_is_global() {
        let cli = Cli::try_parse_from(["plexd", "status", "--output", "json"]).unwrap();
        assert_eq!(cli.output, Output::Json);
        let cli = Cli::try_parse_from(["plexd", "-o", "json", "version"]).unwrap();
        assert_eq!(cli.output, Output::Json);
        let cli = Cli::try_parse_from(["plexd", "version"]).unwrap();
        assert_eq!(cli.output, Output::Table);
    }

    #[test]
    fn join_takes_a_result_file() {
        let cli = Cli::try_parse_from([
            "plexd",
            "join",
            "--result-file",
            "/run/plexd/join-result.json",
        ])
        .unwrap();
        let Command::Join(args) = cli.command else {
            panic!("not join: {:?}", cli.command);
        };
        assert_eq!(
            args.result_file,
            Some(PathBuf::from("/run/plexd/join-result.json"))
        );
        let cli = Cli::try_parse_from(["plexd", "join"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Join(JoinArgs {
                result_file: None,
                ..
            })
        ));
    }

    #[test]
    fn cli_is_consistent_and_help_lists_exit_codes() {
        Cli::command().debug_assert();
        let help = Cli::command().render_long_help().to_string();
        assert!(
            help.contains("Exit codes:")
                && help.contains("10  the bootstrap token was already used"),
            "{help}"
        );
    }
}
