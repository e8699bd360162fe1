//! The `plexsphere` command line. Config is validated before anything binds; bad config
//! exits 64 with a one-line error; runtime failures exit 1.
//!
//! `args.rs` is what clap parses, `failure.rs` how a command fails; `admin.rs` (seed, operator
//! tokens, migrate), `backup.rs` (backup, restore), `serve.rs` (serve, dev) and `downloads.rs`
//! run the commands; `relay.rs` runs `relay` and `domain-key` and holds the STUN and dev-relay
//! pieces `serve.rs` starts.

mod admin;
mod args;
mod audit;
mod backup;
mod bus;
mod dev;
mod downloads;
mod failure;
mod keys;
mod knobs;
mod relay;
mod serve;

pub use args::{
    Cli, Command, DataArgs, DevArgs, LogFormat, OperatorTokenCommand, SeedCommand, ServeArgs,
};
pub use bus::BusArgs;
pub use downloads::DownloadArgs;
pub(crate) use failure::Failure;
pub use knobs::{BrokerArgs, LimitArgs, NodeApiArgs};

/// The relays and STUN servers nodes are told of (`--relay`, `--stun-advertise`).
mod reach;
pub use reach::{ReachArgs, parse_relay};

use std::process::ExitCode;

use clap::Parser as _;

/// Exit code for a usage or configuration error (EX_USAGE).
pub(crate) const EXIT_CONFIG: u8 = 64;

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    if let Err(e) = init_logging(&cli.log_level, cli.log_format) {
        eprintln!("plexsphere: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("plexsphere: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Config(msg)) => {
            eprintln!("plexsphere: {msg}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(Failure::Runtime(e)) => {
            eprintln!("plexsphere: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(filter: &str, format: LogFormat) -> Result<(), String> {
    // tracing-subscriber 0.3's directive parser panics on some non-ASCII text; directives are
    // ASCII anyway.
    if !filter.is_ascii() {
        return Err(format!(
            "--log-level {filter:?} is not a valid filter: use ASCII (error, warn, info, debug, trace or target=level)"
        ));
    }
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .map_err(|e| format!("--log-level {filter:?} is not a valid filter: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let done = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        // One JSON object per line: time, level, target, the event's fields (message
        // included) at the top level, and the span it happened in.
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    done.map_err(|e| format!("cannot set up logging: {e}"))
}

async fn dispatch(cmd: Command) -> Result<(), Failure> {
    match cmd {
        Command::Serve(args) => serve::serve(args).await,
        Command::Dev(args) => dev::dev(args).await,
        Command::Seed(SeedCommand::Apply { data, file }) => admin::seed_apply(&data, &file).await,
        Command::OperatorToken(OperatorTokenCommand::Create {
            data,
            name,
            scope,
            project,
            expires_in,
            audit,
        }) => {
            let spec = admin::TokenArgs {
                name: &name,
                scope: &scope,
                project: project.as_deref(),
                expires_in: &expires_in,
            };
            admin::token_create(&data, &audit, spec).await
        }
        Command::OperatorToken(OperatorTokenCommand::List { data }) => {
            admin::token_list(&data).await
        }
        Command::OperatorToken(OperatorTokenCommand::Revoke { data, id, audit }) => {
            admin::token_revoke(&data, &audit, &id).await
        }
        Command::Migrate(data) => admin::migrate(&data).await,
        Command::Backup {
            data,
            out,
            key_encryption_key_file,
            include_secrets,
        } => {
            backup::backup(
                &data,
                &out,
                key_encryption_key_file.as_deref(),
                include_secrets,
            )
            .await
        }
        Command::Restore {
            from,
            data,
            key_encryption_key_file,
            allow_unkeyed_backup,
        } => {
            backup::restore::restore(
                &from,
                &data,
                key_encryption_key_file.as_deref(),
                allow_unkeyed_backup,
            )
            .await
        }
        Command::Relay(cmd) => relay::relay(cmd).await,
        Command::DomainKey(args) => keys::domain_key(&args).await,
        Command::Kek(cmd) => keys::kek(cmd).await,
        Command::AuditPepper(cmd) => audit::audit_pepper(cmd),
        Command::ReleaseKey(cmd) => downloads::release_key(cmd),
        Command::Release(cmd) => downloads::release(cmd),
    }
}
