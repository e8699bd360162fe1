//! plexctl, the plexsphere operator CLI.
//!
//! Exit codes: 0 success; 1 the server refused (an `ApiError`, printed as
//! `plexctl: <message> (<code>, HTTP <status>)`) or answered something unreadable, or `--wait`
//! saw the resource fail; 2 the server is not trusted or not reachable, or `--wait` timed out;
//! 64 a usage or configuration error.

mod audit;
mod broker;
mod broker_output;
mod cli;
mod cli_broker;
mod client;
mod clouds_yaml;
mod commands;
mod config;
mod failure;
mod login;
mod names;
mod node_output;
mod observations;
mod operator_tokens;
mod output;
mod plain_http;
mod policy;
mod policy_output;
mod roles;
mod routes;
mod secret;
mod session;
mod tags;
mod wait;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser as _;

use crate::cli::{Cli, Global};
use crate::config::{ConfigError, Layer, Settings};
use crate::failure::Failure;
use crate::secret::Secret;

const EXIT_USAGE: u8 = 64;

fn main() -> ExitCode {
    // `plexctl __generate-docs DIR`: man pages and completions for the packages (scripts/package).
    if let Some(dir) = plexsphere_clidoc::requested(std::env::args_os()) {
        let code = plexsphere_clidoc::run(<Cli as clap::CommandFactory>::command(), &dir);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and succeed; usage errors exit 64.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { 0 });
        }
    };
    let result = settings(&cli.global, |name| std::env::var_os(name))
        .map_err(Failure::from)
        .and_then(|settings| run(&cli, &settings));
    match result {
        Ok(text) => print_stdout(&text),
        Err(e) => {
            eprintln!("plexctl: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(cli: &Cli, settings: &Settings) -> Result<String, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Usage(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(commands::run(&cli.command, cli.global.output, settings))
}

/// Gathers flags, the environment (through `env`) and the config file into settings.
fn settings(
    global: &Global,
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Settings, ConfigError> {
    let var = |name: &str| env(name).and_then(|v| v.into_string().ok());
    let path = |name: &str| env(name).map(PathBuf::from);
    let flags = Layer {
        server: global.server.clone(),
        token: global.token.clone().map(Secret::new),
        token_file: global.token_file.clone(),
        ca_file: global.ca_file.clone(),
    }
    .without_empty();
    let from_env = Layer {
        server: var(config::ENV_SERVER),
        token: var(config::ENV_TOKEN).map(Secret::new),
        token_file: path(config::ENV_TOKEN_FILE),
        ca_file: path(config::ENV_CA_FILE),
    }
    .without_empty();
    let location = config::config_location(
        global.config.as_deref(),
        path(config::ENV_CONFIG).as_deref(),
        path("XDG_CONFIG_HOME").as_deref(),
        path("HOME").as_deref(),
    );
    let hint = location.as_ref().map_or_else(
        || "~/.config/plexctl/config.yaml (or a file named by PLEXCTL_CONFIG)".to_owned(),
        |l| l.path.display().to_string(),
    );
    let file = match &location {
        Some(l) => config::load_file(l)?.map(|layer| (l.path.clone(), layer)),
        None => None,
    };
    let mut settings = config::resolve(flags, from_env, file, hint)?;
    settings.session_file = location
        .as_ref()
        .map(|l| l.path.with_file_name(login::SESSION_FILE));
    Ok(settings)
}

/// Prints the result; a closed pipe (`plexctl ... | head`) is not an error.
fn print_stdout(text: &str) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plexctl: cannot write to stdout: {e}");
            ExitCode::from(1)
        }
    }
}
