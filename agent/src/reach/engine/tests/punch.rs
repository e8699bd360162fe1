//! The punch through NAT routers whose own input accepts unsolicited datagrams ("EIM, input
//! accept", [`crate::reach::engine::sim_nat`]): an early ping moves the peer's mapping for good, so
//! cold candidates are pinged only in a punch both nodes time through a relay; a ping from an
//! address the peer never advertised is answered there (peer-reflexive); a pair whose punches
//! keep failing goes quiet until the routers forget them, then punches again.

use std::net::IpAddr;
use std::time::Duration;

use super::direct_pings;
use crate::reach::engine::sim::{Net, is_direct, is_relay};
use crate::reach::engine::sim_nat::{CONNTRACK_UDP, Router};
use crate::reach::engine::{GONE_WAIT, PROBE_INTERVAL, PUNCH_QUIET};
use crate::reach::io::{Effect, Path};

const SECOND: Duration = Duration::from_secs(1);
/// Node 1 learns of node 0 this much later than node 0 learns of node 1 (the control plane
/// tells them apart), so an untimed ping would reach node 1's router first.
const INTRODUCED_LATER: Duration = Duration::from_millis(300);

fn wan(i: u8) -> IpAddr {
    IpAddr::from([203, 0, 113, 100 + i])
}

/// Both nodes direct to the address STUN saw for the other: no router moved a mapping.
fn assert_direct_on_the_stun_mappings(net: &Net) {
    for i in 0..2 {
        let want = net.public(1 - i).map(|endpoint| Path::Direct { endpoint });
        assert_eq!(
            Some(net.nodes[i].path.clone()),
            want,
            "node {i}: no mapping moved"
        );
    }
}

fn accepting(i: u8) -> Option<Router> {
    Some(Router::new(wan(i), true))
}

/// Both behind accepting routers; node 0 learns of node 1 first.
fn staggered(nat: [Option<Router>; 2]) -> Net {
    let mut net = Net::unintroduced([false, false], nat);
    net.introduce(0);
    net.run(INTRODUCED_LATER);
    net.introduce(1);
    net
}

#[test]
fn behind_two_input_accepting_routers_the_timed_punch_finds_the_direct_path() {
    let mut net = staggered([accepting(0), accepting(1)]);
    let took = net
        .run_until(10 * SECOND, is_direct)
        .expect("direct within 10 s");
    assert!(took < SECOND, "the first punch passes: {took:?}");
    assert_direct_on_the_stun_mappings(&net);
    // And it holds: heartbeats pass both routers.
    net.run(20 * SECOND);
    assert!(is_direct(&net.nodes[0].path) && is_direct(&net.nodes[1].path));
}

#[test]
fn no_cold_ping_leaves_before_the_peer_answers_through_a_relay() {
    let mut net = Net::unintroduced([false, false], [accepting(0), accepting(1)]);
    net.introduce(0);
    net.run(12 * SECOND);
    let direct = net.nodes[0]
        .log
        .iter()
        .filter(|(_, e)| matches!(e, Effect::SendDirect { .. }))
        .count();
    assert_eq!(
        direct, 0,
        "node 1 does not know node 0 yet: nothing to time a punch with"
    );
    assert!(
        is_relay("r1")(&net.nodes[0].path),
        "on node 1's home relay meanwhile: {:?}",
        net.nodes[0].path
    );
    net.introduce(1);
    net.run_until(10 * SECOND, is_direct)
        .expect("direct once both know each other");
}

#[test]
fn a_ping_from_a_moved_mapping_is_answered_where_it_came_from() {
    // Node 0 behind an accepting router that an early datagram from node 1 reached first:
    // node 0's mapping towards node 1 is another port than STUN saw. Node 1 has a public
    // address; it finds node 0 where node 0's pings come from (peer-reflexive).
    let mut net = Net::unintroduced([false, false], [accepting(0), None]);
    let (p0, p1) = (net.public(0).unwrap(), net.public(1).unwrap());
    let now = net.now;
    if let Some(router) = net.nat[0].as_mut() {
        assert_eq!(router.inbound(p1, p0, now), None);
    }
    net.introduce(0);
    net.introduce(1);
    net.run_until(10 * SECOND, is_direct).expect("direct");
    assert_eq!(net.nodes[0].path, Path::Direct { endpoint: p1 });
    let Path::Direct { endpoint } = net.nodes[1].path.clone() else {
        panic!("node 1: {:?}", net.nodes[1].path)
    };
    assert_eq!(endpoint.ip(), p0.ip());
    assert_ne!(
        endpoint, p0,
        "the moved mapping, learned from node 0's ping"
    );
    let view = &net.nodes[1].engine.paths()[0];
    assert!(view.reason.starts_with("pong in"), "{view:?}");
}

/// Node 1 has not started: no relay knows it, and both say so (`PeerGone`). Its candidates
/// are not pinged untimed within `GONE_WAIT` of the last such answer (found by the simulator:
/// they were pinged at once, and node 1's accepting router kept an entry of its own, so the
/// pair waited out the quiet once node 1 came up); when node 1 starts within it, the punch is
/// timed through the relay and the pair goes direct on the mappings STUN saw. A peer that
/// never registers is still pinged cold after `GONE_WAIT` (it may run and reach no relay).
#[test]
fn a_peer_no_relay_knows_yet_is_not_pinged_untimed_before_gone_wait() {
    let direct_pings = |net: &Net, from: Duration, to: Duration| direct_pings(net, 0, from, to);
    let unstarted = || {
        let mut net = Net::unintroduced([false, false], [accepting(0), accepting(1)]);
        net.nodes[1].up.clear();
        net.introduce(0);
        net
    };
    // Node 1 starts 3 s in: registers at its home relay and learns of node 0.
    let mut net = unstarted();
    net.run(3 * SECOND);
    assert_eq!(direct_pings(&net, Duration::ZERO, 3 * SECOND), 0);
    net.connect(1, "r1");
    net.introduce(1);
    net.run_until(5 * SECOND, is_direct)
        .expect("direct soon after node 1 started");
    assert_direct_on_the_stun_mappings(&net);
    // Node 1 never starts: its candidates are pinged once GONE_WAIT has passed.
    let mut net = unstarted();
    net.run(GONE_WAIT + PROBE_INTERVAL + SECOND);
    assert_eq!(direct_pings(&net, Duration::ZERO, GONE_WAIT), 0);
    assert!(
        direct_pings(&net, GONE_WAIT, GONE_WAIT + PROBE_INTERVAL + SECOND) > 0,
        "pinged cold after GONE_WAIT"
    );
}

/// Both behind accepting routers, and the routers in `poisoned` already hold an entry of their
/// own for the pair's tuple (a punch that lost the race, or an untimed ping of an older plexd):
/// the other node's pings to that router's host arrived before the host sent to it.
fn lost_race(poisoned: &[usize]) -> Net {
    let mut net = Net::unintroduced([false, false], [accepting(0), accepting(1)]);
    let (p0, p1) = (net.public(0).unwrap(), net.public(1).unwrap());
    let now = net.now;
    for &i in poisoned {
        let (src, dst) = if i == 0 { (p1, p0) } else { (p0, p1) };
        if let Some(router) = net.nat[i].as_mut() {
            assert_eq!(router.inbound(src, dst, now), None);
        }
    }
    net.introduce(0);
    net.introduce(1);
    net
}

/// The longest gap between two direct datagrams node `i` sent before `until`.
fn longest_direct_silence(net: &Net, i: usize, until: std::time::Instant) -> Duration {
    let sends: Vec<std::time::Instant> = net.nodes[i]
        .log
        .iter()
        .filter(|(at, e)| *at <= until && matches!(e, Effect::SendDirect { .. }))
        .map(|(at, _)| *at)
        .collect();
    sends
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]))
        .max()
        .unwrap_or_default()
}

#[test]
fn a_punch_that_lost_the_race_is_tried_again_once_the_routers_forgot_it() {
    // The failed series (two probe rounds of each side), the quiet, the next probe round and
    // its punch.
    let bound = 2 * PROBE_INTERVAL + PUNCH_QUIET + PROBE_INTERVAL + SECOND;
    for poisoned in [&[1][..], &[0, 1]] {
        let mut net = lost_race(poisoned);
        net.run(PROBE_INTERVAL + SECOND);
        for i in 0..2 {
            assert!(
                is_relay("r1")(&net.nodes[i].path),
                "{poisoned:?}: the first punches refresh the entries; node {i}: {:?}",
                net.nodes[i].path
            );
        }
        let took = net.run_until(bound, is_direct);
        assert!(
            took.is_some(),
            "{poisoned:?}: still {:?} / {:?}",
            net.nodes[0].path,
            net.nodes[1].path
        );
        for i in 0..2 {
            let want = net.public(1 - i).map(|endpoint| Path::Direct { endpoint });
            assert_eq!(
                Some(net.nodes[i].path.clone()),
                want,
                "{poisoned:?} node {i}: the entries and the moved mappings expired"
            );
            // Neither side sent a direct datagram while the routers forgot the lost punch.
            let silence = longest_direct_silence(&net, i, net.now);
            assert!(
                silence >= CONNTRACK_UDP,
                "{poisoned:?} node {i}: quiet for only {silence:?}"
            );
        }
        net.run(20 * SECOND);
        assert!(is_direct(&net.nodes[0].path) && is_direct(&net.nodes[1].path));
    }
}
