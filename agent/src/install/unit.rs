//! The systemd unit `plexd install` writes: `systemd/plexd.service` with the binary's path.

use std::path::Path;
use std::process::Command;

use crate::paths::{DEFAULT_BINARY, DEFAULT_UNIT_DIR};

/// Where the plexd package (deb, rpm) puts the unit.
pub(crate) const PACKAGED_UNIT_FILE: &str = "/usr/lib/systemd/system/plexd.service";

/// Whether the package's unit serves: the unit dir is the default one and `packaged` (in
/// production [`PACKAGED_UNIT_FILE`]) exists. `plexd install` then writes no copy into
/// /etc/systemd/system (a copy there would hide the unit a package upgrade brings), and
/// `plexd uninstall` stops and disables the packaged unit but leaves the file to the package.
pub(crate) fn packaged_unit_serves(unit_dir: &Path, packaged: &Path) -> bool {
    unit_dir == Path::new(DEFAULT_UNIT_DIR) && packaged.is_file()
}

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
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use super::*;

    #[test]
    fn template_has_the_contract() {
        for needle in [
            "Type=notify",
            "ExecStart=/usr/bin/plexd run\n",
            "RestartPreventExitStatus=10 11 15 16 64 78",
            "WatchdogSec=60s",
            "TimeoutStopSec=15s",
            "RuntimeDirectory=plexd",
            "Restart=on-failure",
            "StateDirectory=plexd",
            "After=network-online.target",
            "DeviceAllow=/dev/net/tun rw",
            "BindPaths=-/dev/net/tun",
            "PrivateDevices=yes",
            "CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_BIND_SERVICE\n",
        ] {
            assert!(UNIT_TEMPLATE.contains(needle), "{needle}");
        }
    }

    #[test]
    fn exec_start_follows_the_binary() {
        assert_eq!(unit_text(Path::new(DEFAULT_BINARY)), UNIT_TEMPLATE);
        let t = unit_text(Path::new("/opt/plexd/bin/plexd"));
        assert!(t.contains("\nExecStart=/opt/plexd/bin/plexd run\n"), "{t}");
        assert!(!t.contains("/usr/bin/plexd run"));
        // The README's hand install puts the binary in /usr/local/bin.
        let t = unit_text(Path::new("/usr/local/bin/plexd"));
        assert!(t.contains("\nExecStart=/usr/local/bin/plexd run\n"), "{t}");
        let t = unit_text(Path::new("/opt/my dir/plexd"));
        assert!(t.contains("\nExecStart=\"/opt/my dir/plexd\" run\n"), "{t}");
        assert_eq!(t.lines().count(), UNIT_TEMPLATE.lines().count());
    }

    #[test]
    fn the_packaged_unit_serves_only_for_the_default_dir_when_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        let packaged = dir.path().join("plexd.service");
        let default = Path::new(DEFAULT_UNIT_DIR);
        assert!(!packaged_unit_serves(default, &packaged));
        std::fs::write(&packaged, UNIT_TEMPLATE).unwrap();
        assert!(packaged_unit_serves(default, &packaged));
        assert!(!packaged_unit_serves(dir.path(), &packaged));
    }

    #[test]
    fn unit_dirs() {
        assert!(is_systemd_unit_dir(Path::new("/etc/systemd/system")));
        assert!(!is_systemd_unit_dir(Path::new("/tmp/x")));
    }
}
