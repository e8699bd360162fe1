//! What the host should look like for routes (pure): the kernel routes on the mesh interface,
//! the exit's policy routing, forwarding and masquerade. [`super::host`] makes it so.
//!
//! - Every prefix of a peer's allowed IPs outside the mesh range is a route this node reaches
//!   through that peer: a route on the mesh interface in the main table.
//! - The peer `routes.use_exit` names (by DNS name or node id) is the exit when its allowed IPs
//!   hold a prefix shorter than a subnet route may be (the control plane gives the exit
//!   `0.0.0.0/0` and `::/0` minus the mesh range only once the exit is approved and the policy
//!   allows it). Then all its prefixes go to plexd's own table [`EXIT_TABLE`], which the
//!   policy rules consult for everything the main table has no more specific route for.
//! - A short prefix on any other peer is never routed (a control plane that hands one out by
//!   mistake cannot pull the node's traffic): it is counted in `ignored`.
//! - A prefix this node advertises itself is never routed through the mesh, even when another
//!   router of it is primary: a standby reaches its LAN on its own link, so its probe tests
//!   that link (through the mesh a router whose LAN is cut would probe the LAN through the
//!   primary, call itself healthy, and carry clients' traffic into a loop).

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use plexsphere_wire::node::PeerSpec;
use plexsphere_wire::routes::{MIN_PREFIX_V4, MIN_PREFIX_V6, ServedRoute};

use super::netlink::{KernelRoute, TABLE_MAIN};
use crate::config::routes::RoutesConfig;

/// plexd's routing table for the exit (`ip route show table 28780`).
pub(crate) const EXIT_TABLE: u32 = 0x706c;
/// The mark of plexd's own WireGuard packets, which the exit's rule lets past its table.
pub(crate) const EXIT_FWMARK: u32 = 0x706c;

/// The host's wanted route state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostPlan {
    /// Kernel routes on the mesh interface (main table and [`EXIT_TABLE`]).
    pub routes: BTreeSet<KernelRoute>,
    /// The exit in use, by node id, when its prefixes arrived.
    pub exit_peer: Option<uuid::Uuid>,
    /// Serving routes (or an exit): forwarding on.
    pub forward: bool,
    /// Masquerade what is forwarded out of another interface.
    pub snat: bool,
    /// Prefixes of peers that are not this node's exit and too short for a subnet route.
    pub ignored: Vec<IpNet>,
}

fn is_short(p: &IpNet) -> bool {
    match p {
        IpNet::V4(_) => p.prefix_len() < MIN_PREFIX_V4,
        IpNet::V6(_) => p.prefix_len() < MIN_PREFIX_V6,
    }
}

fn names(peer: &PeerSpec, wanted: &str) -> bool {
    peer.dns_name.as_deref() == Some(wanted)
        || uuid::Uuid::parse_str(wanted).is_ok_and(|id| id == peer.node_id)
}

/// The plan for these peers (the set applied to the interface), with this node's `routes:`
/// and the routes it serves now.
pub fn plan(
    peers: &[PeerSpec],
    mesh: IpNet,
    config: &RoutesConfig,
    served: &[ServedRoute],
) -> HostPlan {
    // An exit does not send its traffic through another exit (no chains, no loops).
    let use_exit = config.use_exit.as_deref().filter(|_| !config.exit);
    let own = |n: &IpNet| config.advertise.iter().any(|a| a.cidr == *n);
    let mut out = HostPlan {
        forward: !served.is_empty() || config.exit,
        snat: config.snat,
        ..HostPlan::default()
    };
    for p in peers {
        let outside: Vec<IpNet> = p
            .allowed_ips
            .iter()
            .filter(|n| !mesh.contains(*n) && !n.contains(&mesh.network()) && !own(n))
            .copied()
            .collect();
        let exit = use_exit.is_some_and(|w| names(p, w)) && outside.iter().any(is_short);
        if exit {
            out.exit_peer = Some(p.node_id);
        }
        for prefix in outside {
            if exit {
                out.routes.insert(KernelRoute {
                    table: EXIT_TABLE,
                    prefix,
                });
            } else if is_short(&prefix) {
                out.ignored.push(prefix);
            } else {
                out.routes.insert(KernelRoute {
                    table: TABLE_MAIN,
                    prefix,
                });
            }
        }
    }
    out
}

/// The addresses plexd's own connections go to, kept off the exit's tunnel: the control
/// plane's and the relays'.
pub(crate) fn exempt(api: &[IpAddr], relays: &[IpAddr]) -> BTreeSet<IpAddr> {
    api.iter().chain(relays).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("net")
    }

    /// A `routes:` section: the exit used, whether this node is an exit, its own routes.
    fn config(use_exit: Option<&str>, exit: bool, own: &[&str]) -> RoutesConfig {
        RoutesConfig {
            advertise: own
                .iter()
                .map(|c| crate::config::routes::AdvertiseEntry {
                    cidr: net(c),
                    probe: None,
                })
                .collect(),
            exit,
            use_exit: use_exit.map(str::to_owned),
            ..RoutesConfig::default()
        }
    }

    fn peer(n: u8, name: &str, allowed: &[&str]) -> PeerSpec {
        PeerSpec {
            node_id: uuid::Uuid::from_u128(u128::from(n)),
            hostname: name.into(),
            public_key: String::new(),
            mesh_ip: format!("10.64.0.{n}").parse().expect("ip"),
            allowed_ips: allowed.iter().map(|s| net(s)).collect(),
            endpoints: vec![],
            persistent_keepalive_secs: None,
            home_relay: None,
            dns_name: Some(name.into()),
        }
    }

    #[test]
    fn subnet_routes_go_to_main_and_the_exit_to_its_table() {
        let mesh = net("10.64.0.0/16");
        let peers = [
            peer(2, "r", &["10.64.0.2/32", "10.1.0.0/24"]),
            peer(
                3,
                "e",
                &["10.64.0.3/32", "0.0.0.0/5", "11.0.0.0/8", "10.2.0.0/24"],
            ),
            peer(4, "x", &["10.64.0.4/32", "128.0.0.0/1"]),
        ];
        let p = plan(&peers, mesh, &config(Some("e"), false, &[]), &[]);
        let main: Vec<_> = p
            .routes
            .iter()
            .filter(|r| r.table == TABLE_MAIN)
            .map(|r| r.prefix)
            .collect();
        assert_eq!(main, vec![net("10.1.0.0/24")]);
        let exit: Vec<_> = p
            .routes
            .iter()
            .filter(|r| r.table == EXIT_TABLE)
            .map(|r| r.prefix.to_string())
            .collect();
        assert_eq!(exit, ["0.0.0.0/5", "10.2.0.0/24", "11.0.0.0/8"]);
        assert_eq!(p.exit_peer, Some(uuid::Uuid::from_u128(3)));
        assert_eq!(
            p.ignored,
            vec![net("128.0.0.0/1")],
            "not the exit: never routed"
        );
        assert!(!p.forward);
        // Without use_exit the exit's short prefixes are ignored, its subnet routes kept.
        let p = plan(&peers, mesh, &config(None, false, &[]), &[]);
        assert_eq!(p.exit_peer, None);
        assert!(p.routes.iter().all(|r| r.table == TABLE_MAIN));
        assert_eq!(p.routes.len(), 3);
    }

    #[test]
    fn serving_or_offering_an_exit_forwards() {
        let mesh = net("10.64.0.0/16");
        let served = [ServedRoute {
            cidr: net("10.1.0.0/24"),
            role: plexsphere_wire::routes::RouterRole::Primary,
        }];
        assert!(plan(&[], mesh, &config(None, false, &[]), &served).forward);
        assert!(plan(&[], mesh, &config(None, true, &[]), &[]).forward);
        assert!(!plan(&[], mesh, &config(None, false, &[]), &[]).forward);
    }

    /// A standby router gets the primary's prefix, which it advertises itself: it keeps
    /// reaching it on its own link (else, its LAN cut, its probe would pass through the
    /// primary and call it healthy). Another router's prefix is still routed.
    #[test]
    fn a_prefix_this_node_advertises_is_never_routed_through_the_mesh() {
        let mesh = net("10.64.0.0/16");
        let peers = [peer(
            2,
            "primary",
            &["10.64.0.2/32", "10.200.2.0/24", "10.9.0.0/24"],
        )];
        let p = plan(&peers, mesh, &config(None, false, &["10.200.2.0/24"]), &[]);
        let routed: Vec<String> = p.routes.iter().map(|r| r.prefix.to_string()).collect();
        assert_eq!(routed, ["10.9.0.0/24"]);
        let p = plan(&peers, mesh, &config(None, false, &[]), &[]);
        assert_eq!(p.routes.len(), 2, "a client routes both");
    }
}
