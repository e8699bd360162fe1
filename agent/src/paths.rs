//! Where plexd keeps its files. Every path can be redirected (flags or environment), so tests
//! and packages can use other roots.

use std::path::{Path, PathBuf};

pub(crate) const DEFAULT_CONFIG_FILE: &str = "/etc/plexd/config.yaml";
pub(crate) const DEFAULT_STATE_DIR: &str = "/var/lib/plexd";
pub(crate) const DEFAULT_UNIT_DIR: &str = "/etc/systemd/system";
/// The binary path written in `systemd/plexd.service`: where the packages put it. `plexd install`
/// writes the path of the binary it runs from instead (`install::unit::unit_text`).
pub(crate) const DEFAULT_BINARY: &str = "/usr/bin/plexd";

/// The file names inside the config and state directories.
pub(crate) const CA_FILE_NAME: &str = "ca.crt";
pub(crate) const TOKEN_FILE_NAME: &str = "bootstrap-token";
pub(crate) const KEY_FILE_NAME: &str = "wireguard.key";
pub(crate) const IDENTITY_FILE_NAME: &str = "identity.json";
pub(crate) const UNIT_FILE_NAME: &str = "plexd.service";

/// The config file and what derives from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigPaths {
    pub config_file: PathBuf,
}

impl ConfigPaths {
    pub fn new(config_file: impl Into<PathBuf>) -> Self {
        Self {
            config_file: config_file.into(),
        }
    }

    /// The directory holding the config file (`/etc/plexd`).
    pub fn config_dir(&self) -> PathBuf {
        match self.config_file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    /// The extra CA cloud-init or the NixOS module drops beside the config (`/etc/plexd/ca.crt`).
    pub(crate) fn dropped_ca_file(&self) -> PathBuf {
        self.config_dir().join(CA_FILE_NAME)
    }

    /// The token file used when neither the config nor a flag names one.
    pub(crate) fn default_token_file(&self) -> PathBuf {
        self.config_dir().join(TOKEN_FILE_NAME)
    }
}

/// The state directory and its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatePaths {
    pub dir: PathBuf,
}

impl StatePaths {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn key_file(&self) -> PathBuf {
        self.dir.join(KEY_FILE_NAME)
    }

    pub fn identity_file(&self) -> PathBuf {
        self.dir.join(IDENTITY_FILE_NAME)
    }
}

/// The state dir by precedence: flag or `PLEXD_STATE_DIR`, then the config's `state_dir`,
/// then the default.
pub(crate) fn resolve_state_dir(flag_or_env: Option<&Path>, from_config: Option<&Path>) -> PathBuf {
    flag_or_env
        .or(from_config)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_paths_follow_the_config_file() {
        let c = ConfigPaths::new("/tmp/x/etc/plexd/config.yaml");
        assert_eq!(c.config_dir(), PathBuf::from("/tmp/x/etc/plexd"));
        assert_eq!(
            c.dropped_ca_file(),
            PathBuf::from("/tmp/x/etc/plexd/ca.crt")
        );
        assert_eq!(
            c.default_token_file(),
            PathBuf::from("/tmp/x/etc/plexd/bootstrap-token")
        );
        assert_eq!(
            ConfigPaths::new("config.yaml").config_dir(),
            PathBuf::from(".")
        );
    }

    #[test]
    fn state_dir_precedence() {
        let flag = Path::new("/flag");
        let conf = Path::new("/conf");
        assert_eq!(resolve_state_dir(Some(flag), Some(conf)), flag);
        assert_eq!(resolve_state_dir(None, Some(conf)), conf);
        assert_eq!(resolve_state_dir(None, None), Path::new(DEFAULT_STATE_DIR));
        let s = StatePaths::new("/s");
        assert_eq!(s.identity_file(), Path::new("/s/identity.json"));
        assert_eq!(s.key_file(), Path::new("/s/wireguard.key"));
    }
}
