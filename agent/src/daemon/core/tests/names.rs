//! The names the core hands to the resolver (docs/dns.md): from the state, after events,
//! only when they change, and nothing with `dns.enabled: false` or a state without names.

use std::sync::Arc;

use plexsphere_wire::node::EventKind;
use plexsphere_wire::routes::DnsState;

use super::*;
use crate::daemon::core::accept_fixtures::peer_id;
use crate::dns::zone::Zone;

fn zones(effects: &[Effect]) -> Vec<Option<Arc<Zone>>> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Dns(z) => Some(z.clone()),
            _ => None,
        })
        .collect()
}

fn named_state(version: u64) -> NodeState {
    let mut s = one_state(version, 2);
    s.dns = Some(DnsState {
        suffix: "mesh.internal".into(),
        name: "self".into(),
    });
    s.peers[0].dns_name = Some("web".into());
    s.peers[1].dns_name = Some("db".into());
    s
}

fn ip(s: &str) -> std::net::IpAddr {
    s.parse().expect("ip")
}

#[test]
fn names_follow_the_state_renames_and_departures() {
    let mut h = harness();
    let s = named_state(4);
    let z = zones(&h.up(&s));
    assert_eq!(z.len(), 1, "one table for the first state");
    let zone = z[0].clone().expect("a table");
    assert_eq!(zone.lookup(b"self"), Some(&[ip("10.64.1.2")][..]));
    assert_eq!(zone.lookup(b"web"), Some(&[s.peers[0].mesh_ip][..]));
    assert_eq!(zone.lookup(b"db"), Some(&[s.peers[1].mesh_ip][..]));

    // A rename arrives as the peer's update.
    let mut renamed = s.peers[0].clone();
    renamed.dns_name = Some("www".into());
    let z = zones(&h.frame(1, 5, EventKind::PeerUpdated { peer: renamed }));
    let zone = z.last().cloned().flatten().expect("a new table");
    assert_eq!(zone.lookup(b"web"), None);
    assert_eq!(zone.lookup(b"www"), Some(&[s.peers[0].mesh_ip][..]));

    // An endpoint move changes no name: no new table.
    let moved = EventKind::EndpointChanged {
        peer_node_id: s.peers[1].node_id,
        endpoints: vec!["198.51.100.1:51820".parse().expect("addr")],
        home_relay: None,
    };
    assert!(zones(&h.frame(1, 6, moved)).is_empty());

    // A departure (a revoked or removed peer) takes its name away.
    let gone = EventKind::PeerRemoved {
        peer_node_id: peer_id(4),
        public_key: s.peers[1].public_key.clone(),
    };
    let z = zones(&h.frame(1, 7, gone));
    let zone = z.last().cloned().flatten().expect("a new table");
    assert_eq!(zone.lookup(b"db"), None);
    assert_eq!(zone.len(), 2);
}

#[test]
fn no_names_without_them_in_the_state_or_with_dns_off() {
    let mut h = harness();
    assert!(
        zones(&h.up(&one_state(4, 2))).is_empty(),
        "a server older than names"
    );
    let mut config = Config::default();
    config.dns.enabled = false;
    let mut h = harness_with(config, None);
    assert!(
        zones(&h.up(&named_state(4))).is_empty(),
        "dns.enabled: false"
    );
}
