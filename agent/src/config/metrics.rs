//! `metrics:` the opt-in Prometheus listener of `plexd run` (docs/metrics.md). Off unless
//! `listen` is set; a loopback address unless `allow_non_loopback` says otherwise, because the
//! series name this node's peers and mesh addresses and the listener has no authentication.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// `metrics:`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve `GET /metrics` (plain HTTP) on this address, e.g. `127.0.0.1:9586`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Accept a `listen` address that is not loopback (a private network the scraper is on).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_non_loopback: bool,
}

impl MetricsConfig {
    pub(super) fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Why this section cannot be used, in one line naming the key, or `None`.
    pub(super) fn problem(&self) -> Option<String> {
        let addr = self.listen?;
        if !addr.ip().is_loopback() && !self.allow_non_loopback {
            return Some(format!(
                "metrics.listen: {addr} is not a loopback address and the listener has no authentication; use 127.0.0.1:{port} (or [::1]:{port}), or set metrics.allow_non_loopback: true to serve it on that network",
                port = addr.port()
            ));
        }
        None
    }
}
