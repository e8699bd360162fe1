//! Subnet routes, exit nodes and DNS names: what a node offers and uses, what the control plane
//! answers, and the rules both sides check (docs/routes.md, docs/dns.md).
//!
//! | call | path |
//! |---|---|
//! | route report (node) | `PUT /v1/nodes/{id}/routes` ([`RoutesReport`] -> [`RoutesAck`]) |
//! | route list (operator) | `GET /v1/routes` (-> `Vec<`[`RouteEntry`]`>`) |
//! | approve / deny (operator) | `POST /v1/routes/approve`, `POST /v1/routes/deny` ([`RouteDecision`] -> the route's [`RouteEntry`]) |
//! | rename a node (operator) | `PUT /v1/nodes/{id}/name` ([`RenameRequest`] -> the node's `admin::NodeView`) |
//! | a Domain's DNS suffix (operator) | `GET`/`PUT /v1/domains/{id}/dns` ([`DnsSettings`]) |
//!
//! A node that advertises anything sends its report when its configuration or a probe's
//! verdict changes and at least every [`ROUTE_RENEW_SECS`]; the control plane treats its
//! routes as gone (not offline for anything else) when no report came for
//! [`ROUTE_LEASE_SECS`]. That lease, not the heartbeat, is how a killed router is noticed
//! within the failover bound.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::endpoint::{Unusable, unusable};

/// A node that advertises routes reports at least this often, in seconds.
pub const ROUTE_RENEW_SECS: u64 = 1;
/// Without a report for this long, a node's advertised routes count as gone, in seconds.
pub const ROUTE_LEASE_SECS: u64 = 4;
/// The most routes one node may advertise (the exit counts as two, `0.0.0.0/0` and `::/0`).
pub const MAX_ADVERTISED_ROUTES: usize = 64;
/// The shortest IPv4 prefix a subnet route may have (an exit is `/0` and asked for apart).
pub const MIN_PREFIX_V4: u8 = 8;
/// The shortest IPv6 prefix a subnet route may have.
pub const MIN_PREFIX_V6: u8 = 32;
/// The longest DNS label (RFC 1035).
pub const MAX_LABEL_LEN: usize = 63;
/// The longest DNS suffix, in characters (leaves room for a label under the 253 limit).
pub const MAX_SUFFIX_LEN: usize = 180;
/// The DNS suffix a Domain has until an operator sets one.
pub const DEFAULT_DNS_SUFFIX: &str = "mesh.internal";

/// One route a node offers (`routes.advertise` in plexd's configuration).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdvertisedRoute {
    /// A network address (`10.1.0.0/24`, not `10.1.0.7/24`), checked with [`check_route`].
    pub cidr: IpNet,
    /// A host inside `cidr` the router probes; while the probe fails the router is unhealthy
    /// for this route and another router takes over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<IpAddr>,
    /// The router's own verdict on this route: true when it has no probe or its probe
    /// answers (with the hysteresis of docs/routes.md).
    pub healthy: bool,
}

/// `PUT /v1/nodes/{id}/routes`: everything this node offers and which exit it uses. Sending an
/// empty report withdraws every route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutesReport {
    #[serde(default)]
    pub advertise: Vec<AdvertisedRoute>,
    /// The node offers itself as an exit (`0.0.0.0/0` and `::/0`), approved like a route.
    #[serde(default)]
    pub exit: bool,
    /// The exit this node sends its other traffic through: a node's DNS name or id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_exit: Option<String>,
}

/// Whether an operator (or the policy's auto-approvers) let a route be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    Pending,
    Approved,
    Denied,
}

/// What one router is for one route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouterRole {
    /// Carries the route: peers have the CIDR in this router's allowed IPs.
    Primary,
    /// Approved and healthy, waits to take over.
    Standby,
    /// Not eligible now (pending, denied, unhealthy, lease expired, or healthy for less
    /// than the hold-down); [`RouterStatus::reason`] says which.
    Inactive,
}

/// The control plane's view of one of the reporting node's routes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteStatus {
    pub cidr: IpNet,
    pub approval: Approval,
    pub role: RouterRole,
    /// Why the role is what it is, for a person (`"primary since 12:03:04"`, `"probe fails"`).
    pub reason: String,
}

/// The answer to a [`RoutesReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutesAck {
    pub routes: Vec<RouteStatus>,
    /// Report again within this many seconds ([`ROUTE_RENEW_SECS`] today).
    pub renew_secs: u64,
    /// Why `use_exit` is not in effect, when it is not (unknown node, not an approved exit,
    /// the policy does not allow it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_exit_error: Option<String>,
}

/// One router of a [`RouteEntry`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterStatus {
    pub node_id: Uuid,
    pub name: String,
    pub approval: Approval,
    pub role: RouterRole,
    pub healthy: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<IpAddr>,
    /// Unix seconds of the router's last report.
    pub last_report: i64,
    pub reason: String,
}

/// `GET /v1/routes`: a route and every node that advertises it, primary first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteEntry {
    pub domain_id: Uuid,
    pub cidr: IpNet,
    pub routers: Vec<RouterStatus>,
}

/// `POST /v1/routes/approve` and `/deny`: one node's one route (`0.0.0.0/0` for an exit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteDecision {
    pub node_id: Uuid,
    pub cidr: IpNet,
}

/// `PUT /v1/nodes/{id}/name`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    pub name: String,
}

/// `GET`/`PUT /v1/domains/{id}/dns`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsSettings {
    /// Names are `<node name>.<suffix>`.
    pub suffix: String,
}

/// What [`crate::node::NodeState::dns`] carries: the node's own name and its Domain's suffix.
/// The peers' names are [`crate::node::PeerSpec::dns_name`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsState {
    pub suffix: String,
    pub name: String,
}

/// One route this node serves as a router, in its signed state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedRoute {
    pub cidr: IpNet,
    pub role: RouterRole,
}

/// Why a CIDR cannot be a subnet route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteRefused {
    #[error("{0} is not a network address: write {1}")]
    NotNetwork(IpNet, IpNet),
    #[error(
        "{0} is too large: IPv4 routes need a prefix of /{MIN_PREFIX_V4} or longer, IPv6 /{MIN_PREFIX_V6} (offer 0.0.0.0/0 with `exit: true` instead)"
    )]
    TooLarge(IpNet),
    #[error("{0} overlaps the Domain's mesh range {1}: the mesh cannot route through itself")]
    MeshRange(IpNet, IpNet),
    #[error("{0} is {1}")]
    Reserved(IpNet, &'static str),
}

/// Checks `cidr` as a subnet route of a Domain whose mesh range is `mesh`: a network address,
/// not larger than [`MIN_PREFIX_V4`]/[`MIN_PREFIX_V6`], not loopback, link-local, multicast,
/// unspecified or broadcast, not overlapping the mesh range. The exit's `/0` routes are not
/// subnet routes and never pass.
pub fn check_route(cidr: IpNet, mesh: IpNet) -> Result<(), RouteRefused> {
    if cidr.trunc() != cidr {
        return Err(RouteRefused::NotNetwork(cidr, cidr.trunc()));
    }
    let min = match cidr {
        IpNet::V4(_) => MIN_PREFIX_V4,
        IpNet::V6(_) => MIN_PREFIX_V6,
    };
    if cidr.prefix_len() < min {
        return Err(RouteRefused::TooLarge(cidr));
    }
    if cidr.contains(&mesh) || mesh.contains(&cidr) {
        return Err(RouteRefused::MeshRange(cidr, mesh));
    }
    // The network's first and last address tell its kind: a prefix of /8 or longer lies
    // inside one of the reserved blocks or outside all of them, except for a block that
    // ends inside it (checked through both ends).
    for ip in [cidr.network(), cidr.broadcast()] {
        match unusable(ip, mesh) {
            Some(Unusable::MeshRange) => return Err(RouteRefused::MeshRange(cidr, mesh)),
            Some(kind) => return Err(RouteRefused::Reserved(cidr, kind.describe())),
            None => {}
        }
    }
    Ok(())
}

/// Why a name cannot be a node's DNS label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameRefused {
    #[error("a node name cannot be empty")]
    Empty,
    #[error("{0:?} is longer than {MAX_LABEL_LEN} characters")]
    TooLong(String),
    #[error(
        "{0:?} is not a DNS label: use lowercase letters a-z, digits and '-', not at the start or end"
    )]
    Invalid(String),
}

/// Checks `name` as a node's DNS label: 1 to 63 of `a-z 0-9 -`, no `-` first or last, not all
/// digits (it would read as an address). Uppercase is refused, not folded: the name an
/// operator types is the name the mesh answers.
pub fn check_label(name: &str) -> Result<(), NameRefused> {
    if name.is_empty() {
        return Err(NameRefused::Empty);
    }
    if name.len() > MAX_LABEL_LEN {
        return Err(NameRefused::TooLong(name.to_string()));
    }
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let all_digits = name.bytes().all(|b| b.is_ascii_digit());
    if !ok_chars || name.starts_with('-') || name.ends_with('-') || all_digits {
        return Err(NameRefused::Invalid(name.to_string()));
    }
    Ok(())
}

/// The label a host name becomes when a node registers: lowercased, every run of other
/// characters one `-`, trimmed of `-`, cut to 63, `node` when nothing is left or only digits
/// are. The control plane then makes it unique in the Domain (docs/dns.md).
pub fn label_from_hostname(hostname: &str) -> String {
    let first = hostname.split('.').next().unwrap_or("");
    let mut out = String::with_capacity(first.len());
    for c in first.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let mut out: String = out.trim_matches('-').chars().take(MAX_LABEL_LEN).collect();
    while out.ends_with('-') {
        out.pop();
    }
    if check_label(&out).is_err() {
        out = "node".to_string();
    }
    out
}

/// Checks a DNS suffix: one or more labels of [`check_label`]'s alphabet (digits-only labels
/// allowed here), separated by dots, no leading or trailing dot, at most [`MAX_SUFFIX_LEN`].
pub fn check_suffix(suffix: &str) -> Result<(), String> {
    if suffix.is_empty() || suffix.len() > MAX_SUFFIX_LEN {
        return Err(format!(
            "a DNS suffix has 1 to {MAX_SUFFIX_LEN} characters, {suffix:?} has {}",
            suffix.len()
        ));
    }
    for label in suffix.split('.') {
        let ok = !label.is_empty()
            && label.len() <= MAX_LABEL_LEN
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !ok {
            return Err(format!(
                "{suffix:?} is not a DNS suffix: dot-separated labels of a-z, 0-9 and '-' (for example {DEFAULT_DNS_SUFFIX})"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("net")
    }

    #[test]
    fn routes_are_checked_against_every_rule() {
        let mesh = net("10.64.0.0/16");
        assert_eq!(check_route(net("10.1.0.0/24"), mesh), Ok(()));
        assert_eq!(check_route(net("fd12:3456::/48"), mesh), Ok(()));
        assert!(matches!(
            check_route(net("10.1.0.7/24"), mesh),
            Err(RouteRefused::NotNetwork(..))
        ));
        for big in ["0.0.0.0/0", "10.0.0.0/7", "::/0", "fd00::/16"] {
            assert!(
                matches!(check_route(net(big), mesh), Err(RouteRefused::TooLarge(_))),
                "{big}"
            );
        }
        for m in ["10.0.0.0/8", "10.64.0.0/16", "10.64.3.0/24"] {
            assert!(
                matches!(check_route(net(m), mesh), Err(RouteRefused::MeshRange(..))),
                "{m}"
            );
        }
        for r in [
            "127.0.0.0/8",
            "169.254.0.0/16",
            "224.0.0.0/8",
            "fe80::/64",
            "ff02::/32",
        ] {
            assert!(
                matches!(check_route(net(r), mesh), Err(RouteRefused::Reserved(..))),
                "{r}"
            );
        }
    }

    #[test]
    fn labels_and_hostnames() {
        assert_eq!(check_label("web-1"), Ok(()));
        for bad in ["", "-web", "web-", "Web", "we b", "123", "<b>x</b>"] {
            assert!(check_label(bad).is_err(), "{bad:?}");
        }
        assert!(check_label(&"a".repeat(64)).is_err());
        assert_eq!(label_from_hostname("Web_Server.example.com"), "web-server");
        assert_eq!(label_from_hostname("--db--"), "db");
        assert_eq!(label_from_hostname("1234"), "node");
        assert_eq!(label_from_hostname(""), "node");
        assert_eq!(label_from_hostname(&"x".repeat(100)).len(), MAX_LABEL_LEN);
        assert_eq!(check_suffix("mesh.internal"), Ok(()));
        for bad in [
            "",
            ".internal",
            "mesh..internal",
            "Mesh.internal",
            "a_b.internal",
        ] {
            assert!(check_suffix(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn report_json_is_pinned() {
        let r = RoutesReport {
            advertise: vec![AdvertisedRoute {
                cidr: net("10.1.0.0/24"),
                probe: Some("10.1.0.5".parse().expect("ip")),
                healthy: true,
            }],
            exit: false,
            use_exit: None,
        };
        let json = serde_json::to_string(&r).expect("json");
        assert_eq!(
            json,
            r#"{"advertise":[{"cidr":"10.1.0.0/24","probe":"10.1.0.5","healthy":true}],"exit":false}"#
        );
        let back: RoutesReport = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, r);
        assert!(serde_json::from_str::<RoutesReport>(r#"{"advertize":[]}"#).is_err());
    }
}
