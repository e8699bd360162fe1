//! The node's own addresses for the endpoint report: every interface address except
//! loopback, link-local, multicast/unspecified and the mesh range (the mesh IP itself).

use std::net::IpAddr;

use ipnet::IpNet;
use plexsphere_wire::node::{EndpointReport, MAX_CANDIDATES};

use crate::reach::io::OwnCandidates;

/// Fills the endpoint report with the local addresses and the reach runtime's own
/// candidates. The server takes at most [`MAX_CANDIDATES`] addresses in all: the reflexive
/// ones go first (behind a NAT they are what peers can reach), local ones fill the rest;
/// reflexive addresses no peer can reach (port 0, unspecified, loopback, multicast) are left out.
pub fn fill_report(report: &mut EndpointReport, addresses: Vec<IpAddr>, own: OwnCandidates) {
    let mut reflexive = Vec::new();
    for a in own.reflexive {
        let ip = a.ip();
        let useless = a.port() == 0 || ip.is_unspecified() || ip.is_loopback() || ip.is_multicast();
        if !useless && !reflexive.contains(&a) && reflexive.len() < MAX_CANDIDATES {
            reflexive.push(a);
        }
    }
    let room = MAX_CANDIDATES - reflexive.len();
    if addresses.len() > room {
        tracing::debug!(
            dropped = addresses.len() - room,
            "more local addresses than the endpoint report carries; reporting the first {room}"
        );
    }
    report.addresses = addresses.into_iter().take(room).collect();
    report.reflexive = reflexive;
    report.home_relay = own.home_relay;
    report.nat = own.nat;
}

/// Keeps the addresses a peer could reach this node on, sorted and without duplicates.
pub fn reportable(
    addrs: impl IntoIterator<Item = IpAddr>,
    mesh_ip: IpAddr,
    mesh_cidr: &IpNet,
) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = addrs
        .into_iter()
        .filter(|a| {
            !(a.is_loopback()
                || a.is_unspecified()
                || a.is_multicast()
                || is_link_local(a)
                || *a == mesh_ip
                || mesh_cidr.contains(a))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn is_link_local(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// The host's interface addresses (getifaddrs), unfiltered.
pub fn host_addresses() -> Result<Vec<IpAddr>, String> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| format!("getifaddrs failed: {e}"))?;
    Ok(addrs
        .filter_map(|ifa| {
            let sa = ifa.address?;
            if let Some(v4) = sa.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                sa.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_carries_own_candidates_within_the_bound() {
        let mut report = EndpointReport {
            listen_port: 51820,
            addresses: vec![],
            reflexive: vec![],
            home_relay: None,
            nat: Default::default(),
        };
        let addresses: Vec<IpAddr> = (1..=20u8).map(|i| IpAddr::from([192, 0, 2, i])).collect();
        let nat = plexsphere_wire::node::NatReport {
            mapping: plexsphere_wire::node::NatMapping::EndpointDependent,
            udp_blocked: false,
        };
        let own = OwnCandidates {
            reflexive: vec![
                "198.51.100.7:40001".parse().unwrap(),
                "198.51.100.7:40001".parse().unwrap(),
                "198.51.100.7:0".parse().unwrap(),
                "127.0.0.1:51820".parse().unwrap(),
                "[2001:db8::7]:51820".parse().unwrap(),
            ],
            home_relay: Some("r1".into()),
            nat: nat.clone(),
        };
        fill_report(&mut report, addresses, own);
        assert_eq!(
            report.reflexive,
            vec![
                "198.51.100.7:40001".parse().unwrap(),
                "[2001:db8::7]:51820".parse().unwrap()
            ]
        );
        assert_eq!(report.addresses.len(), MAX_CANDIDATES - 2);
        assert_eq!(report.addresses[0], IpAddr::from([192, 0, 2, 1]));
        assert_eq!(report.home_relay.as_deref(), Some("r1"));
        assert_eq!(report.nat, nat);
    }

    #[test]
    fn filters_what_no_peer_can_reach() {
        let ips: Vec<IpAddr> = [
            "127.0.0.1",
            "::1",
            "169.254.3.4",
            "fe80::1",
            "10.64.1.2",
            "10.64.9.9",
            "0.0.0.0",
            "224.0.0.1",
            "192.0.2.10",
            "2001:db8::5",
            "192.0.2.10",
            "10.0.0.5",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let out = reportable(
            ips,
            "10.64.1.2".parse().unwrap(),
            &"10.64.0.0/16".parse().unwrap(),
        );
        let text: Vec<String> = out.iter().map(ToString::to_string).collect();
        assert_eq!(text, vec!["10.0.0.5", "192.0.2.10", "2001:db8::5"]);
    }

    #[test]
    fn reads_the_hosts_addresses() {
        // Every Linux host (and network namespace) has at least loopback.
        let all = host_addresses().unwrap();
        assert!(all.iter().any(IpAddr::is_loopback), "{all:?}");
    }
}
