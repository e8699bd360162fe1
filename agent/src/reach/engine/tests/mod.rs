//! Two engines over a simulated network ([`crate::reach::engine::sim`]): paths found, lost and
//! regained, relays lost, peers forgotten. The disco messages themselves in [`disco`], the
//! guards against replays and floods in [`guard`], the punch through NATs in [`punch`].

use std::time::Duration;

use crate::reach::engine::sim::{Net, is_direct, is_relay};
use crate::reach::engine::{DIRECT_DEAD_AFTER, HEARTBEAT_INTERVAL, PROBE_INTERVAL, PUNCH_QUIET};
use crate::reach::io::{Effect, Input, Path, TICK, Transport};

mod disco;
mod guard;
mod punch;

const SECOND: Duration = Duration::from_secs(1);

/// How many direct datagrams node `i` sent from `from` to `to` after the start.
fn direct_pings(net: &Net, i: usize, from: Duration, to: Duration) -> usize {
    net.nodes[i]
        .log
        .iter()
        .filter(|(at, e)| {
            *at >= net.start + from
                && *at < net.start + to
                && matches!(e, Effect::SendDirect { .. })
        })
        .count()
}

#[test]
fn finds_the_direct_path_when_both_directions_pass() {
    let mut net = Net::new([false, false]);
    let took = net
        .run_until(3 * SECOND, is_direct)
        .expect("direct within 3 s");
    assert!(took < SECOND, "the first probe round punches: {took:?}");
    for i in 0..2 {
        assert_eq!(net.nodes[i].path, net.direct_to(i));
        let view = &net.nodes[i].engine.paths()[0];
        assert_eq!(view.path, net.direct_to(i));
        assert_eq!(view.rtt_ms, Some(4), "two 2 ms legs");
        assert_eq!(view.reason, "pong in 4 ms");
    }
}

#[test]
fn stays_on_the_home_relay_when_direct_is_dropped_both_ways() {
    for drops in [[true, true], [true, false], [false, true]] {
        let mut net = Net::new(drops);
        net.run(60 * SECOND);
        for i in 0..2 {
            assert!(
                is_relay("r1")(&net.nodes[i].path),
                "{drops:?} node {i}: {:?}",
                net.nodes[i].path
            );
            let view = &net.nodes[i].engine.paths()[0];
            assert_eq!(view.rtt_ms, Some(20), "{drops:?}: two 10 ms legs");
        }
        // While relayed, the direct candidates are punched for on the schedule: two probe
        // rounds of each node, then the pair is quiet (`PUNCH_QUIET`), then it punches again.
        let direct_pings = |from: Duration, to: Duration| direct_pings(&net, 0, from, to);
        assert!(
            direct_pings(Duration::ZERO, PROBE_INTERVAL + SECOND) >= 2,
            "{drops:?}"
        );
        let quiet = (PROBE_INTERVAL + SECOND, PROBE_INTERVAL + PUNCH_QUIET);
        assert_eq!(direct_pings(quiet.0, quiet.1), 0, "{drops:?}: quiet");
        assert!(
            direct_pings(quiet.1, 60 * SECOND) >= 1,
            "{drops:?}: punches again after the quiet"
        );
    }
}

#[test]
fn a_dead_direct_path_falls_back_to_the_relay_within_the_bound() {
    let mut net = Net::new([false, false]);
    net.run_until(3 * SECOND, is_direct).expect("direct first");
    net.run(10 * SECOND);
    assert!(
        is_direct(&net.nodes[0].path),
        "heartbeats keep it: {:?}",
        net.nodes[0].path
    );
    net.drop_direct = [true, true];
    let bound = DIRECT_DEAD_AFTER + HEARTBEAT_INTERVAL + 2 * TICK;
    let took = net
        .run_until(bound, is_relay("r1"))
        .expect("fell back to r1");
    assert!(
        took > SECOND,
        "one lost heartbeat is not a dead path: {took:?}"
    );
    for i in 0..2 {
        let reason = &net.nodes[i].engine.paths()[0].reason;
        assert_eq!(reason, "3 pings unanswered");
    }
    // Probing the dead candidate again does not bring it back: no flapping.
    let sets = |net: &Net| {
        net.nodes[0]
            .log
            .iter()
            .filter(|(_, e)| matches!(e, Effect::SetPath { .. }))
            .count()
    };
    let before = sets(&net);
    net.run(40 * SECOND);
    assert_eq!(sets(&net), before, "{:?}", net.nodes[0].path);
    assert!(is_relay("r1")(&net.nodes[0].path));
}

#[test]
fn a_relayed_pair_upgrades_to_direct_when_the_drops_stop() {
    // Within the first series of punches: at the next probe round.
    let mut net = Net::new([true, true]);
    net.run(3 * SECOND);
    assert!(is_relay("r1")(&net.nodes[0].path));
    net.drop_direct = [false, false];
    net.run_until(PROBE_INTERVAL + SECOND, is_direct)
        .expect("upgraded within one probe interval");
    assert_eq!(net.nodes[1].path, net.direct_to(1));
    // During the quiet after a failed series: at the first probe round past it.
    let mut net = Net::new([true, true]);
    net.run(12 * SECOND);
    assert!(is_relay("r1")(&net.nodes[0].path));
    net.drop_direct = [false, false];
    net.run_until(PUNCH_QUIET + PROBE_INTERVAL, is_direct)
        .expect("upgraded after the quiet");
    assert_eq!(net.nodes[1].path, net.direct_to(1));
}

#[test]
fn a_relay_dying_moves_both_to_the_next_relay() {
    let mut net = Net::new([true, true]);
    net.run(3 * SECOND);
    assert!(is_relay("r1")(&net.nodes[0].path) && is_relay("r1")(&net.nodes[1].path));
    net.kill_relay("r1", "r2");
    let took = net
        .run_until(PROBE_INTERVAL + SECOND, is_relay("r2"))
        .expect("both on r2");
    assert!(took <= PROBE_INTERVAL + SECOND, "{took:?}");
    for i in 0..2 {
        let view = &net.nodes[i].engine.paths()[0];
        assert_eq!(
            view.path,
            Path::Relay {
                relay: "r2".into(),
                transport: Transport::Udp
            }
        );
    }
    // They stay there.
    net.run(20 * SECOND);
    assert!(is_relay("r2")(&net.nodes[0].path) && is_relay("r2")(&net.nodes[1].path));
}

#[test]
fn peer_gone_on_its_relay_moves_the_peer_to_another_that_answers() {
    let mut net = Net::new([true, true]);
    net.run(3 * SECOND);
    // Node 1 leaves r1 for r2 (its home relay changes); node 0's state still says r1.
    net.nodes[1].up.remove("r1");
    let why = "moved home".to_owned();
    net.deliver(
        1,
        Input::RelayDown {
            relay: "r1".into(),
            why,
        },
    );
    net.connect(1, "r2");
    net.deliver(1, Input::HomeRelay(Some("r2".into())));
    let took = net.run_until(PROBE_INTERVAL + 2 * SECOND, is_relay("r2"));
    assert!(
        took.is_some(),
        "{:?} / {:?}",
        net.nodes[0].path,
        net.nodes[1].path
    );
}

#[test]
fn a_removed_peer_is_forgotten() {
    let mut net = Net::new([false, false]);
    net.run_until(3 * SECOND, is_direct).expect("direct first");
    net.deliver(0, Input::Peers(Vec::new()));
    assert!(net.nodes[0].engine.paths().is_empty());
    let cut = net.now;
    net.run(15 * SECOND);
    let sent = net.nodes[0]
        .log
        .iter()
        .filter(|(at, e)| {
            *at > cut && matches!(e, Effect::SendDirect { .. } | Effect::SendRelayed { .. })
        })
        .count();
    assert_eq!(sent, 0, "nothing goes to a forgotten peer");
    assert!(
        net.nodes[0].engine.counters().unknown_sender > 0,
        "its pings are dropped"
    );
}

#[test]
fn the_journal_says_each_path_change_once_with_the_hostname_and_why() {
    let ((), text) = crate::reach::journal::capture(tracing::Level::INFO, || {
        let mut net = Net::new([true, true]);
        net.run(3 * SECOND);
        net.drop_direct = [false, false];
        net.run(8 * SECOND);
        net.drop_direct = [true, true];
        net.run(10 * SECOND);
    });
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("node-1: ")).collect();
    let want = [
        "node-1: none -> relay r1 over udp: the peer's home relay; no direct candidate answered yet",
        "node-1: relay r1 over udp -> direct 198.51.100.2:41641: pong in 4 ms",
        "node-1: direct 198.51.100.2:41641 -> relay r1 over udp: 3 pings unanswered",
    ];
    assert_eq!(lines.len(), want.len(), "{text}");
    for (line, want) in lines.iter().zip(want) {
        assert!(line.contains(want), "{line}\nwanted: {want}");
        assert!(line.contains(" INFO "), "{line}");
    }
}

#[test]
fn a_peer_listed_at_a_stale_address_is_found_where_its_pings_come_from() {
    let mut net = Net::new([false, false]);
    // Node 1's state lists node 0 only at an address that never answers.
    let mut stale = net.spec(0, Some("r1"));
    stale.endpoints = vec!["10.9.9.9:51820".parse().unwrap()];
    net.deliver(1, Input::Peers(vec![stale]));
    net.run_until(3 * SECOND, is_direct).expect("direct");
    assert_eq!(
        net.nodes[1].path,
        net.direct_to(1),
        "learned from node 0's ping"
    );
    assert_eq!(net.nodes[0].path, net.direct_to(0));
}

#[test]
fn a_relay_over_tcp_is_shown_as_such() {
    let mut net = Net::new([true, true]);
    net.run(2 * SECOND);
    let tcp = Input::RelayUp {
        relay: "r1".into(),
        transport: Transport::Tcp,
        rtt: None,
    };
    net.deliver(0, tcp);
    let want = Path::Relay {
        relay: "r1".into(),
        transport: Transport::Tcp,
    };
    assert_eq!(net.nodes[0].path, want);
    assert_eq!(
        net.nodes[0].engine.paths()[0].reason,
        "relay r1 reconnected over tcp"
    );
}

#[test]
fn engines_with_the_same_seed_and_inputs_give_byte_identical_effects() {
    use crate::reach::engine::Engine;
    use crate::reach::engine::sim::{mesh, relay, secret};
    use crate::reach::io::Now;
    use std::time::{Instant, SystemTime};

    let t0 = Now::new(
        Instant::now(),
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    );
    let peer = Net::new([false, false]).spec(1, None);
    let run = |seed: u64| {
        let mut engine = Engine::seeded(secret(1), mesh(), seed);
        let mut out = engine.step(Input::Relays(vec![relay("r1", 3478)]), t0);
        out.extend(engine.step(Input::Peers(vec![peer.clone()]), t0));
        out.extend(engine.step(Input::Tick, t0.plus(PROBE_INTERVAL)));
        out
    };
    let a = run(7);
    let sealed = a
        .iter()
        .filter(|e| matches!(e, Effect::SendDirect { .. } | Effect::SendRelayed { .. }))
        .count();
    assert!(sealed >= 2, "the probe rounds seal pings: {a:?}");
    assert_eq!(a, run(7), "the same seed: the same bytes");
    assert_ne!(a, run(8), "another seed: other tx ids and nonces");
}
