//! Faults: a relay killed, a node roaming, 5 % of the datagrams lost. After each, every pair
//! ends on its expected path again (docs/reach.md).

use super::super::net::NatKind;
use super::super::{SECOND, World};
use crate::reach::io::Path;

fn any_relay(_: &str) -> bool {
    true
}

/// From boot to every path, for a handful of nodes (the slowest pair waits out a quiet).
const BOOT_BOUND: u64 = 60 * SECOND;
/// From a fault to every path again: the relay's silence (`SILENT_DOWN`, 7 s), the next read
/// of the addresses (5 s) and STUN, the control plane's push (1 s), a probe round (5 s), and
/// a punch that lost a race waiting out its quiet (35 s).
const RECOVER_BOUND: u64 = 60 * SECOND;

/// Nodes of the given kinds, each wanting every other, booted and converged.
fn meshed(seed: u64, kinds: &[NatKind]) -> World {
    let mut w = World::new(seed, 2);
    let hosts: Vec<usize> = kinds.iter().map(|k| w.add_host(*k)).collect();
    for a in &hosts {
        for b in &hosts {
            w.pair(*a, *b);
        }
    }
    w.boot_all(SECOND);
    if let Err(lines) = w.converge(BOOT_BOUND, true, &any_relay) {
        panic!("no start: {lines:#?}");
    }
    w
}

fn relayed_through(w: &World, relay: &str) -> usize {
    let mut n = 0;
    for (h, host) in w.hosts.iter().enumerate() {
        for &p in &host.wants {
            if matches!(w.path(h, p), Path::Relay { relay: r, .. } if r == relay) {
                n += 1;
            }
        }
    }
    n
}

#[test]
fn a_killed_relay_moves_its_relayed_pairs_to_the_next_relay() {
    let mut w = meshed(
        21,
        &[NatKind::Edm, NatKind::Edm, NatKind::Eim, NatKind::DropUdp],
    );
    let before = relayed_through(&w, "r1");
    assert!(
        before > 0,
        "the pairs are relayed through r1, the home relay"
    );
    w.kill_relay(0);
    let deadline = w.now + RECOVER_BOUND;
    let not_r1 = |r: &str| r != "r1";
    if let Err(lines) = w.converge(deadline, true, &not_r1) {
        panic!("not moved off r1: {lines:#?}");
    }
    assert_eq!(relayed_through(&w, "r1"), 0);
    assert!(relayed_through(&w, "r2") >= before, "moved to r2");
}

#[test]
fn a_roaming_node_finds_its_paths_again() {
    let mut w = meshed(
        22,
        &[
            NatKind::Eim,
            NatKind::Routed,
            NatKind::FullCone,
            NatKind::Edm,
        ],
    );
    // Host 0 moves behind another EIM router (a new public address), host 3 from EDM to a
    // restricted cone (its pairs go direct now).
    w.roam(0, NatKind::Eim);
    w.roam(3, NatKind::Restricted);
    let deadline = w.now + RECOVER_BOUND;
    if let Err(lines) = w.converge(deadline, true, &any_relay) {
        panic!("not recovered: {lines:#?}");
    }
    let Path::Direct { endpoint } = w.path(1, 0) else {
        panic!("routed to roamed EIM: {:?}", w.path(1, 0));
    };
    assert_eq!(
        endpoint.ip(),
        w.wan_of(0),
        "the path follows the new address"
    );
}

#[test]
fn with_five_percent_loss_every_pair_still_ends_on_its_path() {
    let mut w = World::new(23, 2);
    let hosts: Vec<usize> = NatKind::ALL.iter().map(|k| w.add_host(*k)).collect();
    for a in &hosts {
        for b in &hosts {
            w.pair(*a, *b);
        }
    }
    w.loss = 500;
    w.boot_all(SECOND);
    match w.converge(90 * SECOND, true, &any_relay) {
        Ok(t) => eprintln!("converged at {:.1} s with {:?}", t as f64 / 1e9, w.stats),
        Err(lines) => panic!("{lines:#?}"),
    }
    assert!(w.stats.lost > 0, "datagrams were lost: {:?}", w.stats);
}
