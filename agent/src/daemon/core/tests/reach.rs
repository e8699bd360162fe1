//! What the core tells the reach runtime, and the paths `plexd status` shows.

use plexsphere_wire::node::{EventKind, RelaySpec};
use plexsphere_wire::signed::SignedEnvelope;

use super::*;
use crate::daemon::core::accept_fixtures::peer_id;
use crate::daemon::core::protocol::{Answer, Request};
use crate::daemon::core::status::{PathTransport, PeerPath};
use crate::reach::io::{Path, PeerPathView, Transport};

fn reach_ops(effects: &[Effect]) -> Vec<&ReachOp> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Reach(op) => Some(op),
            _ => None,
        })
        .collect()
}

fn token(n: u8) -> SignedEnvelope {
    SignedEnvelope {
        payload: format!("token-{n}"),
        signature: "sig".into(),
    }
}

fn relayed_state(version: u64) -> NodeState {
    let mut s = one_state(version, 2);
    s.relays = vec![RelaySpec {
        name: "r1".into(),
        public_key: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=".into(),
        udp: Some("203.0.113.9:3478".parse().unwrap()),
        tls: None,
        tls_server_name: None,
    }];
    s.stun = vec!["203.0.113.1:3478".parse().unwrap()];
    s.relay_token = Some(token(1));
    s.peers[0].home_relay = Some("r1".into());
    s
}

#[test]
fn a_state_tells_the_runtime_its_relays_token_and_peers_once() {
    let mut h = harness();
    let s = relayed_state(4);
    let e = h.up(&s);
    let ops = reach_ops(&e);
    assert_eq!(ops.len(), 3, "{ops:?}");
    assert_eq!(
        ops[0],
        &ReachOp::Relays {
            relays: s.relays.clone(),
            stun: s.stun.clone()
        }
    );
    assert_eq!(ops[1], &ReachOp::RelayToken(token(1)));
    let ReachOp::Peers(peers) = ops[2] else {
        panic!("{ops:?}")
    };
    assert_eq!(peers.len(), 2);
    assert_eq!(peers[0].key.to_base64(), s.peers[0].public_key);
    assert_eq!(peers[0].hostname, "node-3");
    assert_eq!(peers[0].endpoints, s.peers[0].endpoints);
    assert_eq!(peers[0].home_relay.as_deref(), Some("r1"));

    // The same content in a newer version: nothing new for the runtime.
    let e = h.state_answer(&relayed_state(5));
    assert!(reach_ops(&e).is_empty(), "{:?}", reach_ops(&e));

    // An event moves a peer: the whole set again, with the new endpoint and relay.
    let kind = EventKind::EndpointChanged {
        peer_node_id: peer_id(4),
        endpoints: vec!["198.51.100.4:41641".parse().unwrap()],
        home_relay: Some("r1".into()),
    };
    let e = h.frame(1, 6, kind);
    let ops = reach_ops(&e);
    let [ReachOp::Peers(peers)] = ops.as_slice() else {
        panic!("{ops:?}")
    };
    let moved = peers.iter().find(|p| p.node_id == peer_id(4)).unwrap();
    assert_eq!(moved.endpoints, vec!["198.51.100.4:41641".parse().unwrap()]);
    assert_eq!(moved.home_relay.as_deref(), Some("r1"));
}

#[test]
fn a_heartbeat_answer_with_a_fresh_token_is_passed_on_once() {
    let mut h = harness();
    h.up(&relayed_state(4));
    let mut a = ack(4);
    a.relay_token = Some(token(2));
    let e = h.call(CallResult::Heartbeat(Ok(a.clone())));
    assert_eq!(reach_ops(&e), vec![&ReachOp::RelayToken(token(2))]);
    let e = h.call(CallResult::Heartbeat(Ok(a)));
    assert!(reach_ops(&e).is_empty());
    let e = h.call(CallResult::Heartbeat(Ok(ack(4))));
    assert!(reach_ops(&e).is_empty(), "no token, nothing to pass on");
}

#[test]
fn the_revocation_empties_the_runtimes_peers() {
    let mut h = harness();
    h.up(&relayed_state(4));
    let e = h.frame(1, 5, EventKind::NodeRevoked);
    assert_eq!(reach_ops(&e), vec![&ReachOp::Peers(vec![])]);
}

#[test]
fn status_shows_the_runtimes_paths_and_falls_back_to_none() {
    let mut h = harness();
    let s = relayed_state(4);
    h.up(&s);
    let relayed = PeerPathView {
        public_key: s.peers[0].public_key.clone(),
        hostname: "node-3".into(),
        path: Path::Relay {
            relay: "r1".into(),
            transport: Transport::Tcp,
        },
        rtt_ms: Some(31),
        reason: "3 pings unanswered".into(),
        node_id: s.peers[0].node_id,
        last_handshake: None,
    };
    h.step(Input::ReachRead {
        paths: vec![relayed],
        own: Default::default(),
    });
    let e = h.step(Input::Control {
        id: 9,
        request: Request::Status,
    });
    let Some(Effect::Answer {
        answer: Answer::Status(r),
        ..
    }) = e.last()
    else {
        panic!("{e:?}")
    };
    let p = &r.peers[0];
    assert_eq!(
        p.path,
        PeerPath::Relay {
            relay: "r1".into(),
            transport: PathTransport::Tcp
        }
    );
    assert_eq!(p.rtt_ms, Some(31));
    assert_eq!(p.reason, "3 pings unanswered");
    assert_eq!(p.public_key, s.peers[0].public_key);
    // The other peer has no view and the `none` mesh no live peer: no path.
    assert_eq!(r.peers[1].path, PeerPath::None);
    assert_eq!(r.peers[1].rtt_ms, None);
}

#[test]
fn without_a_view_the_path_is_the_live_endpoint_after_a_handshake() {
    use crate::daemon::core::reach::peer_path;
    use crate::mesh::LivePeer;
    let mut live = LivePeer {
        public_key: "k".into(),
        endpoint: Some("192.0.2.7:51820".parse().unwrap()),
        last_handshake: None,
        rx_bytes: 0,
        tx_bytes: 0,
    };
    let (path, rtt, reason) = peer_path("k", Some(&live), &[]);
    assert_eq!((path, rtt), (PeerPath::None, None));
    assert_eq!(reason, "no handshake yet");
    live.last_handshake = Some(std::time::SystemTime::UNIX_EPOCH);
    let (path, _, _) = peer_path("k", Some(&live), &[]);
    assert_eq!(
        path,
        PeerPath::Direct {
            endpoint: "192.0.2.7:51820".parse().unwrap()
        }
    );
    assert_eq!(peer_path("k", None, &[]).0, PeerPath::None);
}

#[test]
fn changed_own_candidates_bring_the_endpoint_report_forward() {
    use crate::reach::io::OwnCandidates;
    let mut h = harness();
    h.up(&relayed_state(4));
    let report_ok = || {
        CallResult::Endpoints(Ok(serde_json::from_value(serde_json::json!({
            "observed": "198.51.100.7:51820", "endpoints": []
        }))
        .unwrap()))
    };
    h.call(report_ok());
    let reports = |e: &[Effect]| {
        calls(e)
            .iter()
            .filter(|c| matches!(c, Call::Endpoints(_)))
            .count()
    };
    // Nothing changed: no early report.
    h.step(Input::ReachRead {
        paths: vec![],
        own: OwnCandidates::default(),
    });
    assert_eq!(reports(&h.after(Duration::from_secs(1))), 0);
    // STUN found a reflexive address: the report goes at the next tick.
    let own = OwnCandidates {
        reflexive: vec!["198.51.100.7:40001".parse().unwrap()],
        home_relay: Some("r1".into()),
        nat: Default::default(),
    };
    h.step(Input::ReachRead {
        paths: vec![],
        own: own.clone(),
    });
    assert_eq!(reports(&h.after(Duration::from_secs(1))), 1);
    h.call(report_ok());
    // The same candidates again: reported already, nothing early.
    h.step(Input::ReachRead { paths: vec![], own });
    assert_eq!(reports(&h.after(Duration::from_secs(1))), 0);
}
