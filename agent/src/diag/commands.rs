//! `plexd ping` and `plexd netcheck`, from parsed flags to printed output, and what
//! `collect.rs` (`plexd bugreport`) shares with them: the context, the daemon's status and a
//! netcheck run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::netcheck::NetcheckReport;
use super::netcheck_probe::{self, NetcheckInput};
use super::ping::{self, PingReport};
use crate::cli::{NetcheckArgs, PingArgs};
use crate::config::Config;
use crate::daemon::core::accept;
use crate::daemon::core::protocol::{Answer, Request};
use crate::daemon::status::StatusReport;
use crate::daemon::{cache, socket};
use crate::echo::EchoSocket;
use crate::exit::{ExitCode, Failure};
use crate::identity::Identity;
use crate::paths::{self, ConfigPaths, StatePaths};
use crate::tls::TrustSources;

/// The port the control plane's STUN responder listens on unless told otherwise; netcheck
/// guesses it on the API's host when it knows no STUN server.
pub(crate) const DEFAULT_STUN_PORT: u16 = 3478;

/// Where the commands find things (the global flags).
#[derive(Debug, Clone)]
pub struct Context {
    pub config_file: PathBuf,
    pub state_dir: Option<PathBuf>,
    pub run_dir: PathBuf,
    pub json: bool,
}

impl Context {
    pub(crate) fn config(&self) -> Result<Config, Failure> {
        Ok(Config::load(&self.config_file)?)
    }

    pub(crate) fn state(&self, config: &Config) -> StatePaths {
        StatePaths::new(paths::resolve_state_dir(
            self.state_dir.as_deref(),
            config.state_dir.as_deref(),
        ))
    }

    pub(crate) fn print<T: serde::Serialize>(
        &self,
        value: &T,
        text: impl FnOnce() -> String,
    ) -> Result<(), Failure> {
        if self.json {
            let json = serde_json::to_string_pretty(value).map_err(|e| {
                Failure::new(ExitCode::Io, format!("cannot encode the output: {e}"))
            })?;
            println!("{json}");
        } else {
            print!("{}", text());
        }
        Ok(())
    }
}

/// The daemon's status, or why there is none.
pub(crate) fn daemon_status(run_dir: &Path) -> Result<StatusReport, Failure> {
    let rt = runtime()?;
    let answer = rt
        .block_on(socket::ask(run_dir, Request::Status))
        .map_err(|e| {
            let code = match e {
                socket::ClientError::NotRunning { .. } => ExitCode::NotRunning,
                socket::ClientError::Broken { .. } => ExitCode::Io,
            };
            Failure::new(code, e)
        })?;
    match answer {
        Answer::Status(r) => Ok(*r),
        Answer::Error { message, .. } | Answer::Left { message } | Answer::Rotated { message } => {
            Err(Failure::new(ExitCode::ServerRefused, message))
        }
        Answer::Policy(_) => Err(Failure::new(
            ExitCode::Io,
            "the daemon answered a status request with its policy",
        )),
    }
}

/// The policy the daemon enforces (`plexd policy`'s answer).
pub(crate) fn daemon_policy(
    run_dir: &Path,
) -> Result<crate::daemon::policy_status::PolicyReport, Failure> {
    let rt = runtime()?;
    let answer = rt
        .block_on(socket::ask(run_dir, Request::Policy))
        .map_err(|e| Failure::new(ExitCode::Io, e))?;
    match answer {
        Answer::Policy(r) => Ok(*r),
        Answer::Error { message, .. } => Err(Failure::new(ExitCode::ServerRefused, message)),
        _ => Err(Failure::new(
            ExitCode::Io,
            "the daemon answered a policy request with something else",
        )),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(ExitCode::Io, format!("cannot start the async runtime: {e}")))
}

/// `plexd ping`: exit 1 when no reply came back.
pub fn ping(ctx: &Context, args: &PingArgs) -> Result<(), Failure> {
    let status = daemon_status(&ctx.run_dir).map_err(|f| {
        Failure::new(
            f.code,
            format!(
                "{}; plexd ping finds the peer in the running daemon's view",
                f.message
            ),
        )
    })?;
    // The policy in force, when the daemon has one (an older daemon answers without).
    let policy = daemon_policy(&ctx.run_dir)
        .ok()
        .and_then(|r| Some((r.status.version?, r.view?)));
    let peer = ping::resolve(&status.peers, &args.peer).map_err(|m| {
        let m = match &policy {
            Some((version, _)) => format!(
                "{m}; policy version {version} is in force: only nodes a rule connects to this node are its peers (plexd policy lists them)"
            ),
            None => m,
        };
        Failure::new(ExitCode::Usage, m)
    })?;
    if let Some((version, view)) = &policy
        && let Some(why) =
            crate::daemon::policy_status::ping_refusal(view, *version, peer.node_id, &peer.hostname)
    {
        return Err(Failure::new(ExitCode::CheckFailed, why));
    }
    let sock = EchoSocket::open(peer.mesh_ip).map_err(|m| Failure::new(ExitCode::Io, m))?;
    if !ctx.json {
        let head = PingReport::new(peer, sock.kind(), Vec::new());
        print!("{}", head.header());
    }
    let replies = sock
        .run(args.count, args.interval, args.timeout)
        .map_err(|m| Failure::new(ExitCode::Io, m))?;
    let report = PingReport::new(peer, sock.kind(), replies);
    if ctx.json {
        ctx.print(&report, String::new)?;
    } else {
        let full = report.render();
        print!("{}", full.strip_prefix(&report.header()).unwrap_or(&full));
    }
    if report.received == 0 {
        return Err(Failure::new(
            ExitCode::CheckFailed,
            format!(
                "no reply from {} ({}) over the mesh (path {}); see plexd status and plexd netcheck",
                report.name, report.mesh_ip, report.path
            ),
        ));
    }
    Ok(())
}

/// The netcheck's input from the config, the flags and the cached state.
fn netcheck_input(
    ctx: &Context,
    config: &Config,
    stun_flag: &[SocketAddr],
    ca_flag: Option<PathBuf>,
) -> Result<NetcheckInput, Failure> {
    let api_url = config.require_api_url(&ctx.config_file)?.clone();
    let config_paths = ConfigPaths::new(&ctx.config_file);
    let dropped = config_paths.dropped_ca_file();
    let mut ca_files = Vec::new();
    if dropped.exists() {
        ca_files.push(dropped);
    }
    ca_files.extend(config.tls.ca_file.clone());
    ca_files.extend(ca_flag);
    let trust = TrustSources {
        system_store: true,
        ca_files,
        pin: config.tls.ca_sha256,
    };
    let (stun, stun_source) = if !stun_flag.is_empty() {
        (stun_flag.to_vec(), "--stun".to_owned())
    } else {
        match cached_stun(&ctx.state(config)) {
            Some(list) if !list.is_empty() => (list, "the node's cached state".to_owned()),
            _ => {
                let url = api_url.url();
                let guess = url
                    .host_str()
                    .and_then(|h| {
                        std::net::ToSocketAddrs::to_socket_addrs(&(h, DEFAULT_STUN_PORT)).ok()
                    })
                    .and_then(|mut a| a.next());
                (
                    guess.into_iter().collect(),
                    format!(
                        "a guess: the API's host, UDP {DEFAULT_STUN_PORT} (no cached state; pass --stun)"
                    ),
                )
            }
        }
    };
    Ok(NetcheckInput {
        api_url,
        trust,
        stun,
        stun_source,
        mesh_mtu: config.wireguard.mtu,
    })
}

/// The STUN servers the node's verified cached state lists: the control plane's and every
/// relay's UDP port.
fn cached_stun(state: &StatePaths) -> Option<Vec<SocketAddr>> {
    let id = Identity::load(&state.identity_file()).ok()??;
    let acceptor = accept::Acceptor::from_identity(&id).ok()?;
    let cached = cache::load(&state.dir.join(cache::STATE_FILE_NAME), &acceptor).ok()??;
    let mut list = cached.state.stun.clone();
    list.extend(cached.state.relays.iter().filter_map(|r| r.udp));
    Some(list)
}

pub(crate) fn run_netcheck(
    ctx: &Context,
    config: &Config,
    args: &NetcheckArgs,
) -> Result<NetcheckReport, Failure> {
    let input = netcheck_input(ctx, config, &args.stun, args.ca_file.clone())?;
    Ok(netcheck_probe::run(&input))
}

/// `plexd netcheck`: exit 1 when a check failed.
pub fn netcheck(ctx: &Context, args: &NetcheckArgs) -> Result<(), Failure> {
    let config = ctx.config()?;
    let report = run_netcheck(ctx, &config, args)?;
    ctx.print(&report, || report.render())?;
    if report.failed() {
        let failed: Vec<&str> = report
            .checks
            .iter()
            .filter(|c| c.verdict == super::netcheck::Verdict::Fail)
            .map(|c| c.name)
            .collect();
        return Err(Failure::new(
            ExitCode::CheckFailed,
            format!("netcheck: {} failed", failed.join(", ")),
        ));
    }
    Ok(())
}
