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
    /// How long to keep retrying while the API answers 429 (e.g. 300s, 5m).
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
    /// How long to keep retrying while the API answers 429 (e.g. 300s, 5m).
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    pub max_wait: Duration,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// `table` for people, `json` for scripts.
    #[arg(long, short = 'o', value_enum, default_value = "table")]
    pub output: Output,
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

/// `300`, `300s`, `5m`, `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 1),
        Some((i, _)) => {
            let mult = match &s[i..] {
                "s" => 1,
                "m" => 60,
                "h" => 3600,
                unit => return Err(format!("unknown unit `{unit}` (use s, m or h)")),
            };
            (&s[..i], mult)
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{s}` is not a duration such as 300s or 5m"))?;
    Ok(Duration::from_secs(n.saturating_mul(mult)))
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
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("s").is_err());
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
