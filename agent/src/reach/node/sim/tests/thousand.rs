//! A thousand nodes, each wanting about 16 peers (a symmetric random graph from the seed),
//! behind NAT kinds drawn from the seed over every kind, with two relays: every pair ends on
//! its expected path, input-accepting pairs held to direct, within 75 s simulated (50 s with
//! this seed). The wall time is printed, not asserted.

use plexsphere_test_support::seeded::SeededRng;
use rand_core::RngCore;

use super::super::net::NatKind;
use super::super::{SECOND, World, mix};

/// Every wanted pair holds by then (the slowest: an input-accepting pair waiting out a lost
/// punch's quiet, about 45 s after the first punch).
const THOUSAND_BOUND: u64 = 75 * SECOND;

fn any_relay(_: &str) -> bool {
    true
}

/// `nodes` nodes, each pairing with `per_node` others drawn from the seed (so about twice
/// that many peers each), kinds from the seed.
pub(super) fn random_world(seed: u64, nodes: usize, per_node: usize) -> World {
    let mut w = World::new(seed, 2);
    let mut rng = SeededRng::new(mix(seed, 0, 77));
    for _ in 0..nodes {
        let kind = NatKind::ALL[(rng.next_u32() as usize) % NatKind::ALL.len()];
        w.add_host(kind);
    }
    for a in 0..nodes {
        for _ in 0..per_node {
            let b = (rng.next_u64() % nodes as u64) as usize;
            w.pair(a, b);
        }
    }
    w.boot_all(5 * SECOND);
    w
}

#[test]
fn a_thousand_nodes_end_on_their_expected_paths() {
    let started = std::time::Instant::now();
    let mut w = random_world(1_000, 1_000, 8);
    let pairs: usize = w.hosts.iter().map(|h| h.wants.len()).sum::<usize>() / 2;
    // Held to direct: an input-accepting pair whose timed punch lost its race (relay legs that
    // differ by more than the direct path's one-way delay) goes direct after the quiet.
    let result = w.converge(THOUSAND_BOUND, true, &any_relay);
    eprintln!(
        "1,000 nodes, {pairs} pairs: {:?} (simulated), {:?} wall, {:?}",
        result.as_ref().map(|t| *t as f64 / 1e9),
        started.elapsed(),
        w.stats
    );
    if let Err(lines) = result {
        panic!(
            "{} unmet, first: {:#?}",
            lines.len(),
            &lines[..lines.len().min(20)]
        );
    }
}

/// Hundreds of nodes repeat byte for byte from their seed too: no order in the node, the relay's
/// core or the world comes from a hash map's iteration (each map has a random state of its own).
#[test]
fn two_hundred_nodes_repeat_byte_for_byte() {
    let run = || {
        let mut w = random_world(5, 200, 8);
        w.loss = 200;
        w.run_until(10 * SECOND);
        (w.trace(), w.stats.datagrams, w.stats.lost)
    };
    let first = run();
    assert!(first.1 > 10_000, "the run sent something: {first:?}");
    assert_eq!(first, run());
}

/// Two hundred nodes started over 5 s, the input-accepting pairs held to direct: every pair on
/// its path well before a lost punch's quiet could end. Before a peer's new candidates cleared
/// what the relays had said of it while it had not started, 6 such pairs were still relayed at
/// 40 s (their first punch untimed).
#[test]
fn two_hundred_nodes_with_input_accepting_pairs_held_to_direct_end_on_their_paths() {
    let mut w = random_world(1_000, 200, 8);
    if let Err(lines) = w.converge(20 * SECOND, true, &any_relay) {
        panic!(
            "{} unmet: {:#?}",
            lines.len(),
            &lines[..lines.len().min(10)]
        );
    }
}
