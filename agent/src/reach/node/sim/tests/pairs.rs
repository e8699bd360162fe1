//! Two nodes behind every pair of NAT kinds end on the path docs/reach.md's table gives
//! ([`expected`], strict: the input-accepting pairs go direct, the relays' legs being even),
//! carried as that path says; and a run repeats byte for byte from its seed.

use super::super::net::NatKind;
use super::super::{MS, SECOND, World};

/// Two nodes from boot to their paths: the slowest row (two input-accepting routers whose
/// first punch lost the race) waits out the quiet, about 45 s (docs/reach.md).
const PAIR_BOUND: u64 = 60 * SECOND;

fn any_relay(_: &str) -> bool {
    true
}

/// Two hosts of kinds `a` and `b`, booted, converged by `bound`: when, or what did not.
fn pair_run(seed: u64, a: NatKind, b: NatKind, bound: u64) -> Result<u64, Vec<String>> {
    let mut w = World::new(seed, 2);
    let x = w.add_host(a);
    let y = w.add_host(b);
    w.pair(x, y);
    w.boot_all(SECOND);
    w.converge(bound, true, &any_relay)
}

#[test]
fn every_pair_of_nat_kinds_ends_on_its_expected_path() {
    let mut failed = Vec::new();
    for (i, a) in NatKind::ALL.iter().enumerate() {
        for b in &NatKind::ALL[i..] {
            match pair_run(7, *a, *b, PAIR_BOUND) {
                Ok(t) => eprintln!("{a:?} / {b:?}: {:.1} s", t as f64 / 1e9),
                Err(lines) => failed.push(format!("{a:?} / {b:?}: {lines:?}")),
            }
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// A world of one node of every kind, each wanting every other.
fn every_kind(seed: u64) -> World {
    let mut w = World::new(seed, 2);
    let hosts: Vec<usize> = NatKind::ALL.iter().map(|k| w.add_host(*k)).collect();
    for a in &hosts {
        for b in &hosts {
            w.pair(*a, *b);
        }
    }
    w.boot_all(SECOND);
    w
}

#[test]
fn the_same_seed_gives_the_same_run_byte_for_byte() {
    let run = |seed: u64| {
        let mut w = every_kind(seed);
        w.loss = 500;
        w.run_until(30 * SECOND);
        let registrations = w.relays[0].stats().registrations;
        assert!(registrations > 0, "the relay's core registered the nodes");
        (w.trace(), w.stats.datagrams)
    };
    let first = run(11);
    assert_eq!(first, run(11), "same seed, same trace");
    assert_ne!(first.0, run(12).0, "another seed, another trace");
    assert!(first.1 > 1_000, "the run sent something: {first:?}");
}

/// The first punch of a pair behind input-accepting routers wins the race: a relayed ping that
/// waited in the relay connection's queue for its registration comes back late, and its round
/// trip is not the relay's. A punch timed by it fired late, after the peer's pings (sent the
/// moment our call-me-maybe arrived) had reached our router, which kept an entry of its own;
/// the pair then waited out the quiet (about 50 s, seed 7). Well before the quiet could end.
#[test]
fn a_ping_that_waited_for_the_relay_s_registration_does_not_time_the_punch_late() {
    let mut late = Vec::new();
    for seed in [7, 8, 9, 10] {
        for (a, b) in [
            (NatKind::Eim, NatKind::EimInputAccept),
            (NatKind::EimInputAccept, NatKind::EimInputAccept),
        ] {
            if let Err(lines) = pair_run(seed, a, b, 15 * SECOND) {
                late.push(format!("seed {seed}: {lines:?}"));
            }
        }
    }
    assert!(late.is_empty(), "{late:#?}");
}

/// A peer that starts later than us: our first relayed pings find it unregistered, and the
/// relays say it is gone (held `GONE_HOLD`, 30 s). When its candidates then reach us before its
/// first relayed disco does (a quick control plane), no relay could time a punch, so we pinged
/// them at once, before it had sent to us: its input-accepting router kept an entry of its own,
/// and the pair waited out the quiet (all four seeds failed). New candidates say the peer runs,
/// so what the relays said of it before is stale: the punch is timed through them. With seed 3
/// the candidates arrive before the peer registered at all and the relays say gone again: its
/// candidates wait `GONE_WAIT` for it to come through a relay (they were pinged at once).
#[test]
fn a_peer_that_starts_after_the_relays_said_it_was_gone_is_punched_in_time() {
    let mut late = Vec::new();
    for seed in [1, 2, 3, 4] {
        let mut w = World::new(seed, 2);
        w.control_delay = 10 * MS;
        let a = w.add_host(NatKind::EimInputAccept);
        let b = w.add_host(NatKind::EimInputAccept);
        w.pair(a, b);
        w.boot_at(a, 0);
        w.boot_at(b, 3 * SECOND);
        if let Err(lines) = w.converge(18 * SECOND, true, &any_relay) {
            late.push(format!("seed {seed}: {lines:?}"));
        }
    }
    assert!(late.is_empty(), "{late:#?}");
}
