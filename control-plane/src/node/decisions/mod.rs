//! The decisions of the node API, as pure functions (no I/O; time is a parameter): a node's
//! peer spec, desired state and relay token, where a resumed event stream starts, and
//! `If-None-Match` matching, and when an ephemeral node is removed. Which endpoints a node may report and which the server
//! advertises are `candidates.rs`'s.

use std::collections::HashSet;
use std::net::SocketAddr;

use ipnet::IpNet;
use plexsphere_policy::NodeView;
use plexsphere_wire::node::{NAT_KEEPALIVE_SECS, NodeState, PeerSpec, PolicyState, RelaySpec};
use plexsphere_wire::reach::relay::{RelayToken, TOKEN_TTL_SECS};
use plexsphere_wire::routes::{DnsState, ServedRoute};
use plexsphere_wire::signed::SignedEnvelope;
use plexsphere_wire::signing_keys::SigningKey;
use uuid::Uuid;

use crate::policy::view::CompiledPolicy;
use crate::store::domains::Domain;
use crate::store::events::Head;
use crate::store::nodes::NodeRow;

/// What every node's state carries for reach: the server's relays and STUN servers, and the
/// node's own relay token (signed by its Domain).
#[derive(Debug, Clone, Copy)]
pub struct Reach<'a> {
    pub relays: &'a [RelaySpec],
    pub stun: &'a [SocketAddr],
    pub relay_token: &'a SignedEnvelope,
}

/// The token relays accept from `me` until `now` + [`TOKEN_TTL_SECS`] (minutes: heartbeats
/// renew it, and a revoked node gets no new one): it names the node's Domain, id, WireGuard key
/// and that key's generation (when the control plane recorded it: the last key rotation, else
/// the registration), so a relay refuses the node's older keys once it saw a newer one.
pub(crate) fn relay_token(me: &NodeRow, now: i64) -> RelayToken {
    RelayToken {
        domain_id: me.domain_id,
        node_id: me.id,
        public_key: me.wireguard_public_key.clone(),
        expires_at: now.saturating_add(TOKEN_TTL_SECS),
        key_generation: key_generation(me),
    }
}

/// The generation of `me`'s current key: the Unix second of its last key rotation, or of its
/// registration. A rotation comes at least `MIN_ROTATION_GAP_SECS` after the previous one, and
/// a first rotation after the registration, so a newer key never has a lower generation.
pub(crate) fn key_generation(me: &NodeRow) -> i64 {
    me.rotation
        .key_rotated_at
        .map_or(me.registered_at, |t| t.max(me.registered_at))
}

/// How a node reaches `n`. The keepalive rule is simple and honest: the server cannot tell
/// which side of a pair sits behind NAT, so every peer gets 25 s (one small packet per peer
/// every 25 s keeps a NAT mapping open; it costs nothing worth saving).
pub(crate) fn peer_spec(n: &NodeRow) -> PeerSpec {
    PeerSpec {
        node_id: n.id,
        hostname: n.hostname.clone(),
        public_key: n.wireguard_public_key.clone(),
        mesh_ip: n.mesh_ip,
        allowed_ips: vec![IpNet::from(n.mesh_ip)],
        endpoints: n.endpoints.clone(),
        persistent_keepalive_secs: Some(NAT_KEEPALIVE_SECS),
        home_relay: n.reach.home_relay.clone(),
        dns_name: Some(n.dns_name.clone()),
    }
}

/// What a node's state carries of names and routes (issue 27): its Domain's DNS suffix and
/// the routes it serves as a router, with its role in each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Extras {
    pub dns_suffix: String,
    pub served: Vec<ServedRoute>,
}

impl Default for Extras {
    fn default() -> Self {
        Self {
            dns_suffix: plexsphere_wire::routes::DEFAULT_DNS_SUFFIX.to_owned(),
            served: Vec::new(),
        }
    }
}

/// `n`'s spec as `me` sees it: its host routes, then the route prefixes `view` lets `me`
/// open through it (it is their primary router, or `me`'s exit), deduplicated.
fn peer_spec_in(n: &NodeRow, view: &NodeView) -> PeerSpec {
    let mut spec = peer_spec(n);
    if let Some(p) = view.peers.iter().find(|p| p.id == n.id) {
        for g in &p.routes_out {
            if !spec.allowed_ips.contains(&g.prefix) {
                spec.allowed_ips.push(g.prefix);
            }
        }
    }
    spec
}

/// `me`'s desired state: the other live nodes of its Domain that `policy` connects to it
/// (in either direction) as peers, the policy's version and `me`'s view, and `reach`;
/// `next_signing_key` is the key a rotation announced (while its overlap lasts). A node the
/// compile does not know gets no peer and an empty view (fail closed).
#[allow(clippy::too_many_arguments)]
pub(crate) fn node_state(
    me: &NodeRow,
    domain: &Domain,
    live: &[NodeRow],
    version: u64,
    now: i64,
    reach: Reach<'_>,
    next_signing_key: Option<SigningKey>,
    policy: &CompiledPolicy,
    extras: &Extras,
) -> NodeState {
    let view = policy.view(me);
    let connected: HashSet<Uuid> = view.peer_ids().collect();
    NodeState {
        version,
        node_id: me.id,
        domain_id: domain.id,
        mesh_ip: me.mesh_ip,
        mesh_cidr: domain.mesh_cidr,
        listen_port: me.listen_port.unwrap_or(plexsphere_wire::WIREGUARD_PORT),
        peers: live
            .iter()
            .filter(|n| n.id != me.id && n.revoked_at.is_none() && connected.contains(&n.id))
            .map(|n| peer_spec_in(n, &view))
            .collect(),
        issued_at: now,
        relays: reach.relays.to_vec(),
        relay_token: Some(reach.relay_token.clone()),
        stun: reach.stun.to_vec(),
        udp_offload: me.udp_offload,
        next_signing_key,
        policy: Some(PolicyState {
            version: policy.version,
            view,
        }),
        dns: Some(DnsState {
            suffix: extras.dns_suffix.clone(),
            name: me.dns_name.clone(),
        }),
        served_routes: extras.served.clone(),
    }
}

/// Where an event stream starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resume {
    /// Send every event for the node after this seq.
    After(u64),
    /// Send one `resync` (seq = the head) first, then every event after the head.
    Resync { head: u64, reason: &'static str },
}

/// Decides where a stream starts from its `Last-Event-ID` header and the Domain's log.
pub(crate) fn resume_point(last_event_id: Option<&str>, head: Head) -> Resume {
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
pub(crate) fn etag(version: u64) -> String {
    format!("\"{version}\"")
}

/// Whether an `If-None-Match` header names `version` (a list, weak tags and `*` count).
pub(crate) fn not_modified(if_none_match: Option<&str>, version: u64) -> bool {
    let Some(header) = if_none_match else {
        return false;
    };
    let want = etag(version);
    header
        .split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || tag.strip_prefix("W/").unwrap_or(tag) == want)
}

/// Whether `node` is ephemeral, live, and has been offline longer than its allowance at `now`:
/// its last authenticated call (its registration when it never made one) is more than
/// `ephemeral_offline_secs` old. The SQL of `nodes::ephemeral_expired` is the same rule.
pub(crate) fn ephemeral_expired(node: &NodeRow, now: i64) -> bool {
    let Some(allowance) = node.origin.ephemeral_offline_secs else {
        return false;
    };
    let since = node.last_seen_at.unwrap_or(node.registered_at);
    let allowance = i64::try_from(allowance).unwrap_or(i64::MAX);
    node.revoked_at.is_none() && since.saturating_add(allowance) < now
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: u128, ip: &str) -> NodeRow {
        NodeRow::for_test(n, ip)
    }

    /// The default (allow-all) document compiled over `live`.
    fn allow_all(live: &[NodeRow]) -> CompiledPolicy {
        let inv = crate::policy::view::inventory(live, &[]);
        CompiledPolicy::new(0, &plexsphere_policy::default_document(), &inv, 0)
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
        let mut two = node(2, "10.64.0.2");
        two.reach.home_relay = Some("r1".into());
        let all = vec![me.clone(), two, revoked, v6];
        let relays = [RelaySpec {
            name: "r1".into(),
            public_key: "k".into(),
            udp: Some("203.0.113.5:3479".parse().unwrap()),
            tls: None,
            tls_server_name: None,
        }];
        let stun = ["203.0.113.5:3478".parse().unwrap()];
        let token = SignedEnvelope {
            payload: "cA==".into(),
            signature: "c2ln".into(),
        };
        let reach = Reach {
            relays: &relays,
            stun: &stun,
            relay_token: &token,
        };
        let policy = allow_all(&all);
        let s = node_state(
            &me,
            &domain,
            &all,
            7,
            99,
            reach,
            None,
            &policy,
            &Extras::default(),
        );
        assert_eq!(s.relays, relays);
        assert_eq!(s.stun, stun);
        assert_eq!(s.relay_token.as_ref(), Some(&token));
        assert_eq!(s.peers[0].home_relay.as_deref(), Some("r1"));
        assert_eq!(s.peers[1].home_relay, None);
        assert_eq!(s.version, 7);
        assert_eq!(s.listen_port, 51820);
        let ids: Vec<u128> = s.peers.iter().map(|p| p.node_id.as_u128()).collect();
        assert_eq!(ids, vec![2, 4]);
        assert_eq!(s.peers[0].allowed_ips[0].to_string(), "10.64.0.2/32");
        assert_eq!(s.peers[1].allowed_ips[0].to_string(), "fd00::4/128");
        assert_eq!(s.peers[0].persistent_keepalive_secs, Some(25));
        assert_eq!(s.peers[0].endpoints, me.endpoints);
        assert_eq!(s.udp_offload, None, "no switch set: the node's default");
        let off = NodeRow {
            udp_offload: Some(plexsphere_wire::node::UdpOffload::Off),
            ..me.clone()
        };
        let s = node_state(
            &off,
            &domain,
            &all,
            8,
            99,
            reach,
            None,
            &policy,
            &Extras::default(),
        );
        assert_eq!(s.udp_offload, Some(plexsphere_wire::node::UdpOffload::Off));
        assert_eq!(s.next_signing_key, None);
        let next = SigningKey {
            generation: 2,
            public_key: "pk".into(),
            active_from: 500,
        };
        let s = node_state(
            &off,
            &domain,
            &all,
            8,
            99,
            reach,
            Some(next.clone()),
            &policy,
            &Extras::default(),
        );
        assert_eq!(s.next_signing_key, Some(next));
    }

    #[test]
    fn a_relay_token_names_the_node_its_key_and_the_key_generation_for_minutes() {
        let mut me = node(7, "10.64.0.7");
        let t = relay_token(&me, 1_000);
        assert_eq!((t.domain_id, t.node_id), (me.domain_id, me.id));
        assert_eq!(t.public_key, "key-7");
        assert_eq!(t.expires_at, 1_000 + 600);
        assert_eq!(t.key_generation, me.registered_at);
        me.rotation.key_rotated_at = Some(me.registered_at + 40);
        let rotated = relay_token(&me, 1_100);
        assert_eq!(rotated.key_generation, me.registered_at + 40);
        assert!(rotated.key_generation > t.key_generation);
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

    #[test]
    fn an_ephemeral_node_expires_only_once_offline_past_its_allowance() {
        let mut n = NodeRow {
            registered_at: 1_000,
            ..node(1, "10.64.0.1")
        };
        // Not ephemeral: never.
        assert!(!ephemeral_expired(&n, i64::MAX));
        n.origin.ephemeral_offline_secs = Some(600);
        // Never seen: counted from its registration.
        assert!(!ephemeral_expired(&n, 1_600));
        assert!(ephemeral_expired(&n, 1_601));
        // Seen later: counted from then.
        n.last_seen_at = Some(2_000);
        assert!(!ephemeral_expired(&n, 2_600));
        assert!(ephemeral_expired(&n, 2_601));
        // A revoked node is not removed by the sweep (its peers dropped it already).
        n.revoked_at = Some(2_100);
        assert!(!ephemeral_expired(&n, 9_999));
    }
}

#[cfg(test)]
mod policy_tests;
