//! `routes:` subnet routes this node offers, the exit it offers or uses (docs/routes.md "On
//! the node"). Reloadable: a SIGHUP sends the new report at once.
//!
//! What can be checked without the Domain's mesh range is checked when the file is read
//! (`plexd check-config` and every start/reload): a network address, not larger than
//! `/8` (IPv4) or `/32` (IPv6), not loopback, link-local, multicast, unspecified or broadcast,
//! no duplicates, the probe inside its CIDR, at most [`MAX_ADVERTISED_ROUTES`] (the exit
//! counts as two). The overlap with the mesh range is checked by `plexd run`, which knows the
//! range: such a route is left out of the report with a warning naming it.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;
use plexsphere_wire::routes::{MAX_ADVERTISED_ROUTES, check_route};
use serde::{Deserialize, Serialize};

/// One entry of `routes.advertise`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdvertiseEntry {
    pub cidr: IpNet,
    /// A host inside `cidr` that plexd pings; while it does not answer (2 misses in a row),
    /// this router reports the route unhealthy and another router takes over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<IpAddr>,
}

/// `routes:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutesConfig {
    /// What this node offers as a subnet router.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub advertise: Vec<AdvertiseEntry>,
    /// Masquerade forwarded traffic behind this node's LAN address (default true); false keeps
    /// the mesh source addresses, for networks that route the mesh range back.
    #[serde(default = "default_true")]
    pub snat: bool,
    /// Offer this node as an exit (`0.0.0.0/0` and `::/0`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exit: bool,
    /// Send this node's other traffic through that exit: a node's DNS name or id. Ignored
    /// while this node is an exit itself (`exit: true`): exits are not chained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_exit: Option<String>,
}

fn default_true() -> bool {
    true
}

impl Default for RoutesConfig {
    fn default() -> Self {
        Self {
            advertise: Vec::new(),
            snat: true,
            exit: false,
            use_exit: None,
        }
    }
}

/// A mesh range of the other family than `cidr`: [`check_route`] then checks everything but
/// the overlap with the real mesh range (unknown before enrolment).
fn no_mesh(cidr: IpNet) -> IpNet {
    match cidr {
        IpNet::V4(_) => IpNet::from(IpAddr::from(std::net::Ipv6Addr::LOCALHOST)),
        IpNet::V6(_) => IpNet::from(IpAddr::from(std::net::Ipv4Addr::LOCALHOST)),
    }
}

impl RoutesConfig {
    pub(super) fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Whether this node reports anything (advertises a route or offers an exit). A node
    /// that only uses an exit reports too, so the control plane knows which one.
    pub fn reports(&self) -> bool {
        !self.advertise.is_empty() || self.exit || self.use_exit.is_some()
    }

    /// Why this section cannot be used: the key path and one line, or `None`.
    pub(super) fn problem(&self) -> Option<(&'static [&'static str], String)> {
        const ADV: &[&str] = &["routes", "advertise"];
        let count = self.advertise.len() + if self.exit { 2 } else { 0 };
        if count > MAX_ADVERTISED_ROUTES {
            return Some((
                ADV,
                format!(
                    "routes.advertise: {count} routes (the exit counts as two) are more than the {MAX_ADVERTISED_ROUTES} a node may offer; merge adjacent CIDRs"
                ),
            ));
        }
        let mut seen = HashSet::new();
        for r in &self.advertise {
            if let Err(e) = check_route(r.cidr, no_mesh(r.cidr)) {
                return Some((ADV, format!("routes.advertise: {e}")));
            }
            if !seen.insert(r.cidr) {
                return Some((ADV, format!("routes.advertise: {} is listed twice", r.cidr)));
            }
            if let Some(p) = r.probe
                && !r.cidr.contains(&p)
            {
                return Some((
                    ADV,
                    format!(
                        "routes.advertise: the probe {p} of {} is not inside it; probe a host of that network",
                        r.cidr
                    ),
                ));
            }
        }
        if let Some(name) = &self.use_exit {
            let is_id = uuid::Uuid::parse_str(name).is_ok();
            if !is_id && plexsphere_wire::routes::check_label(name).is_err() {
                return Some((
                    &["routes", "use_exit"],
                    format!(
                        "routes.use_exit: {name:?} is neither a node name (a DNS label: a-z, 0-9, '-') nor a node id"
                    ),
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<crate::config::Config, String> {
        crate::config::Config::parse(text, std::path::Path::new("/etc/plexd/config.yaml"))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_section_parses_with_its_defaults() {
        let c = parse("routes:\n  advertise:\n    - cidr: 10.1.0.0/24\n      probe: 10.1.0.5\n    - cidr: fd12:3456::/48\n  use_exit: gw-1\n").expect("valid");
        assert_eq!(c.routes.advertise.len(), 2);
        assert!(c.routes.snat);
        assert!(!c.routes.exit);
        assert_eq!(c.routes.use_exit.as_deref(), Some("gw-1"));
        assert!(c.routes.reports());
        assert!(
            !parse("api_url: https://x\n")
                .expect("valid")
                .routes
                .reports()
        );
    }

    #[test]
    fn bad_routes_are_refused_with_the_key_and_the_line() {
        for (text, want) in [
            (
                "routes:\n  advertise:\n    - cidr: 10.1.0.7/24\n",
                "not a network address",
            ),
            (
                "routes:\n  advertise:\n    - cidr: 10.0.0.0/7\n",
                "too large",
            ),
            (
                "routes:\n  advertise:\n    - cidr: 127.0.0.0/8\n",
                "loopback",
            ),
            (
                "routes:\n  advertise:\n    - cidr: 10.1.0.0/24\n    - cidr: 10.1.0.0/24\n",
                "listed twice",
            ),
            (
                "routes:\n  advertise:\n    - cidr: 10.1.0.0/24\n      probe: 10.2.0.1\n",
                "not inside it",
            ),
            ("routes:\n  use_exit: Bad_Name\n", "neither a node name"),
            ("routes:\n  advertize: []\n", "unknown field"),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.contains(want), "{text}: {e}");
            assert!(e.starts_with("/etc/plexd/config.yaml:"), "{e}");
        }
        let many: String = (0..=MAX_ADVERTISED_ROUTES)
            .map(|i| format!("    - cidr: 10.{}.{}.0/24\n", 1 + i / 200, i % 200))
            .collect();
        let e = parse(&format!("routes:\n  advertise:\n{many}")).expect_err("too many");
        assert!(e.contains("more than the 64"), "{e}");
    }
}
