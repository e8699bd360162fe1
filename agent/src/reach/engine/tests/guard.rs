//! The engine under attack, time stepped: a captured ping replayed, a flood from one address,
//! call-me-maybes naming addresses no peer may be sent to, learned candidates that never
//! answer, and a peer that speaks an older disco version.

use std::net::SocketAddr;
use std::time::Duration;

use plexsphere_wire::reach::disco::Message;

use super::disco::Lone;
use crate::reach::engine::sim::{key_of, net_spec_with};
use crate::reach::engine::{LEARNED_LIFETIME, MAX_ANSWERS_PER_SOURCE_PER_SEC};
use crate::reach::io::{Effect, Input, Path, TICK};

/// Node 1 answers every ping in `out` that node 0 sent to node 1's own address.
fn answer(a: &mut Lone, out: &[Effect]) {
    let peer = a.peer;
    for tx in a.pings_to(out, peer) {
        let pong = Message::Pong { tx, observed: peer };
        a.as_peer(peer, &pong);
    }
}

fn addr(s: &str) -> SocketAddr {
    match s.parse() {
        Ok(a) => a,
        Err(e) => panic!("{s}: {e}"),
    }
}

/// Every address node 0 sent a datagram to directly in `out`.
fn direct_sends(out: &[Effect]) -> Vec<SocketAddr> {
    out.iter()
        .filter_map(|e| match e {
            Effect::SendDirect { to, .. } => Some(*to),
            _ => None,
        })
        .collect()
}

#[test]
fn a_captured_ping_replayed_at_200_per_sec_leaves_the_direct_path_and_the_real_budgets() {
    let (mut a, out) = Lone::new();
    answer(&mut a, &out);
    assert_eq!(a.path(), Path::Direct { endpoint: a.peer });

    // Node 1 pings node 0; an attacker captures the datagram on the way.
    let captured = a.seal(&Message::Ping { tx: [0xAA; 12] });
    let out = a.deliver(a.peer, captured.clone());
    assert_eq!(a.pongs_to(&out, a.peer), vec![[0xAA; 12]]);

    // Five seconds of the capture replayed every 5 ms, alternately from node 1's address and
    // from the attacker's own; meanwhile node 1 pings every 500 ms and answers node 0's pings.
    let attacker = addr("203.0.113.66:40000");
    let start = a.now.at;
    let (mut real, mut answered) = (0u32, 0u32);
    for ms in (5..=5000u64).step_by(5) {
        a.now.at = start + Duration::from_millis(ms);
        let from = if ms % 10 == 0 { a.peer } else { attacker };
        let out = a.deliver(from, captured.clone());
        assert!(
            direct_sends(&out).is_empty(),
            "a replay is answered: {out:?}"
        );
        if ms % 250 == 0 {
            let out = a.engine.step(Input::Tick, a.now);
            answer(&mut a, &out);
        }
        if ms % 500 == 0 {
            real += 1;
            let tx = [ms as u8, (ms >> 8) as u8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
            let out = a.as_peer(a.peer, &Message::Ping { tx });
            if a.pongs_to(&out, a.peer).contains(&tx) {
                answered += 1;
            }
            answer(&mut a, &out);
        }
    }
    assert_eq!(answered, real, "every real ping is answered");
    assert_eq!(a.path(), Path::Direct { endpoint: a.peer });
    let counters = a.engine.counters();
    assert_eq!(counters.replayed, 1000, "{counters:?}");
    assert_eq!(counters.rate_limited, 0, "{counters:?}");
    let peer = a.engine.peers.values().next().expect("the peer");
    assert!(
        peer.candidate(attacker).is_none(),
        "the attacker's address is not learned"
    );
}

#[test]
fn a_ping_flood_from_one_address_does_not_starve_another_address() {
    let (mut a, _) = Lone::new();
    // Authentic pings (fresh stamps: node 1 itself misbehaving, or its pings raced from a
    // wrong address) from one address at 500/s; node 1's other address pings 4 times a second.
    let flood = addr("203.0.113.66:40000");
    let other = addr("[2001:db8::2]:51820");
    let start = a.now.at;
    let (mut flood_pongs, mut sent, mut answered) = (0usize, 0u32, 0u32);
    for ms in (0..3000u64).step_by(2) {
        a.now.at = start + Duration::from_millis(ms);
        let tx = [(ms >> 8) as u8, ms as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let out = a.as_peer(flood, &Message::Ping { tx });
        flood_pongs += a.pongs_to(&out, flood).len();
        if ms % 250 == 0 {
            sent += 1;
            let tx = [(ms >> 8) as u8, ms as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
            let out = a.as_peer(other, &Message::Ping { tx });
            if a.pongs_to(&out, other).contains(&tx) {
                answered += 1;
            }
        }
    }
    assert_eq!(answered, sent, "the other address is answered every time");
    assert!(
        flood_pongs <= 3 * MAX_ANSWERS_PER_SOURCE_PER_SEC as usize,
        "{flood_pongs} pongs to the flooding address"
    );
    assert!(a.engine.counters().rate_limited > 0);
}

#[test]
fn addresses_no_peer_may_be_sent_to_are_never_probed() {
    let (mut a, _) = Lone::new();
    let good = addr("192.0.2.60:50001");
    let refused = [
        "127.0.0.1:51820",
        "[::1]:51820",
        "169.254.169.254:80",
        "169.254.7.7:51820",
        "[fe80::1]:51820",
        "10.64.0.7:51820", // the mesh range
        "[::ffff:127.0.0.1]:51820",
        "[::ffff:169.254.169.254]:80",
        "0.0.0.0:51820",
        "224.0.0.1:51820",
        "192.0.2.61:0",
    ]
    .map(addr);
    let mut named: Vec<SocketAddr> = refused.to_vec();
    named.extend([good, good, addr("[::ffff:192.0.2.60]:50001")]);
    let datagram = a.seal(&Message::CallMeMaybe { addrs: named });
    let relayed = Input::DiscoRelayed {
        relay: "r1".into(),
        src: key_of(2),
        datagram,
    };
    let out = a.engine.step(relayed, a.now);
    assert_eq!(
        direct_sends(&out),
        vec![good],
        "one ping, to the one usable address"
    );

    // The same addresses in the state, and pings coming from them.
    let mut spec = net_spec_with(refused.to_vec());
    spec.endpoints.push(a.peer);
    let mut out = a.engine.step(Input::Peers(vec![spec]), a.now);
    for from in refused {
        out.extend(a.as_peer(from, &Message::Ping { tx: [3; 12] }));
    }
    // And every probe round for a minute.
    for _ in 0..(60_000 / TICK.as_millis() as u32) {
        out.extend(a.later(TICK));
    }
    let sent = direct_sends(&out);
    for r in refused {
        assert!(!sent.contains(&r), "{r} was sent to");
    }
    let peer = a.engine.peers.values().next().expect("the peer");
    assert!(peer.candidates.iter().all(|c| !refused.contains(&c.addr)));
    assert!(a.engine.counters().unusable >= refused.len() as u64);
}

#[test]
fn a_learned_candidate_that_never_answers_expires() {
    let (mut a, _) = Lone::new();
    let silent = addr("192.0.2.60:50001");
    let datagram = a.seal(&Message::CallMeMaybe {
        addrs: vec![silent],
    });
    let relayed = Input::DiscoRelayed {
        relay: "r1".into(),
        src: key_of(2),
        datagram,
    };
    let out = a.engine.step(relayed, a.now);
    assert_eq!(a.pings_to(&out, silent).len(), 1);
    let learned = |a: &Lone| {
        let peer = a.engine.peers.values().next().expect("the peer");
        peer.candidate(silent).is_some()
    };
    assert!(learned(&a));
    let mut elapsed = Duration::ZERO;
    while elapsed < LEARNED_LIFETIME + TICK {
        a.later(TICK);
        elapsed += TICK;
    }
    assert!(
        !learned(&a),
        "forgotten after {LEARNED_LIFETIME:?} without a pong"
    );
    let mut later = Vec::new();
    for _ in 0..(30_000 / TICK.as_millis() as u32) {
        later.extend(a.later(TICK));
    }
    assert!(
        a.pings_to(&later, silent).is_empty(),
        "and no longer probed"
    );
}

#[test]
fn a_version_1_disco_message_is_refused_and_counted() {
    let (mut a, _) = Lone::new();
    let mut old = a.seal(&Message::Ping { tx: [5; 12] });
    old[3] = 1;
    let out = a.deliver(a.peer, old.clone());
    assert!(direct_sends(&out).is_empty());
    a.deliver(a.peer, old);
    assert_eq!(a.engine.counters().other_version, 2);
    assert!(a.engine.peers.values().all(|p| p.warned_version));
}
