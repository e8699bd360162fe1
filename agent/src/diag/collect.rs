//! `plexd bugreport`: gathering the entries from the host, the daemon and a netcheck, then
//! redacting, bounding and writing them (`bugreport.rs` says what goes in and what never does).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::bugreport::{self, Entry, Summary};
use super::commands::{Context, daemon_status, run_netcheck};
use super::tarball;
use crate::cli::{BugreportArgs, NetcheckArgs};
use crate::daemon::cache;
use crate::exit::{ExitCode, Failure};
use crate::identity::Identity;
use crate::paths::{self, ConfigPaths, StatePaths};

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
