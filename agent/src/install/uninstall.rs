//! The local half of `plexd uninstall`, after the node has left (or was let go with
//! `--force`): stop and disable the unit, remove it, the emptied state dir and, with `--purge`,
//! the config plexd reads. Each step says what it did; a step that fails stops the rest, so
//! what is left is exactly what the message names.

use std::path::{Path, PathBuf};

use crate::exit::{ExitCode, Failure};
use crate::fsutil;
use crate::paths::{ConfigPaths, StatePaths, UNIT_FILE_NAME};

use super::unit::systemctl;

/// What to remove.
#[derive(Debug, Clone)]
pub(crate) struct UninstallSettings {
    pub config: ConfigPaths,
    pub token_file: PathBuf,
    pub state: StatePaths,
    pub unit_dir: PathBuf,
    /// Also remove the config file, the token file and the dropped CA.
    pub purge: bool,
    /// systemd runs and reads `unit_dir`: stop, disable and reload through `systemctl`.
    pub systemd: bool,
}

/// The lines `plexd uninstall` prints, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct UninstallReport {
    pub lines: Vec<String>,
}

impl UninstallReport {
    pub fn push(&mut self, line: impl Into<String>) {
        self.lines.push(line.into());
    }

    pub fn render(&self) -> String {
        self.lines.iter().map(|l| format!("{l}\n")).collect()
    }
}

/// Stops and disables the unit when systemd manages it. Runs before the node's local files go
/// when the node could not leave (`--force`), so no daemon is left running on them.
pub(crate) fn stop_unit(
    s: &UninstallSettings,
    report: &mut UninstallReport,
) -> Result<(), Failure> {
    let unit_file = s.unit_dir.join(UNIT_FILE_NAME);
    let packaged = std::path::Path::new(super::unit::PACKAGED_UNIT_FILE);
    if !unit_file.exists() && !super::unit::packaged_unit_serves(&s.unit_dir, packaged) {
        return Ok(());
    }
    if !s.systemd {
        report.push(format!(
            "systemd does not manage {} here (not running, or not a directory it reads); nothing to stop",
            unit_file.display()
        ));
        return Ok(());
    }
    systemctl(&["disable", "--now", UNIT_FILE_NAME]).map_err(|e| {
        Failure::new(
            ExitCode::Io,
            format!("{e}; the unit and the files are still in place; stop plexd by hand (systemctl stop plexd), then run plexd uninstall again"),
        )
    })?;
    report.push(format!("stopped and disabled {UNIT_FILE_NAME}"));
    Ok(())
}

/// Removes the unit, the state dir when nothing of anyone else's is left in it, and with
/// `purge` the config; then names what was kept.
pub(crate) fn remove_files(
    s: &UninstallSettings,
    report: &mut UninstallReport,
) -> Result<(), Failure> {
    let unit_file = s.unit_dir.join(UNIT_FILE_NAME);
    if remove_file(&unit_file)? {
        report.push(format!("removed {}", unit_file.display()));
        if s.systemd {
            match systemctl(&["daemon-reload"]) {
                Ok(()) => report.push("ran systemctl daemon-reload"),
                Err(e) => report.push(format!("warning: {e}; run systemctl daemon-reload by hand")),
            }
        }
    }
    remove_dir_if_empty(&s.state.dir, report)?;
    // `ca.crt` beside the config, and the directory itself, are plexd's only in a directory of
    // its own (`/etc/plexd`); a config kept in a shared directory leaves its neighbours alone.
    let own_dir = s.config.config_dir().file_name() == Some(std::ffi::OsStr::new("plexd"));
    let mut config_files = vec![s.config.config_file.clone(), s.token_file.clone()];
    if own_dir {
        config_files.push(s.config.dropped_ca_file());
    }
    if s.purge {
        for f in &config_files {
            if remove_file(f)? {
                report.push(format!("removed {}", f.display()));
            }
        }
        if own_dir {
            remove_dir_if_empty(&s.config.config_dir(), report)?;
        }
    } else {
        for f in config_files.iter().filter(|f| f.exists()) {
            report.push(format!(
                "kept {} (plexd uninstall --purge removes it)",
                f.display()
            ));
        }
    }
    Ok(())
}

/// How many of the files that keep a directory are named.
const NAMED: usize = 5;

/// True when the file was there and is gone now.
fn remove_file(path: &Path) -> Result<bool, Failure> {
    fsutil::remove_file_if_present(path).map_err(|e| {
        Failure::new(
            ExitCode::Io,
            format!(
                "cannot remove {}: {e}; remove it by hand, then run plexd uninstall again",
                path.display()
            ),
        )
    })
}

/// Removes `dir` when it is empty; names what kept it otherwise.
fn remove_dir_if_empty(dir: &Path, report: &mut UninstallReport) -> Result<(), Failure> {
    let entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(Failure::new(
                ExitCode::Io,
                format!("cannot read {}: {e}", dir.display()),
            ));
        }
    };
    if entries.is_empty() {
        std::fs::remove_dir(dir).map_err(|e| {
            Failure::new(
                ExitCode::Io,
                format!("cannot remove the empty directory {}: {e}", dir.display()),
            )
        })?;
        report.push(format!("removed {}", dir.display()));
    } else {
        let mut entries = entries;
        entries.sort();
        let more = entries.len().saturating_sub(NAMED);
        entries.truncate(NAMED);
        let mut names = entries.join(", ");
        if more > 0 {
            names.push_str(&format!(" and {more} more"));
        }
        report.push(format!(
            "kept {} (it holds files plexd did not write: {names})",
            dir.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purge_leaves_the_neighbours_of_a_config_in_a_shared_directory() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("etc");
        std::fs::create_dir_all(&shared).unwrap();
        for f in ["plexd.yaml", "ca.crt", "hosts"] {
            std::fs::write(shared.join(f), "x").unwrap();
        }
        let s = UninstallSettings {
            config: ConfigPaths::new(shared.join("plexd.yaml")),
            token_file: shared.join("bootstrap-token"),
            state: StatePaths::new(dir.path().join("state")),
            unit_dir: dir.path().join("units"),
            purge: true,
            systemd: false,
        };
        let mut report = UninstallReport::default();
        remove_files(&s, &mut report).unwrap();
        assert!(!shared.join("plexd.yaml").exists());
        assert!(shared.join("ca.crt").exists(), "not plexd's to remove");
        assert!(shared.join("hosts").exists());
        assert_eq!(
            report.lines,
            vec![format!("removed {}", shared.join("plexd.yaml").display())]
        );
    }

    fn settings(root: &Path, purge: bool) -> UninstallSettings {
        let etc = root.join("etc/plexd");
        UninstallSettings {
            config: ConfigPaths::new(etc.join("config.yaml")),
            token_file: etc.join("bootstrap-token"),
            state: StatePaths::new(root.join("state")),
            unit_dir: root.join("units"),
            purge,
            systemd: false,
        }
    }

    fn populate(root: &Path) {
        for d in ["etc/plexd", "state", "units"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in [
            "etc/plexd/config.yaml",
            "etc/plexd/bootstrap-token",
            "etc/plexd/ca.crt",
            "units/plexd.service",
        ] {
            std::fs::write(root.join(f), "x").unwrap();
        }
    }

    #[test]
    fn without_purge_the_config_is_kept_and_named() {
        let dir = tempfile::tempdir().unwrap();
        populate(dir.path());
        let s = settings(dir.path(), false);
        let mut report = UninstallReport::default();
        stop_unit(&s, &mut report).unwrap();
        remove_files(&s, &mut report).unwrap();
        let text = report.render();
        assert!(!dir.path().join("units/plexd.service").exists());
        assert!(!dir.path().join("state").exists());
        assert!(text.contains("systemd does not manage"), "{text}");
        for kept in ["config.yaml", "bootstrap-token", "ca.crt"] {
            assert!(dir.path().join("etc/plexd").join(kept).exists());
            assert!(
                text.contains(&format!("/etc/plexd/{kept} (plexd uninstall --purge")),
                "{text}"
            );
        }
    }

    #[test]
    fn purge_removes_the_config_and_keeps_what_is_not_plexds() {
        let dir = tempfile::tempdir().unwrap();
        populate(dir.path());
        std::fs::write(dir.path().join("state/notes.txt"), "mine").unwrap();
        let s = settings(dir.path(), true);
        let mut report = UninstallReport::default();
        remove_files(&s, &mut report).unwrap();
        assert!(!dir.path().join("etc/plexd").exists());
        assert!(dir.path().join("state/notes.txt").exists());
        let text = report.render();
        assert!(
            text.contains("it holds files plexd did not write: notes.txt"),
            "{text}"
        );

        for i in 0..7 {
            std::fs::write(dir.path().join(format!("state/f{i}")), "x").unwrap();
        }
        let mut listed = UninstallReport::default();
        remove_dir_if_empty(&dir.path().join("state"), &mut listed).unwrap();
        assert!(
            listed
                .render()
                .ends_with("f0, f1, f2, f3, f4 and 3 more)\n"),
            "{:?}",
            listed.lines
        );
        for i in 0..7 {
            std::fs::remove_file(dir.path().join(format!("state/f{i}"))).unwrap();
        }

        // Again: nothing left to do, and no error.
        let mut again = UninstallReport::default();
        remove_files(&s, &mut again).unwrap();
        assert_eq!(again.lines.len(), 1, "{:?}", again.lines);
    }
}
