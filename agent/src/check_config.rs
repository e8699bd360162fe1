//! `plexd check-config`: reads the config as `join` and `run` would, without touching the
//! network, the state dir or an interface, and says what is wrong (exit 78) or what plexd
//! would use.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::exit::Failure;
use crate::paths::{self, ConfigPaths};

/// What a valid config resolves to, for the summary `check-config` prints.
#[derive(Debug)]
pub struct Checked {
    pub config_file: PathBuf,
    pub config: Config,
    pub state_dir: PathBuf,
    pub token_file: PathBuf,
    /// The CA files plexd trusts besides the system store, each read and parsed.
    pub ca_files: Vec<(PathBuf, usize)>,
}

/// Parses and validates the config strictly (unknown keys, values, ranges), requires
/// `api_url`, and reads every CA file it would trust (`ca.crt` beside the config,
/// `tls.ca_file`). The first problem is the failure, with the file and line.
pub fn check(config_file: &Path, state_dir_flag: Option<&Path>) -> Result<Checked, Failure> {
    let config_paths = ConfigPaths::new(config_file);
    let config = Config::load(config_file)?;
    config.require_api_url(config_file)?;
    let mut ca_files = Vec::new();
    let dropped = config_paths.dropped_ca_file();
    let candidates = dropped
        .exists()
        .then_some(dropped)
        .into_iter()
        .chain(config.tls.ca_file.clone());
    for path in candidates {
        let certs = crate::tls::load_pem_certs(&path)?;
        ca_files.push((path, certs.len()));
    }
    Ok(Checked {
        config_file: config_file.to_path_buf(),
        state_dir: paths::resolve_state_dir(state_dir_flag, config.state_dir.as_deref()),
        token_file: config
            .token_file
            .clone()
            .unwrap_or_else(|| config_paths.default_token_file()),
        config,
        ca_files,
    })
}

impl Checked {
    /// `<file>: valid` and the settings that matter for enrolment, one per line.
    pub fn render(&self) -> String {
        let mut out = format!("{}: valid\n", self.config_file.display());
        let api = self
            .config
            .api_url
            .as_ref()
            .map_or_else(String::new, |u| u.to_string());
        let _ = writeln!(out, "  api_url: {api}");
        let _ = writeln!(out, "  token_file: {}", self.token_file.display());
        let _ = writeln!(out, "  state_dir: {}", self.state_dir.display());
        let _ = writeln!(out, "  wireguard: {}", self.config.wireguard.interface);
        for (path, n) in &self.ca_files {
            let s = if *n == 1 { "" } else { "s" };
            let _ = writeln!(out, "  ca file: {} ({n} certificate{s})", path.display());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::ExitCode;

    fn write(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("config.yaml");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_valid_config_resolves_its_paths() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "api_url: https://plexsphere.example\n");
        let checked = check(&path, Some(Path::new("/tmp/state"))).unwrap();
        assert_eq!(checked.token_file, dir.path().join("bootstrap-token"));
        assert_eq!(checked.state_dir, PathBuf::from("/tmp/state"));
        assert!(checked.ca_files.is_empty());
        let text = checked.render();
        assert!(
            text.starts_with(&format!("{}: valid\n", path.display())),
            "{text}"
        );
        assert!(
            text.contains("  api_url: https://plexsphere.example"),
            "{text}"
        );
    }

    #[test]
    fn problems_are_config_failures_that_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        for (text, needle) in [
            (
                "api_url: https://a.example\nno_such_key: 1\n",
                "no_such_key",
            ),
            ("state_dir: /var/lib/plexd\n", "`api_url` is not set"),
            (
                "api_url: https://a.example\nwireguard:\n  mtu: 100\n",
                "wireguard.mtu",
            ),
        ] {
            let path = write(dir.path(), text);
            let f = check(&path, None).unwrap_err();
            assert_eq!(f.code, ExitCode::Config, "{text}");
            assert!(f.message.contains(needle), "{text}: {}", f.message);
            assert!(f.message.contains("config.yaml"), "{}", f.message);
        }
        let f = check(&dir.path().join("missing.yaml"), None).unwrap_err();
        assert_eq!(f.code, ExitCode::Config);
        assert!(f.message.contains("missing.yaml"), "{}", f.message);
    }

    #[test]
    fn a_ca_file_that_is_not_pem_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("extra-ca.pem");
        std::fs::write(&ca, "not a certificate\n").unwrap();
        let path = write(
            dir.path(),
            &format!(
                "api_url: https://a.example\ntls:\n  ca_file: {}\n",
                ca.display()
            ),
        );
        let f = check(&path, None).unwrap_err();
        assert_eq!(f.code, ExitCode::Config);
        assert!(f.message.contains("extra-ca.pem"), "{}", f.message);
    }
}
