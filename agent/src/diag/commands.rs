//! The three diagnostic commands, from parsed flags to printed output: they gather with the
//! probes and the daemon's socket, and print what the pure parts made of it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::bugreport::{self, Entry, Summary};
use super::icmp::EchoSocket;
use super::netcheck::NetcheckReport;
use super::netcheck_probe::{self, NetcheckInput};
use super::ping::{self, PingReport};
use super::tarball;
use crate::cli::{BugreportArgs, NetcheckArgs, PingArgs};
use crate::config::Config;
use crate::daemon::protocol::{Answer, Request};
use crate::daemon::status::StatusReport;
use crate::daemon::{accept, cache, socket};
use crate::exit::{ExitCode, Failure};
use crate::identity::Identity;
use crate::paths::{self, ConfigPaths, StatePaths};
use crate::tls::TrustSources;

/// The port the control plane's STUN responder listens on unless told otherwise; netcheck
/// guesses it on the API's host when it knows no STUN server.
pub const DEFAULT_STUN_PORT: u16 = 3478;

/// Where the commands find things (the global flags).
#[derive(Debug, Clone)]
pub struct Context {
    pub config_file: PathBuf,
    pub state_dir: Option<PathBuf>,
    pub run_dir: PathBuf,
    pub json: bool,
}

impl Context {
    fn config(&self) -> Result<Config, Failure> {
        Ok(Config::load(&self.config_file)?)
    }

    fn state(&self, config: &Config) -> StatePaths {
        StatePaths::new(paths::resolve_state_dir(
            self.state_dir.as_deref(),
            config.state_dir.as_deref(),
        ))
    }

    fn print<T: serde::Serialize>(
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
fn daemon_status(run_dir: &Path) -> Result<StatusReport, Failure> {
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
    let peer =
        ping::resolve(&status.peers, &args.peer).map_err(|m| Failure::new(ExitCode::Usage, m))?;
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
    let verifier =
        plexsphere_wire::signed::DomainVerifier::from_b64(&id.domain_signing_public_key).ok()?;
    let acceptor = accept::Acceptor::new(verifier, id.node_id);
    let cached = cache::load(&state.dir.join(cache::STATE_FILE_NAME), &acceptor).ok()??;
    let mut list = cached.state.stun.clone();
    list.extend(cached.state.relays.iter().filter_map(|r| r.udp));
    Some(list)
}

fn run_netcheck(
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

/// `plexd bugreport`.
pub fn bugreport(ctx: &Context, args: &BugreportArgs) -> Result<(), Failure> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("plexd-bugreport-{now}.tar.gz")));
    let config = ctx.config();
    let mut entries = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let mut secrets: Vec<Vec<u8>> = Vec::new();
    let config_paths = ConfigPaths::new(&ctx.config_file);

    let (state, token_file, iface) = match &config {
        Ok(c) => {
            entries.push(Entry::new(
                "config.yaml",
                serde_yaml::to_string(c).unwrap_or_default(),
            ));
            let token = c
                .token_file
                .clone()
                .unwrap_or_else(|| config_paths.default_token_file());
            (ctx.state(c), token, c.wireguard.interface.clone())
        }
        Err(f) => {
            notes.push(format!("config: {}", f.message));
            (
                StatePaths::new(paths::resolve_state_dir(ctx.state_dir.as_deref(), None)),
                config_paths.default_token_file(),
                crate::config::Config::default().wireguard.interface,
            )
        }
    };
    // Read only to be searched for and replaced.
    secrets.extend(std::fs::read(&token_file).ok());
    secrets.extend(secret_files(&state.dir));
    match Identity::load(&state.identity_file()) {
        Ok(Some(id)) => {
            secrets.push(id.node_credential.expose().as_bytes().to_vec());
            entries.push(Entry::new("identity.json", identity_json(&id)));
        }
        Ok(None) => notes.push(format!(
            "identity: {} does not exist (not enrolled)",
            state.identity_file().display()
        )),
        Err(e) => notes.push(format!("identity: {e}")),
    }

    match daemon_status(&ctx.run_dir) {
        Ok(r) => {
            entries.push(Entry::new(
                "status.json",
                serde_json::to_string_pretty(&r).unwrap_or_default(),
            ));
            entries.push(Entry::new("peers.txt", bugreport::peers_text(&r)));
        }
        Err(f) => entries.push(Entry::new(
            "status.json",
            crate::exit::failure_json(&f).to_string(),
        )),
    }
    entries.push(Entry::new("versions.txt", versions()));
    entries.push(Entry::new("interface.txt", interface_state(&iface)));
    entries.push(Entry::new("state-dir.txt", listing(&state.dir)));
    entries.push(Entry::new("journal.txt", journal()));
    match (&config, args.no_netcheck) {
        (_, true) => notes.push("netcheck: skipped (--no-netcheck)".to_owned()),
        (Err(_), false) => notes.push("netcheck: skipped (no usable config)".to_owned()),
        (Ok(c), false) => match run_netcheck(
            ctx,
            c,
            &NetcheckArgs {
                stun: Vec::new(),
                ca_file: None,
            },
        ) {
            Ok(r) => entries.push(Entry::new(
                "netcheck.json",
                serde_json::to_string_pretty(&r).unwrap_or_default(),
            )),
            Err(f) => notes.push(format!("netcheck: {}", f.message)),
        },
    }

    let summary_entry = serde_json::json!({
        "created_unix": now,
        "plexd_version": env!("CARGO_PKG_VERSION"),
        "config_file": ctx.config_file,
        "state_dir": state.dir,
        "notes": notes,
        "limits": {
            "max_entry_bytes": bugreport::MAX_ENTRY_BYTES,
            "max_total_bytes": bugreport::MAX_TOTAL_BYTES,
            "journal_lines": bugreport::JOURNAL_LINES,
        },
    });
    entries.insert(
        0,
        Entry::new(
            "summary.json",
            serde_json::to_string_pretty(&summary_entry).unwrap_or_default(),
        ),
    );
    let redacted = bugreport::redact(&mut entries, &secrets);
    let truncated = bugreport::bound(&mut entries);
    let bytes = tarball::write(&out, &entries, now).map_err(|m| Failure::new(ExitCode::Io, m))?;
    let summary = Summary {
        file: out.display().to_string(),
        bytes,
        entries: entries.iter().map(|e| e.name.clone()).collect(),
        truncated,
        secrets_redacted: redacted,
    };
    ctx.print(&summary, || summary.render())
}

/// The contents of every file in the state dir that may hold a secret (all but the cache,
/// the host binding and the identity, whose credential is taken from its parsed form).
fn secret_files(dir: &Path) -> Vec<Vec<u8>> {
    let public = [
        cache::STATE_FILE_NAME,
        crate::identity::host::HOST_FILE_NAME,
        paths::IDENTITY_FILE_NAME,
    ];
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(Result::ok)
        .filter(|e| !public.iter().any(|p| e.file_name() == *p))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| std::fs::read(e.path()).ok())
        .collect()
}

/// The identity's public fields.
fn identity_json(id: &Identity) -> String {
    let v = serde_json::json!({
        "node_id": id.node_id,
        "domain_id": id.domain_id,
        "project_id": id.project_id,
        "mesh_ip": id.mesh_ip,
        "mesh_cidr": id.mesh_cidr.to_string(),
        "api_url": id.api_url,
        "registered_at": id.registered_at.to_string(),
        "node_credential": bugreport::REDACTED,
    });
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

fn versions() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_else(|e| format!("({p}: {e})\n"));
    format!(
        "plexd {} ({})\n\n# /proc/version\n{}\n# /etc/os-release\n{}",
        env!("CARGO_PKG_VERSION"),
        crate::join::arch(),
        read("/proc/version"),
        read("/etc/os-release")
    )
}

/// A command's output for the report, or why it did not run.
fn command_text(program: &str, args: &[&str]) -> String {
    let mut out = format!("$ {program} {}\n", args.join(" "));
    match Command::new(program).args(args).output() {
        Ok(o) => {
            out.push_str(&String::from_utf8_lossy(&o.stdout));
            out.push_str(&String::from_utf8_lossy(&o.stderr));
            if !o.status.success() {
                out.push_str(&format!("({})\n", o.status));
            }
        }
        Err(e) => out.push_str(&format!("(cannot run {program}: {e})\n")),
    }
    out.push('\n');
    out
}

fn interface_state(iface: &str) -> String {
    let mut out = String::new();
    for args in [
        vec!["addr", "show", "dev", iface],
        vec!["-s", "link", "show", "dev", iface],
        vec!["route", "show", "dev", iface],
        vec!["-6", "route", "show", "dev", iface],
        vec!["route", "show", "table", "all", "dev", iface],
    ] {
        out.push_str(&command_text("ip", &args));
    }
    out
}

fn journal() -> String {
    let lines = bugreport::JOURNAL_LINES.to_string();
    command_text(
        "journalctl",
        &["-u", "plexd", "-n", &lines, "--no-pager", "-o", "short-iso"],
    )
}

/// File names, sizes and modes of a directory (never contents).
fn listing(dir: &Path) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let mut out = format!("{}:\n", dir.display());
    let Ok(rd) = std::fs::read_dir(dir) else {
        out.push_str("(cannot be read or does not exist)\n");
        return out;
    };
    let mut rows: Vec<String> = rd
        .filter_map(Result::ok)
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some(format!(
                "{:o} {:>8} {}",
                m.permissions().mode() & 0o7777,
                m.len(),
                e.file_name().to_string_lossy()
            ))
        })
        .collect();
    rows.sort();
    for r in rows {
        out.push_str(&r);
        out.push('\n');
    }
    out
}
