//! What the core tells the routes task: the `routes:` section on a reload, the signed state's
//! served routes and relays, and every peer set it applies.

use std::path::PathBuf;

use plexsphere_wire::routes::{RouterRole, ServedRoute};

use super::*;
use crate::routes::RoutesOp;

fn routes_ops(effects: &[Effect]) -> Vec<&RoutesOp> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Routes(op) => Some(op),
            _ => None,
        })
        .collect()
}

#[test]
fn a_reload_hands_over_a_changed_routes_section_and_only_then() {
    let mut h = harness();
    let mut config = Config::default();
    config.routes.advertise = vec![crate::config::routes::AdvertiseEntry {
        cidr: "10.1.0.0/24".parse().unwrap(),
        probe: None,
    }];
    let reload = |c: &Config| Input::Reload {
        path: PathBuf::from("/etc/plexd/config.yaml"),
        config: Ok(Box::new(c.clone())),
        log_level_pinned: false,
    };
    let e = h.step(reload(&config));
    assert_eq!(
        routes_ops(&e),
        vec![&RoutesOp::Config(config.routes.clone())]
    );
    assert_eq!(h.core.config().routes, config.routes, "applies now");
    let e = h.step(reload(&config));
    assert!(routes_ops(&e).is_empty(), "unchanged: nothing");
}

#[test]
fn the_state_brings_served_routes_relays_and_the_applied_peers() {
    let mut h = harness();
    h.step(Input::Tick);
    let mut s = one_state(3, 2);
    s.served_routes = vec![ServedRoute {
        cidr: "10.1.0.0/24".parse().unwrap(),
        role: RouterRole::Primary,
    }];
    s.relays = vec![plexsphere_wire::node::RelaySpec {
        name: "r1".into(),
        public_key: String::new(),
        udp: Some("198.51.100.7:3478".parse().unwrap()),
        tls: Some("198.51.100.8:443".parse().unwrap()),
        tls_server_name: None,
    }];
    let e = h.state_answer(&s);
    let ops = routes_ops(&e);
    assert!(
        ops.contains(&&RoutesOp::State {
            served: s.served_routes.clone(),
            relays: vec![
                "198.51.100.7".parse().unwrap(),
                "198.51.100.8".parse().unwrap()
            ],
        }),
        "{ops:?}"
    );
    let peers = ops
        .iter()
        .find_map(|op| match op {
            RoutesOp::Peers(p) => Some(p.len()),
            _ => None,
        })
        .expect("the applied peers");
    assert_eq!(peers, 2);
}
