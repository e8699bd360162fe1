//! `wireguard:` (the data plane) and `daemon:` (tuning and test knobs) sections of config.yaml.

use serde::{Deserialize, Serialize};

/// `wireguard.backend`: which data plane carries the mesh traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// The kernel module when present, else the embedded userspace data plane.
    #[default]
    Auto,
    Kernel,
    Userspace,
    /// Control plane only: the desired peers are tracked and reported, no traffic is carried.
    None,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Kernel => "kernel",
            Backend::Userspace => "userspace",
            Backend::None => "none",
        }
    }
}

pub(crate) const DEFAULT_INTERFACE: &str = "plexd0";
pub const DEFAULT_MTU: u16 = 1420;

/// `wireguard:` the interface plexd programs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireguardConfig {
    #[serde(default)]
    pub backend: Backend,
    #[serde(default = "default_interface")]
    pub interface: String,
    #[serde(default = "default_listen_port")]
    pub listen_port: u16,
    #[serde(default = "default_mtu")]
    pub mtu: u16,
    /// `wireguard.reach:` NAT traversal and relays (docs/reach.md).
    #[serde(default, skip_serializing_if = "ReachConfig::is_default")]
    pub reach: ReachConfig,
    /// The userspace backend's ordered crypto pool: threads that seal and open one peer's
    /// packets in parallel (0: none, the default; at most `MAX_CRYPTO_WORKERS`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub crypto_workers: u8,
}

/// The most `wireguard.crypto_workers` plexd takes.
pub(crate) const MAX_CRYPTO_WORKERS: u8 = 64;

fn is_zero(n: &u8) -> bool {
    *n == 0
}

/// `wireguard.reach:` the reach runtime (STUN, disco path probes, relays) of the kernel and
/// userspace backends; docs/reach.md.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReachConfig {
    /// Off: peers keep the endpoints the control plane reports (the rotation), nothing else
    /// shares the WireGuard port, no relay is used.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// No longer used: the kernel interface listens on `listen_port` and plexd shares the
    /// port (`mesh::shared_port`). Still read, so a config written for an earlier plexd keeps
    /// starting; the kernel backend warns when it is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_port: Option<u16>,
}

fn default_true() -> bool {
    true
}

impl Default for ReachConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            kernel_port: None,
        }
    }
}

impl ReachConfig {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

fn default_interface() -> String {
    DEFAULT_INTERFACE.to_owned()
}
fn default_listen_port() -> u16 {
    plexsphere_wire::WIREGUARD_PORT
}
fn default_mtu() -> u16 {
    DEFAULT_MTU
}

impl Default for WireguardConfig {
    fn default() -> Self {
        Self {
            backend: Backend::default(),
            interface: default_interface(),
            listen_port: default_listen_port(),
            mtu: default_mtu(),
            reach: ReachConfig::default(),
            crypto_workers: 0,
        }
    }
}

impl WireguardConfig {
    pub(super) fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// `daemon:` tuning of `plexd run`, mostly for tests; the defaults suit production.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// Tear the event stream down when no byte (event or keep-alive) arrived for this long
    /// (three keep-alive periods).
    #[serde(default = "default_stall")]
    pub stall_timeout_secs: u64,
    /// The shortest interval plexd accepts from the server for any periodic task.
    #[serde(default = "default_min_interval")]
    pub min_interval_secs: u64,
    /// Local overrides of the server's intervals (seconds), e.g. `heartbeat_secs: 2` in tests.
    #[serde(default, skip_serializing_if = "IntervalOverrides::is_empty")]
    pub intervals: IntervalOverrides,
    /// The first reconnect delay of the event stream and of failed calls, in milliseconds.
    #[serde(default = "default_backoff_initial")]
    pub backoff_initial_ms: u64,
    /// The longest reconnect delay, in seconds.
    #[serde(default = "default_backoff_cap")]
    pub backoff_cap_secs: u64,
    /// A stream that stayed up this long resets the backoff.
    #[serde(default = "default_healthy")]
    pub healthy_after_secs: u64,
    /// Observations kept in memory while the API is away (oldest dropped first).
    #[serde(default = "default_ingest_capacity")]
    pub ingest_capacity: usize,
}

fn default_stall() -> u64 {
    3 * plexsphere_wire::node::SSE_KEEPALIVE_SECS
}
fn default_min_interval() -> u64 {
    1
}
fn default_backoff_initial() -> u64 {
    1000
}
fn default_backoff_cap() -> u64 {
    60
}
fn default_healthy() -> u64 {
    30
}
fn default_ingest_capacity() -> usize {
    1024
}

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            stall_timeout_secs: default_stall(),
            min_interval_secs: default_min_interval(),
            intervals: IntervalOverrides::default(),
            backoff_initial_ms: default_backoff_initial(),
            backoff_cap_secs: default_backoff_cap(),
            healthy_after_secs: default_healthy(),
            ingest_capacity: default_ingest_capacity(),
        }
    }
}

impl DaemonConfig {
    pub(super) fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// `daemon.intervals`: each unset key keeps the server's value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntervalOverrides {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_secs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_report_secs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_poll_secs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingest_secs: Option<u32>,
}

impl IntervalOverrides {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The server's intervals with the local overrides on top.
    pub fn apply(&self, server: plexsphere_wire::Intervals) -> plexsphere_wire::Intervals {
        plexsphere_wire::Intervals {
            heartbeat_secs: self.heartbeat_secs.unwrap_or(server.heartbeat_secs),
            endpoint_report_secs: self
                .endpoint_report_secs
                .unwrap_or(server.endpoint_report_secs),
            state_poll_secs: self.state_poll_secs.unwrap_or(server.state_poll_secs),
            ingest_secs: self.ingest_secs.unwrap_or(server.ingest_secs),
        }
    }
}
