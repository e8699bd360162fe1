//! What each command does, from parsed flags to an exit status.

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{Cli, Command, InstallArgs, Output, StatusArgs, UninstallArgs};
use crate::config::{Config, LogLevel};
use crate::daemon::core::protocol::{Answer, Request};
use crate::daemon::{leave, socket, status};
use crate::diag;
use crate::exit::{ExitCode, Failure};
use crate::identity::Identity;
use crate::install::uninstall::{self, UninstallReport, UninstallSettings};
use crate::install::{self, InstallSettings};
use crate::join::{self, JoinSettings, Joined};
use crate::logging::{self, LogTarget};
use crate::paths::{self, ConfigPaths, StatePaths};
use crate::tls::TrustSources;

/// Runs a parsed command line; returns the process exit status.
pub fn main(cli: Cli) -> i32 {
    let json = cli.output == Output::Json;
    let result = match &cli.command {
        Command::Version => {
            if json {
                let v = serde_json::json!({"plexd_version": env!("CARGO_PKG_VERSION"), "arch": join::arch()});
                println!("{v}");
            } else {
                println!("plexd {}", env!("CARGO_PKG_VERSION"));
            }
            return 0;
        }
        Command::Ping(args) => diag_cmd(&cli, |ctx| diag::commands::ping(ctx, args)),
        Command::Netcheck(args) => diag_cmd(&cli, |ctx| diag::commands::netcheck(ctx, args)),
        Command::Bugreport(args) => diag_cmd(&cli, |ctx| diag::collect::bugreport(ctx, args)),
        Command::Install(args) => install_cmd(&cli, args),
        Command::CheckConfig => crate::check_config::check(&cli.config, cli.state_dir.as_deref())
            .map(|checked| print!("{}", checked.render()))
            .map_err(|f| (LogTarget::Stderr, f)),
        Command::Join(args) => {
            let r = with_settings(&cli, args.ca_file.clone(), args.max_wait, |s| {
                let joined = block_on(join::join(&s))??;
                if let Joined::AlreadyEnrolled(id) = &joined {
                    tracing::info!(node_id = %id.node_id, mesh_ip = %id.mesh_ip, "already enrolled; nothing to do");
                }
                if json {
                    let id = joined.identity();
                    let already = matches!(joined, Joined::AlreadyEnrolled(_));
                    let v = serde_json::json!({"node_id": id.node_id, "mesh_ip": id.mesh_ip, "already_enrolled": already});
                    println!("{v}");
                } else {
                    print!("{}", join::stdout_lines(joined.identity()));
                }
                Ok(())
            });
            join::result::record(
                args.result_file.as_deref(),
                r.as_ref().map(|_| ()).map_err(|(_, f)| f),
            );
            r
        }
        Command::Run(args) => with_settings(&cli, args.ca_file.clone(), args.max_wait, |s| {
            block_on(crate::daemon::run(&s, cli.run_dir.clone()))?
        }),
        Command::Status(args) => status_cmd(&cli, args),
        Command::Policy => policy_cmd(&cli),
        Command::Leave(args) => match leave(&cli, args.ca_file.clone()) {
            Ok(message) => {
                print_message(json, &message);
                Ok(())
            }
            Err((target, f)) if f.code.is_api_failure() => Err((
                target,
                Failure::new(
                    f.code,
                    format!(
                        "{}; nothing was removed; run plexd leave again when the API answers",
                        f.message
                    ),
                ),
            )),
            Err(e) => Err(e),
        },
        Command::Uninstall(args) => uninstall_cmd(&cli, args),
        Command::RotateKey => rotate_cmd(&cli, Request::RotateKey),
        Command::RotateCredential => rotate_cmd(&cli, Request::RotateCredential),
    };
    match result {
        Ok(()) => 0,
        Err((target, f)) => {
            report(target, &f);
            // A check that failed (exit 1) printed its own report already.
            if json && f.code != ExitCode::CheckFailed {
                println!("{}", crate::exit::failure_json(&f));
            }
            f.code.as_i32()
        }
    }
}

/// A message on stdout: as it is, or as `{"ok":true,"message":"..."}` for `--output json`.
fn print_message(json: bool, message: &str) {
    if json {
        println!("{}", serde_json::json!({"ok": true, "message": message}));
    } else {
        println!("{message}");
    }
}

/// Lines on stdout: as they are, or as `{"ok":true,"lines":[...]}` for `--output json`.
fn print_text(json: bool, text: &str) {
    if json {
        let lines: Vec<&str> = text.lines().collect();
        println!("{}", serde_json::json!({"ok": true, "lines": lines}));
    } else {
        print!("{text}");
    }
}

/// `ping`, `netcheck`, `bugreport`: logging on stderr at warn (their output is the point),
/// failures reported there.
fn diag_cmd(
    cli: &Cli,
    f: impl FnOnce(&diag::commands::Context) -> Result<(), Failure>,
) -> CmdResult {
    let target = init_logging(Some(cli.log_level.as_deref().unwrap_or("warn")), None)
        .map_err(|f| (LogTarget::Stderr, f))?;
    let ctx = diag::commands::Context {
        config_file: cli.config.clone(),
        state_dir: cli.state_dir.clone(),
        run_dir: cli.run_dir.clone(),
        json: cli.output == Output::Json,
    };
    f(&ctx).map_err(|f| (target, f))
}

type CmdResult = Result<(), (LogTarget, Failure)>;

/// `plexd status`: asks the daemon over its socket; exit 3 when none answers.
fn status_cmd(cli: &Cli, args: &StatusArgs) -> CmdResult {
    let fail = |f: Failure| (LogTarget::Stderr, f);
    let request = if args.probe_gso {
        Request::ProbeGso
    } else {
        Request::Status
    };
    let answer = block_on(socket::ask(&cli.run_dir, request))
        .map_err(fail)?
        .map_err(|e| fail(socket_failure(e)))?;
    match answer {
        Answer::Status(report) => {
            match cli.output {
                Output::Json => {
                    let json = serde_json::to_string_pretty(&report).map_err(|e| {
                        fail(Failure::new(
                            ExitCode::Io,
                            format!("cannot encode the status: {e}"),
                        ))
                    })?;
                    println!("{json}");
                }
                Output::Table => print!("{}", status::render(&report)),
            }
            Ok(())
        }
        Answer::Error { message, .. } | Answer::Left { message } | Answer::Rotated { message } => {
            Err(fail(Failure::new(ExitCode::ServerRefused, message)))
        }
        Answer::Policy(_) => Err(fail(Failure::new(
            ExitCode::Io,
            "the daemon answered a status request with its policy",
        ))),
    }
}

/// `plexd policy`: the policy the running daemon enforces; exit 3 when none answers.
fn policy_cmd(cli: &Cli) -> CmdResult {
    let fail = |f: Failure| (LogTarget::Stderr, f);
    let answer = block_on(socket::ask(&cli.run_dir, Request::Policy))
        .map_err(fail)?
        .map_err(|e| fail(socket_failure(e)))?;
    match answer {
        Answer::Policy(report) => {
            match cli.output {
                Output::Json => {
                    let json = serde_json::to_string_pretty(&report).map_err(|e| {
                        fail(Failure::new(
                            ExitCode::Io,
                            format!("cannot encode the policy: {e}"),
                        ))
                    })?;
                    println!("{json}");
                }
                Output::Table => print!("{}", crate::daemon::policy_status::render_report(&report)),
            }
            Ok(())
        }
        Answer::Error { message, .. } => Err(fail(Failure::new(ExitCode::ServerRefused, message))),
        Answer::Status(_) | Answer::Left { .. } | Answer::Rotated { .. } => {
            Err(fail(Failure::new(
                ExitCode::Io,
                "the daemon answered a policy request with something else",
            )))
        }
    }
}

/// `plexd rotate-key` / `rotate-credential`: asks the running daemon (the rotation needs its
/// interface and its connection); exit 3 when none answers.
fn rotate_cmd(cli: &Cli, req: Request) -> CmdResult {
    let fail = |f: Failure| (LogTarget::Stderr, f);
    let answer = block_on(socket::ask(&cli.run_dir, req))
        .map_err(fail)?
        .map_err(|e| {
            let f = socket_failure(e);
            let code = f.code;
            fail(Failure::new(
                code,
                format!("{}; a rotation needs the running daemon", f.message),
            ))
        })?;
    match answer {
        Answer::Rotated { message } => {
            print_message(cli.output == Output::Json, &message);
            Ok(())
        }
        Answer::Error { message, exit_code } => {
            let code = exit_code
                .and_then(ExitCode::from_i32)
                .unwrap_or(ExitCode::ServerRefused);
            Err(fail(Failure::new(code, message)))
        }
        Answer::Status(_) | Answer::Left { .. } | Answer::Policy(_) => Err(fail(Failure::new(
            ExitCode::Io,
            "the daemon answered a rotation with something else",
        ))),
    }
}

fn socket_failure(e: socket::ClientError) -> Failure {
    let code = match e {
        socket::ClientError::NotRunning { .. } => ExitCode::NotRunning,
        socket::ClientError::Broken { .. } => ExitCode::Io,
    };
    Failure::new(code, e)
}

/// `plexd leave`: through the daemon when it runs, directly otherwise; answers what it did.
fn leave(cli: &Cli, ca_flag: Option<PathBuf>) -> Result<String, (LogTarget, Failure)> {
    match block_on(socket::ask(&cli.run_dir, Request::Leave)).map_err(|f| (LogTarget::Stderr, f))? {
        Ok(Answer::Left { message }) => Ok(message),
        Ok(Answer::Error { message, exit_code }) => {
            let code = exit_code
                .and_then(ExitCode::from_i32)
                .unwrap_or(ExitCode::ServerRefused);
            Err((LogTarget::Stderr, Failure::new(code, message)))
        }
        Ok(Answer::Status(_) | Answer::Rotated { .. } | Answer::Policy(_)) => Err((
            LogTarget::Stderr,
            Failure::new(ExitCode::Io, "the daemon answered a leave with a status"),
        )),
        Err(socket::ClientError::NotRunning { .. }) => {
            let mut message = String::new();
            with_settings(cli, ca_flag, join::DEFAULT_MAX_WAIT, |s| {
                message = block_on(leave::leave_direct(&s))??;
                Ok(())
            })?;
            Ok(message)
        }
        Err(e) => Err((LogTarget::Stderr, socket_failure(e))),
    }
}

/// `plexd uninstall`: the node leaves (through the daemon when it runs), then the unit, the
/// state dir and, with `--purge`, the config go. With `--force` a node that cannot leave is
/// removed from this host anyway, and the message says how an operator removes it upstream.
/// What was done is printed also when a later step fails.
fn uninstall_cmd(cli: &Cli, args: &UninstallArgs) -> CmdResult {
    let (settings, config) = uninstall_settings(cli, args)?;
    let mut report = UninstallReport::default();
    let stranded = leave_before_uninstall(cli, args, &settings, &mut report)?;
    let done = remove_plexd(cli, &settings, config.as_ref(), stranded, &mut report);
    print_text(cli.output == Output::Json, &report.render());
    done.map_err(|f| (LogTarget::Stderr, f))
}

/// What to remove, from the flags and the config (without one, purged before, the defaults
/// name the state dir and the token file); sets up logging.
fn uninstall_settings(
    cli: &Cli,
    args: &UninstallArgs,
) -> Result<(UninstallSettings, Option<Config>), (LogTarget, Failure)> {
    let config_paths = ConfigPaths::new(&cli.config);
    let config = if config_paths.config_file.exists() {
        Some(load_config(cli, &config_paths.config_file)?.0)
    } else {
        init_logging(cli.log_level.as_deref(), None).map_err(|f| (LogTarget::Stderr, f))?;
        None
    };
    let state = StatePaths::new(paths::resolve_state_dir(
        cli.state_dir.as_deref(),
        config.as_ref().and_then(|c| c.state_dir.as_deref()),
    ));
    let settings = UninstallSettings {
        token_file: config
            .as_ref()
            .and_then(|c| c.token_file.clone())
            .unwrap_or_else(|| config_paths.default_token_file()),
        config: config_paths,
        state,
        unit_dir: args.unit_dir.clone(),
        purge: args.purge,
        systemd: install::systemd_is_running() && install::is_systemd_unit_dir(&args.unit_dir),
    };
    Ok((settings, config))
}

/// Deregisters an enrolled node. Answers the identity left behind when the node could not
/// leave and `--force` lets the uninstall go on; without `--force` that is the failure.
fn leave_before_uninstall(
    cli: &Cli,
    args: &UninstallArgs,
    settings: &UninstallSettings,
    report: &mut UninstallReport,
) -> Result<Option<Identity>, (LogTarget, Failure)> {
    let identity_file = settings.state.identity_file();
    let Some(id) = Identity::load(&identity_file).map_err(|e| (LogTarget::Stderr, e.into()))?
    else {
        report.push(format!(
            "this host is not enrolled (no {}); nothing to leave",
            identity_file.display()
        ));
        return Ok(None);
    };
    match leave(cli, args.ca_file.clone()) {
        Ok(message) => {
            report.push(message);
            Ok(None)
        }
        Err((_, f)) if args.force => {
            report.push(format!("warning: {}", f.message));
            Ok(Some(id))
        }
        Err((target, f)) if !f.code.is_api_failure() => Err((target, f)),
        Err((target, f)) => {
            let message = format!(
                "{}; nothing was removed; run plexd uninstall again when the API answers, or plexd uninstall --force to remove plexd from this host and leave node {} registered for an operator to revoke",
                f.message, id.node_id
            );
            Err((target, Failure::new(f.code, message)))
        }
    }
}

/// After the leave: the unit stops; a node that could not leave has its local files removed
/// (once no daemon runs on them); then the unit file, the state dir and with `--purge` the
/// config go.
fn remove_plexd(
    cli: &Cli,
    settings: &UninstallSettings,
    config: Option<&Config>,
    stranded: Option<Identity>,
    report: &mut UninstallReport,
) -> Result<(), Failure> {
    uninstall::stop_unit(settings, report)?;
    if let Some(id) = stranded {
        if block_on(socket::ask(&cli.run_dir, Request::Status))?.is_ok() {
            return Err(Failure::new(
                ExitCode::Io,
                format!(
                    "plexd is still running (not under a unit this command stops); stop it, then run plexd uninstall --force again; node {}'s files are untouched",
                    id.node_id
                ),
            ));
        }
        let wireguard = config.map(|c| c.wireguard.clone()).unwrap_or_default();
        let mut mesh = crate::mesh::for_leave(&wireguard, crate::routes::remove_leftovers);
        let removed = leave::cleanup(&settings.state, mesh.as_mut());
        report.push(format!(
            "removed node {}'s files here ({}); it is still registered on {}: an operator removes it with plexctl node revoke {}",
            id.node_id,
            leave::files_text(&removed),
            id.api_url,
            id.node_id
        ));
    }
    uninstall::remove_files(settings, report)?;
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from(paths::DEFAULT_BINARY));
    report.push(format!(
        "kept {} (remove the binary by hand)",
        exe.display()
    ));
    Ok(())
}

fn install_cmd(cli: &Cli, args: &InstallArgs) -> CmdResult {
    let target =
        init_logging(cli.log_level.as_deref(), None).map_err(|f| (LogTarget::Stderr, f))?;
    let config = ConfigPaths::new(&cli.config);
    let token_file = args
        .token_file
        .clone()
        .unwrap_or_else(|| config.default_token_file());
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from(paths::DEFAULT_BINARY));
    let reload = install::systemd_is_running() && install::is_systemd_unit_dir(&args.unit_dir);
    let settings = InstallSettings {
        config: config.clone(),
        unit_dir: args.unit_dir.clone(),
        api_url: args.api_url.clone(),
        token_file,
        ca_file: args.ca_file.clone(),
        force: args.force,
        exe,
        reload_systemd: reload,
    };
    let report = install::install(&settings).map_err(|f| (target, f))?;
    print_text(
        cli.output == Output::Json,
        &report.render(&config.config_file),
    );
    Ok(())
}

/// Loads the config, sets up logging and resolves the join settings, then runs `f`.
fn with_settings(
    cli: &Cli,
    ca_flag: Option<PathBuf>,
    max_wait: Duration,
    f: impl FnOnce(JoinSettings) -> Result<(), Failure>,
) -> CmdResult {
    let config_paths = ConfigPaths::new(&cli.config);
    let (config, target) = load_config(cli, &config_paths.config_file)?;
    let state_dir = paths::resolve_state_dir(cli.state_dir.as_deref(), config.state_dir.as_deref());
    let dropped_ca = config_paths.dropped_ca_file();
    let mut ca_files = Vec::new();
    if dropped_ca.exists() {
        ca_files.push(dropped_ca.clone());
    }
    ca_files.extend(config.tls.ca_file.clone());
    ca_files.extend(ca_flag);
    let settings = JoinSettings {
        config_file: config_paths.config_file.clone(),
        token_file: config
            .token_file
            .clone()
            .unwrap_or_else(|| config_paths.default_token_file()),
        trust: TrustSources {
            system_store: true,
            ca_files,
            pin: config.tls.ca_sha256,
        },
        config,
        state: StatePaths::new(state_dir),
        dropped_ca,
        max_wait,
    };
    f(settings).map_err(|f| (target, f))
}

/// Loads the config and sets up logging at its `log.level` (`--log-level`/`PLEXD_LOG` win); a
/// config that cannot be loaded is the failure, reported where logging went.
fn load_config(
    cli: &Cli,
    path: &std::path::Path,
) -> Result<(Config, LogTarget), (LogTarget, Failure)> {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            let target = init_logging(cli.log_level.as_deref(), None).unwrap_or(LogTarget::Stderr);
            return Err((target, e.into()));
        }
    };
    let target = init_logging(cli.log_level.as_deref(), config.log.level.as_ref())
        .map_err(|f| (LogTarget::Stderr, f))?;
    Ok((config, target))
}

/// Level: flag/`PLEXD_LOG`, then `log.level`, then `info`.
fn init_logging(flag: Option<&str>, from_config: Option<&LogLevel>) -> Result<LogTarget, Failure> {
    let level = match flag {
        Some(l) => {
            logging::pin_level();
            LogLevel::parse(l)
                .map_err(|e| {
                    Failure::new(ExitCode::Usage, format!("--log-level / PLEXD_LOG: {e}"))
                })?
                .as_str()
                .to_owned()
        }
        None => from_config.map_or("info", LogLevel::as_str).to_owned(),
    };
    Ok(logging::init(&level))
}

fn block_on<F: std::future::Future>(fut: F) -> Result<F::Output, Failure> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(ExitCode::Io, format!("cannot start the async runtime: {e}")))?;
    Ok(rt.block_on(fut))
}

/// Reports a failure once: in the journal under systemd (whose stderr is the journal anyway),
/// as one plain line on stderr otherwise.
fn report(target: LogTarget, f: &Failure) {
    match target {
        LogTarget::Journald => {
            tracing::error!(exit_code = f.code.as_i32(), "{}", f.message);
        }
        LogTarget::Stderr => eprintln!("{}", f.message),
    }
}
