//! `dns:` plexd's resolver for mesh names (docs/dns.md). On by default: it answers only this
//! host's own queries, on the mesh address, and tells systemd-resolved to send it only the
//! mesh's suffix.

use serde::{Deserialize, Serialize};

/// The port plexd listens on (systemd-resolved's link DNS server is an address; with another
/// port it must be `SetLinkDNSEx`, which plexd uses, so tests may pick a free one).
pub const DNS_PORT: u16 = 53;

/// `dns:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsConfig {
    /// `false`: no resolver, no systemd-resolved settings (all of docs/dns.md off).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub enabled: bool,
    /// The resolver's port on the mesh address (53; another one for tests and benchmarks).
    #[serde(default = "port", skip_serializing_if = "is_default_port")]
    pub port: u16,
    /// `false`: serve names but leave systemd-resolved alone (a host that forwards the
    /// suffix by other means).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub resolved: bool,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn port() -> u16 {
    DNS_PORT
}

fn is_default_port(p: &u16) -> bool {
    *p == DNS_PORT
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            enabled: true,
            port: DNS_PORT,
            resolved: true,
        }
    }
}

impl DnsConfig {
    pub(super) fn is_default(&self) -> bool {
        *self == Self::default()
    }
}
