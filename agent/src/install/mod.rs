//! `plexd install`: the config dir, config.yaml (merged), and the systemd unit. It does not
//! start the service.

mod merge;
pub mod uninstall;
mod unit;

use std::path::PathBuf;

pub use merge::{MergeError, Merged, Wanted, merge};
pub use unit::{UNIT_TEMPLATE, is_systemd_unit_dir, systemd_is_running, unit_text};

use crate::config::ApiUrl;
use crate::exit::{ExitCode, Failure};
use crate::fsutil::{self, FsError};
use crate::paths::{ConfigPaths, DEFAULT_BINARY, UNIT_FILE_NAME};
use crate::tls;

/// What `plexd install` was asked to do.
#[derive(Debug, Clone)]
pub struct InstallSettings {
    pub config: ConfigPaths,
    pub unit_dir: PathBuf,
    pub api_url: String,
    pub token_file: PathBuf,
    pub ca_file: Option<PathBuf>,
    pub force: bool,
    /// The binary the unit starts.
    pub exe: PathBuf,
    /// Run `systemctl daemon-reload` after writing the unit.
    pub reload_systemd: bool,
}

/// What `plexd install` did, line by line, for stdout.
#[derive(Debug, Clone, Default)]
pub struct InstallReport {
    pub done: Vec<String>,
    pub warnings: Vec<String>,
    pub changed: bool,
}

impl InstallReport {
    pub fn render(&self, config_file: &std::path::Path) -> String {
        let mut out = String::new();
        for l in &self.done {
            out.push_str(l);
            out.push('\n');
        }
        if !self.changed {
            out.push_str("nothing changed: plexd is already installed with these settings\n");
        }
        for w in &self.warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
        out.push_str(&format!(
            "next steps:\n  1. add registration.project_id and registration.resource_handle to {}\n  2. systemctl enable --now plexd\n  3. journalctl -u plexd -f\n",
            config_file.display()
        ));
        out
    }
}

pub fn install(s: &InstallSettings) -> Result<InstallReport, Failure> {
    let mut report = InstallReport::default();
    let config_file = &s.config.config_file;
    let config_dir = s.config.config_dir();

    let api_url = ApiUrl::parse(&s.api_url)
        .map_err(|e| Failure::new(ExitCode::Usage, format!("--api-url: {e}")))?;
    let token_file = abs(&s.token_file)?;
    let ca_file = s.ca_file.as_deref().map(abs).transpose()?;
    if let Some(ca) = &ca_file {
        tls::load_pem_certs(ca)?;
    }

    if !config_dir.exists() {
        report
            .done
            .push(format!("created {} (0700)", config_dir.display()));
    }
    fsutil::ensure_dir(&config_dir, 0o700)?;

    let existing = match std::fs::read_to_string(config_file) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(FsError::new("cannot read", config_file, e).into()),
    };
    let wanted = Wanted {
        api_url,
        token_file: token_file.display().to_string(),
        ca_file: ca_file.as_ref().map(|p| p.display().to_string()),
    };
    let merged =
        merge(existing.as_deref(), &wanted, s.force, config_file).map_err(|e| match e {
            MergeError::Existing(c) => Failure::from(c),
            e => Failure::new(ExitCode::Config, e),
        })?;
    if merged.changed.is_empty() {
        report
            .done
            .push(format!("{} unchanged", config_file.display()));
        fsutil::enforce_private(config_file)?;
    } else {
        fsutil::write_atomic(config_file, merged.text.as_bytes(), 0o600)?;
        report.changed = true;
        report.done.push(format!(
            "wrote {} (0600): set {}",
            config_file.display(),
            merged.changed.join(", ")
        ));
    }

    install_unit(s, &mut report)?;

    match fsutil::mode_of(&token_file) {
        Err(_) => report.warnings.push(format!(
            "the token file {} does not exist yet; write the bootstrap token to it (mode 0600) before starting plexd",
            token_file.display()
        )),
        Ok(mode) if mode & 0o077 != 0 => report.warnings.push(format!(
            "the token file {} has mode {mode:o}; run chmod 600 {}",
            token_file.display(),
            token_file.display()
        )),
        Ok(_) => {}
    }
    Ok(report)
}

fn install_unit(s: &InstallSettings, report: &mut InstallReport) -> Result<(), Failure> {
    let unit_file = s.unit_dir.join(UNIT_FILE_NAME);
    let packaged = std::path::Path::new(unit::PACKAGED_UNIT_FILE);
    if s.exe == std::path::Path::new(DEFAULT_BINARY)
        && unit::packaged_unit_serves(&s.unit_dir, packaged)
    {
        report.done.push(format!(
            "using the packaged unit {} (ExecStart={} run); wrote no unit to {}",
            packaged.display(),
            s.exe.display(),
            s.unit_dir.display()
        ));
        return Ok(());
    }
    let text = unit_text(&s.exe);
    if std::fs::read_to_string(&unit_file).is_ok_and(|old| old == text) {
        report
            .done
            .push(format!("{} unchanged", unit_file.display()));
        return Ok(());
    }
    if !s.unit_dir.exists() {
        std::fs::create_dir_all(&s.unit_dir)
            .map_err(|e| FsError::new("cannot create directory", &s.unit_dir, e))?;
    }
    fsutil::write_atomic(&unit_file, text.as_bytes(), 0o644)?;
    report.changed = true;
    report.done.push(format!(
        "wrote {} (ExecStart={} run)",
        unit_file.display(),
        s.exe.display()
    ));
    if s.reload_systemd {
        match unit::systemctl(&["daemon-reload"]) {
            Ok(()) => report.done.push("ran systemctl daemon-reload".to_owned()),
            Err(e) => report.warnings.push(format!("{e}; run it by hand")),
        }
    } else {
        report.done.push(
            "did not reload systemd (not running, or the unit dir is not one systemd reads)"
                .to_owned(),
        );
    }
    Ok(())
}

fn abs(p: &std::path::Path) -> Result<PathBuf, Failure> {
    std::path::absolute(p).map_err(|e| {
        Failure::new(
            ExitCode::Usage,
            format!("cannot make {} absolute: {e}", p.display()),
        )
    })
}
