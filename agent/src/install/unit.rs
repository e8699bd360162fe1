//! The systemd unit `plexd install` writes: `systemd/plexd.service` with the binary's path.

use std::path::Path;
use std::process::Command;

use crate::paths::DEFAULT_BINARY;

/// The unit as shipped in the repository.
pub const UNIT_TEMPLATE: &str = include_str!("../../../systemd/plexd.service");

/// The unit with `ExecStart=` pointing at `exe` (quoted when it holds blanks).
pub fn unit_text(exe: &Path) -> String {
    let exe = exe.display().to_string();
    if exe == DEFAULT_BINARY {
        return UNIT_TEMPLATE.to_owned();
    }
    let quoted = if exe.chars().any(char::is_whitespace) || exe.contains('"') {
        format!("\"{}\"", exe.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        exe
    };
    let from = format!("ExecStart={DEFAULT_BINARY} ");
    let to = format!("ExecStart={quoted} ");
    UNIT_TEMPLATE
        .lines()
        .map(|l| match l.strip_prefix(&from) {
            Some(rest) => format!("{to}{rest}\n"),
            None => format!("{l}\n"),
        })
        .collect()
}

/// The unit directories systemd reads; a reload only helps when the unit went to one of them.
pub fn is_systemd_unit_dir(dir: &Path) -> bool {
    [
        "/etc/systemd/system",
        "/run/systemd/system",
        "/usr/lib/systemd/system",
        "/lib/systemd/system",
        "/usr/local/lib/systemd/system",
    ]
    .iter()
    .any(|d| Path::new(d) == dir)
}

/// Whether systemd is the running init (`/run/systemd/system` exists).
pub fn systemd_is_running() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// Runs `systemctl <args>`; the error names the command, its status and what it printed.
pub fn systemctl(args: &[&str]) -> Result<(), String> {
    let shown = format!("systemctl {}", args.join(" "));
    let out = Command::new("systemctl")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{shown} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_has_the_contract() {
        for needle in [
            "Type=notify",
            "ExecStart=/usr/local/bin/plexd run\n",
            "RestartPreventExitStatus=10 11 15 16 64 78",
            "WatchdogSec=60s",
            "TimeoutStopSec=15s",
            "RuntimeDirectory=plexd",
            "Restart=on-failure",
            "StateDirectory=plexd",
            "After=network-online.target",
            "DeviceAllow=/dev/net/tun rw",
        ] {
            assert!(UNIT_TEMPLATE.contains(needle), "{needle}");
        }
    }

    #[test]
    fn exec_start_follows_the_binary() {
        assert_eq!(unit_text(Path::new(DEFAULT_BINARY)), UNIT_TEMPLATE);
        let t = unit_text(Path::new("/opt/plexd/bin/plexd"));
        assert!(t.contains("\nExecStart=/opt/plexd/bin/plexd run\n"), "{t}");
        assert!(!t.contains("/usr/local/bin/plexd run"));
        let t = unit_text(Path::new("/opt/my dir/plexd"));
        assert!(t.contains("\nExecStart=\"/opt/my dir/plexd\" run\n"), "{t}");
        assert_eq!(t.lines().count(), UNIT_TEMPLATE.lines().count());
    }

    #[test]
    fn unit_dirs() {
        assert!(is_systemd_unit_dir(Path::new("/etc/systemd/system")));
        assert!(!is_systemd_unit_dir(Path::new("/tmp/x")));
    }
}
