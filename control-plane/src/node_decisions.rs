//! The decisions of the node API, as pure functions (no I/O; time is a parameter): a node's
//! peer spec and desired state, the endpoints the server advertises, where a resumed event
//! stream starts, and `If-None-Match` matching.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use plexsphere_wire::node::{EndpointReport, NAT_KEEPALIVE_SECS, NodeState, PeerSpec};

use crate::store::domains::Domain;
use crate::store::events::Head;
use crate::store::nodes::NodeRow;

/// At most this many addresses in one endpoint report.
pub const MAX_REPORTED_ADDRESSES: usize = 32;

/// How a node reaches `n`. The keepalive rule is simple and honest: the server cannot tell
/// which side of a pair sits behind NAT, so every peer gets 25 s (one small packet per peer
/// every 25 s keeps a NAT mapping open; it costs nothing worth saving).
pub fn peer_spec(n: &NodeRow) -> PeerSpec {
    PeerSpec {
        node_id: n.id,
        hostname: n.hostname.clone(),
        public_key: n.wireguard_public_key.clone(),
        mesh_ip: n.mesh_ip,
        allowed_ips: vec![IpNet::from(n.mesh_ip)],
        endpoints: n.endpoints.clone(),
        persistent_keepalive_secs: Some(NAT_KEEPALIVE_SECS),
        home_relay: None,
    }
}

/// `me`'s desired state: every other live node of its Domain as a peer.
pub fn node_state(
    me: &NodeRow,
    domain: &Domain,
    live: &[NodeRow],
    version: u64,
    now: i64,
) -> NodeState {
    NodeState {
        version,
        node_id: me.id,
        domain_id: domain.id,
        mesh_ip: me.mesh_ip,
        mesh_cidr: domain.mesh_cidr,
        listen_port: me.listen_port.unwrap_or(plexsphere_wire::WIREGUARD_PORT),
        peers: live
            .iter()
            .filter(|n| n.id != me.id && n.revoked_at.is_none())
            .map(peer_spec)
            .collect(),
        issued_at: now,
        relays: vec![],
        relay_token: None,
        stun: vec![],
    }
}

/// The endpoints to advertise for a report seen coming from `observed`: the reported
/// addresses in the node's order, then the reflexive candidate, without duplicates.
/// Answers the reflexive candidate and the list, or why the report is refused.
pub fn advertise(
    report: &EndpointReport,
    observed: IpAddr,
) -> Result<(SocketAddr, Vec<SocketAddr>), String> {
    if report.listen_port == 0 {
        return Err("listen_port must be the WireGuard listen port (1-65535)".into());
    }
    if report.addresses.len() > MAX_REPORTED_ADDRESSES {
        return Err(format!(
            "an endpoint report carries at most {MAX_REPORTED_ADDRESSES} addresses, not {}",
            report.addresses.len()
        ));
    }
    if let Some(bad) = report
        .addresses
        .iter()
        .find(|a| a.is_unspecified() || a.is_multicast())
    {
        return Err(format!(
            "{bad} cannot be an endpoint (unspecified or multicast); report interface addresses"
        ));
    }
    let reflexive = SocketAddr::new(observed, report.listen_port);
    let mut out: Vec<SocketAddr> = Vec::with_capacity(report.addresses.len() + 1);
    let candidates = report
        .addresses
        .iter()
        .map(|ip| SocketAddr::new(*ip, report.listen_port))
        .chain(std::iter::once(reflexive));
    for c in candidates {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    Ok((reflexive, out))
}

/// Where an event stream starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// Send every event for the node after this seq.
    After(u64),
    /// Send one `resync` (seq = the head) first, then every event after the head.
    Resync { head: u64, reason: &'static str },
}

/// Decides where a stream starts from its `Last-Event-ID` header and the Domain's log.
pub fn resume_point(last_event_id: Option<&str>, head: Head) -> Resume {
    let Some(raw) = last_event_id else {
        return Resume::After(head.seq);
    };
    match raw.trim().parse::<u64>() {
        Err(_) => Resume::Resync {
            head: head.seq,
            reason: "Last-Event-ID is not an event seq",
        },
        Ok(n) if n > head.seq => Resume::Resync {
            head: head.seq,
            reason: "Last-Event-ID is ahead of the server's log",
        },
        Ok(n) if n < head.pruned_through => Resume::Resync {
            head: head.seq,
            reason: "Last-Event-ID is older than the replay window",
        },
        Ok(n) => Resume::After(n),
    }
}

/// The `ETag` of a state version.
pub fn etag(version: u64) -> String {
    format!("\"{version}\"")
}

/// Whether an `If-None-Match` header names `version` (a list, weak tags and `*` count).
pub fn not_modified(if_none_match: Option<&str>, version: u64) -> bool {
    let Some(header) = if_none_match else {
        return false;
    };
    let want = etag(version);
    header
        .split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || tag.strip_prefix("W/").unwrap_or(tag) == want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn node(n: u128, ip: &str) -> NodeRow {
        NodeRow::for_test(n, ip)
    }

    #[test]
    fn state_lists_every_other_live_node_as_a_host_route_peer() {
        let domain = Domain {
            id: Uuid::from_u128(100),
            slug: "lab".into(),
            mesh_cidr: "10.64.0.0/16".parse().unwrap(),
            created_at: 0,
        };
        let me = node(1, "10.64.0.1");
        let mut revoked = node(3, "10.64.0.3");
        revoked.revoked_at = Some(5);
        let v6 = node(4, "fd00::4");
        let all = vec![me.clone(), node(2, "10.64.0.2"), revoked, v6];
        let s = node_state(&me, &domain, &all, 7, 99);
        assert_eq!(s.version, 7);
        assert_eq!(s.listen_port, 51820);
        let ids: Vec<u128> = s.peers.iter().map(|p| p.node_id.as_u128()).collect();
        assert_eq!(ids, vec![2, 4]);
        assert_eq!(s.peers[0].allowed_ips[0].to_string(), "10.64.0.2/32");
        assert_eq!(s.peers[1].allowed_ips[0].to_string(), "fd00::4/128");
        assert_eq!(s.peers[0].persistent_keepalive_secs, Some(25));
        assert_eq!(s.peers[0].endpoints, me.endpoints);
    }

    #[test]
    fn advertised_endpoints_are_reported_first_then_reflexive_without_duplicates() {
        let report = EndpointReport {
            listen_port: 51999,
            addresses: vec!["192.0.2.7".parse().unwrap(), "203.0.113.5".parse().unwrap()],
            ..Default::default()
        };
        let (obs, list) = advertise(&report, "203.0.113.5".parse().unwrap()).unwrap();
        assert_eq!(obs.to_string(), "203.0.113.5:51999");
        let shown: Vec<String> = list.iter().map(ToString::to_string).collect();
        assert_eq!(shown, vec!["192.0.2.7:51999", "203.0.113.5:51999"]);
        let (_, list) = advertise(&report, "198.51.100.1".parse().unwrap()).unwrap();
        assert_eq!(list.len(), 3);
        assert_eq!(list[2].to_string(), "198.51.100.1:51999");

        let zero = EndpointReport {
            listen_port: 0,
            addresses: vec![],
            ..Default::default()
        };
        assert!(advertise(&zero, "1.2.3.4".parse().unwrap()).is_err());
        let bad = EndpointReport {
            listen_port: 1,
            addresses: vec!["0.0.0.0".parse().unwrap()],
            ..Default::default()
        };
        assert!(advertise(&bad, "1.2.3.4".parse().unwrap()).is_err());
        let many = EndpointReport {
            listen_port: 1,
            addresses: vec!["192.0.2.1".parse().unwrap(); MAX_REPORTED_ADDRESSES + 1],
            ..Default::default()
        };
        assert!(advertise(&many, "1.2.3.4".parse().unwrap()).is_err());
    }

    #[test]
    fn resume_points() {
        let head = Head {
            seq: 10,
            pruned_through: 4,
        };
        assert_eq!(resume_point(None, head), Resume::After(10));
        assert_eq!(resume_point(Some("7"), head), Resume::After(7));
        assert_eq!(resume_point(Some(" 4 "), head), Resume::After(4));
        assert_eq!(resume_point(Some("10"), head), Resume::After(10));
        for bad in ["3", "11", "x", ""] {
            assert!(
                matches!(
                    resume_point(Some(bad), head),
                    Resume::Resync { head: 10, .. }
                ),
                "{bad}"
            );
        }
        // A fresh Domain: 0 is the only valid position.
        assert_eq!(resume_point(Some("0"), Head::default()), Resume::After(0));
    }

    #[test]
    fn if_none_match() {
        assert!(not_modified(Some("\"5\""), 5));
        assert!(not_modified(Some("W/\"5\""), 5));
        assert!(not_modified(Some("\"4\", \"5\""), 5));
        assert!(not_modified(Some("*"), 5));
        assert!(!not_modified(Some("\"4\""), 5));
        assert!(!not_modified(Some("5"), 5));
        assert!(!not_modified(None, 5));
        assert_eq!(etag(12), "\"12\"");
    }
}
