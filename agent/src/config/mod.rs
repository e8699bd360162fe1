//! `/etc/plexd/config.yaml`: its shape, strict parsing, and errors that name the key, the file
//! and the line.

mod daemon;
pub mod dns;
mod locate;
pub mod metrics;
pub mod rotation;
pub mod routes;
pub mod values;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use daemon::{Backend, DaemonConfig, IntervalOverrides, ReachConfig, WireguardConfig};
pub use values::{ApiUrl, LogLevel, ResourceHandle, Sha256Pin};

/// The node agent's configuration. Every section refuses unknown keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The control plane's origin. Required for `join` and `run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_url: Option<ApiUrl>,
    /// Allows an `http://` api_url (only for tests behind a TLS-terminating proxy).
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_insecure_http: bool,
    /// The single-use bootstrap token (default `<config dir>/bootstrap-token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Where the key and the identity live (default `/var/lib/plexd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "TlsConfig::is_empty")]
    pub tls: TlsConfig,
    #[serde(default, skip_serializing_if = "Registration::is_empty")]
    pub registration: Registration,
    #[serde(default, skip_serializing_if = "LogConfig::is_empty")]
    pub log: LogConfig,
    #[serde(default, skip_serializing_if = "WireguardConfig::is_default")]
    pub wireguard: WireguardConfig,
    /// Tuning and test knobs of `plexd run`; the defaults suit production.
    #[serde(default, skip_serializing_if = "DaemonConfig::is_default")]
    pub daemon: DaemonConfig,
    /// How often the WireGuard key and the credential rotate by themselves.
    #[serde(default, skip_serializing_if = "rotation::RotationConfig::is_default")]
    pub rotation: rotation::RotationConfig,
    /// The opt-in Prometheus listener (docs/metrics.md).
    #[serde(default, skip_serializing_if = "metrics::MetricsConfig::is_default")]
    pub metrics: metrics::MetricsConfig,
    /// The resolver for mesh names (docs/dns.md).
    #[serde(default, skip_serializing_if = "dns::DnsConfig::is_default")]
    pub dns: dns::DnsConfig,
    /// Subnet routes and exit nodes (docs/routes.md).
    #[serde(default, skip_serializing_if = "routes::RoutesConfig::is_default")]
    pub routes: routes::RoutesConfig,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `tls:` extra trust besides the system store.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// A PEM file with extra CA certificates to trust.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Trust a private CA by the SHA-256 of its DER, without trusting it system-wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_sha256: Option<Sha256Pin>,
}

impl TlsConfig {
    fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.ca_sha256.is_none()
    }
}

/// `registration:` what the node asks for when it registers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_handle: Option<ResourceHandle>,
}

impl Registration {
    fn is_empty(&self) -> bool {
        self.project_id.is_none() && self.resource_handle.is_none()
    }
}

/// `log:` logging settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<LogLevel>,
}

impl LogConfig {
    fn is_empty(&self) -> bool {
        self.level.is_none()
    }
}

/// A config file plexd cannot use. The message is one line: `<file>[:<line>:<col>]: <what>`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "cannot read the config file {path}: {source}; run `plexd install --api-url https://<host>` or pass --config"
    )]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: the config file is empty; it needs at least `api_url: https://<host>`")]
    Empty { path: PathBuf },
    #[error("{}: {what}", locate::fmt_location(path, *at))]
    Invalid {
        path: PathBuf,
        /// 1-based line and column, when known.
        at: Option<(usize, usize)>,
        what: String,
    },
}

impl Config {
    /// Reads and parses a config file strictly.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses config text; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        if is_blank_yaml(text) {
            return Err(ConfigError::Empty {
                path: path.to_path_buf(),
            });
        }
        let config: Config = serde_yaml::from_str(text).map_err(|e| yaml_error(&e, path))?;
        config.check_api_url(text, path)?;
        config.check_daemon(text, path)?;
        if let Some(what) = config.metrics.problem() {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                at: locate::key(text, &["metrics", "listen"]),
                what,
            });
        }
        if let Some((keys, what)) = config.routes.problem() {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                at: locate::key(text, keys),
                what,
            });
        }
        Ok(config)
    }

    /// The api_url, required for join and run.
    pub fn require_api_url(&self, path: &Path) -> Result<&ApiUrl, ConfigError> {
        self.api_url.as_ref().ok_or_else(|| ConfigError::Invalid {
            path: path.to_path_buf(),
            at: None,
            what: "`api_url` is not set; add `api_url: https://<host>` or run `plexd install --api-url https://<host>`".to_owned(),
        })
    }

    fn check_daemon(&self, text: &str, path: &Path) -> Result<(), ConfigError> {
        let invalid = |keys: &[&str], what: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            at: locate::key(text, keys),
            what,
        };
        let d = &self.daemon;
        if d.stall_timeout_secs == 0 {
            return Err(invalid(
                &["daemon", "stall_timeout_secs"],
                "daemon.stall_timeout_secs: must be at least 1 (the default is 30)".to_owned(),
            ));
        }
        if d.backoff_initial_ms == 0
            || d.backoff_cap_secs.saturating_mul(1000) < d.backoff_initial_ms
        {
            return Err(invalid(
                &["daemon", "backoff_initial_ms"],
                "daemon.backoff_initial_ms: must be at least 1 and at most daemon.backoff_cap_secs"
                    .to_owned(),
            ));
        }
        if d.ingest_capacity == 0 {
            return Err(invalid(
                &["daemon", "ingest_capacity"],
                "daemon.ingest_capacity: must be at least 1 (the default is 1024)".to_owned(),
            ));
        }
        let wg = &self.wireguard;
        let name_ok = (1..=15).contains(&wg.interface.len())
            && wg
                .interface
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !name_ok {
            return Err(invalid(
                &["wireguard", "interface"],
                format!(
                    "wireguard.interface: `{}` is not an interface name (1-15 characters of a-z, A-Z, 0-9, `-`, `_`, `.`)",
                    wg.interface
                ),
            ));
        }
        if !(1280..=9000).contains(&wg.mtu) {
            return Err(invalid(
                &["wireguard", "mtu"],
                format!("wireguard.mtu: {} is outside 1280..=9000", wg.mtu),
            ));
        }
        if wg.crypto_workers > daemon::MAX_CRYPTO_WORKERS {
            return Err(invalid(
                &["wireguard", "crypto_workers"],
                format!(
                    "wireguard.crypto_workers: {} is over {}; give 0 (no pool) or the crypto threads wanted",
                    wg.crypto_workers,
                    daemon::MAX_CRYPTO_WORKERS
                ),
            ));
        }
        Ok(())
    }

    fn check_api_url(&self, text: &str, path: &Path) -> Result<(), ConfigError> {
        match &self.api_url {
            Some(url) if !url.is_https() && !self.allow_insecure_http => {
                Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    at: locate::key(text, &["api_url"]),
                    what: format!(
                        "api_url: `{url}` is plain http; use https:// (or set `allow_insecure_http: true` when a TLS proxy sits in front, for tests only)"
                    ),
                })
            }
            _ => Ok(()),
        }
    }
}

/// Whether YAML text holds no document (empty, or only comments and blank lines).
pub(crate) fn is_blank_yaml(text: &str) -> bool {
    text.lines().all(|l| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#') || t == "---"
    })
}

fn yaml_error(e: &serde_yaml::Error, path: &Path) -> ConfigError {
    let at = e.location().map(|l| (l.line(), l.column()));
    let mut what = e.to_string();
    if let Some(i) = what.rfind(" at line ") {
        what.truncate(i);
    }
    if what.starts_with("invalid type:") && what.contains("expected struct Config") {
        what = format!("{what}; the file must be a YAML mapping such as `api_url: https://<host>`");
    }
    ConfigError::Invalid {
        path: path.to_path_buf(),
        at,
        what,
    }
}

#[cfg(test)]
mod reference_tests;
#[cfg(test)]
mod tests;
