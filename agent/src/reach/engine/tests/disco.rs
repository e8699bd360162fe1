//! The engine alone, spoken to as its peer would (or a forger): disco messages, tx ids,
//! learned candidates, bounds under a flood, hysteresis, own candidates.

use std::net::SocketAddr;
use std::time::Duration;

use plexsphere_wire::node::{NatMapping, NatReport};
use plexsphere_wire::reach::disco::{Message, PairKey};
use plexsphere_wire::reach::{public_key, shared_secret};

use crate::reach::engine::sim::{Net, engine, key_of, secret};
use crate::reach::engine::{
    MAX_LEARNED_CANDIDATES, MAX_OUTSTANDING_TX, MAX_PINGS_PER_SEC, MAX_PONGS_PER_SEC,
    MAX_STATE_CANDIDATES, PUNCH_QUIET, PUNCHES_BEFORE_QUIET, TX_LIFETIME,
};
use crate::reach::io::{Effect, Input, Now, Path, PeerReach, TICK};

const SECOND: Duration = Duration::from_secs(1);

/// One engine (node 0) with node 1 as its peer, and a way to speak as node 1.
pub(super) struct Lone {
    pub engine: crate::reach::engine::Engine,
    pub now: Now,
    pub pair: PairKey,
    pub peer: SocketAddr,
    /// The stamp of node 1's last message.
    pub stamp: u64,
}

impl Lone {
    /// No relay in the state: nothing to time a punch through, so the first probe round
    /// pings every candidate at once (`punch`).
    pub fn new() -> (Self, Vec<Effect>) {
        let mut engine = engine(1);
        let net = Net::new([false, false]);
        let now = net.at();
        let out = engine.step(Input::Peers(vec![net.spec(1, None)]), now);
        let pair = PairKey::new(&shared_secret(&secret(2), &public_key(&secret(1))));
        let peer = net.nodes[1].addr;
        (
            Self {
                engine,
                now,
                pair,
                peer,
                stamp: 0,
            },
            out,
        )
    }

    /// `m` sealed by node 1 with its next stamp.
    pub fn seal(&mut self, m: &Message) -> Vec<u8> {
        self.stamp += 1;
        self.pair.seal(&key_of(2), self.stamp, m)
    }

    /// `m` from node 1, arriving from `from`.
    pub fn as_peer(&mut self, from: SocketAddr, m: &Message) -> Vec<Effect> {
        let datagram = self.seal(m);
        self.deliver(from, datagram)
    }

    /// A datagram arriving from `from`.
    pub fn deliver(&mut self, from: SocketAddr, datagram: Vec<u8>) -> Vec<Effect> {
        self.engine
            .step(Input::DiscoDirect { from, datagram }, self.now)
    }

    /// What node 1 reads in a datagram node 0 sent.
    pub fn read(&self, datagram: &[u8]) -> Option<Message> {
        self.pair.open(datagram).ok().map(|o| o.message)
    }

    pub fn later(&mut self, d: Duration) -> Vec<Effect> {
        self.now.at += d;
        self.engine.step(Input::Tick, self.now)
    }

    /// The tx ids of the pings in `out` sent directly to `to`.
    pub fn pings_to(&self, out: &[Effect], to: SocketAddr) -> Vec<[u8; 12]> {
        out.iter()
            .filter_map(|e| match e {
                Effect::SendDirect { to: t, datagram } if *t == to => match self.read(datagram) {
                    Some(Message::Ping { tx }) => Some(tx),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    /// The tx ids of the pongs in `out` sent directly to `to`.
    pub fn pongs_to(&self, out: &[Effect], to: SocketAddr) -> Vec<[u8; 12]> {
        out.iter()
            .filter_map(|e| match e {
                Effect::SendDirect { to: t, datagram } if *t == to => match self.read(datagram) {
                    Some(Message::Pong { tx, .. }) => Some(tx),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    pub fn path(&self) -> Path {
        self.engine.paths()[0].path.clone()
    }
}

#[test]
fn forged_and_altered_disco_changes_nothing() {
    let (mut a, out) = Lone::new();
    let tx = a.pings_to(&out, a.peer)[0];
    let pong = Message::Pong {
        tx,
        observed: a.peer,
    };

    // Not a wanted peer: sealed by node 3 for node 0.
    let stranger = PairKey::new(&shared_secret(&secret(3), &public_key(&secret(1))));
    let datagram = stranger.seal(&key_of(3), 1, &pong);
    let out = a.engine.step(
        Input::DiscoDirect {
            from: a.peer,
            datagram,
        },
        a.now,
    );
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(a.engine.counters().unknown_sender, 1);

    // Node 3 claiming to be node 1 (its sender key, node 3's pair key).
    let mut datagram = stranger.seal(&key_of(3), 2, &pong);
    datagram[4..36].copy_from_slice(&key_of(2).0);
    assert!(
        a.engine
            .step(
                Input::DiscoDirect {
                    from: a.peer,
                    datagram
                },
                a.now
            )
            .is_empty()
    );
    // A real pong with one bit flipped.
    let mut datagram = a.seal(&pong);
    let last = datagram.len() - 1;
    datagram[last] ^= 1;
    assert!(
        a.engine
            .step(
                Input::DiscoDirect {
                    from: a.peer,
                    datagram
                },
                a.now
            )
            .is_empty()
    );
    // Relayed, but the relay's source is not the sealer.
    let datagram = a.seal(&pong);
    let src = key_of(3);
    let relayed = Input::DiscoRelayed {
        relay: "r1".into(),
        src,
        datagram,
    };
    assert!(a.engine.step(relayed, a.now).is_empty());
    assert_eq!(a.engine.counters().unauthentic, 3);
    assert_eq!(a.path(), Path::None);

    // Pongs with a tx id never sent, from another address, or too late: stray.
    let wrong = Message::Pong {
        tx: [7; 12],
        observed: a.peer,
    };
    assert!(a.as_peer(a.peer, &wrong).is_empty());
    let elsewhere = SocketAddr::from(([192, 0, 2, 99], 51820));
    assert!(a.as_peer(elsewhere, &pong).is_empty());
    assert_eq!(a.engine.counters().stray_pongs, 2);
    assert_eq!(a.path(), Path::None);

    // The right pong, in time, from the right address: direct (the control).
    let out = a.as_peer(a.peer, &pong);
    assert_eq!(a.path(), Path::Direct { endpoint: a.peer });
    assert!(out.iter().any(|e| matches!(e, Effect::SetPath { .. })));
    // The same pong again (a replay) counts for nothing.
    a.as_peer(a.peer, &pong);
    assert_eq!(a.engine.counters().stray_pongs, 3);
}

#[test]
fn a_pong_after_the_tx_lifetime_is_stray() {
    let (mut a, out) = Lone::new();
    let tx = a.pings_to(&out, a.peer)[0];
    a.later(TX_LIFETIME + TICK);
    a.as_peer(
        a.peer,
        &Message::Pong {
            tx,
            observed: a.peer,
        },
    );
    assert_eq!(a.engine.counters().stray_pongs, 1);
    assert_eq!(a.path(), Path::None);
}

#[test]
fn a_flood_of_pings_stays_within_the_bounds() {
    let (mut a, _) = Lone::new();
    let start = a.now.at;
    let mut sent = [(0usize, 0usize); 3];
    for n in 0..3000u32 {
        a.now.at = start + Duration::from_millis(u64::from(n));
        let octets = n.to_be_bytes();
        let from = SocketAddr::from(([100, 64, octets[2], octets[3]], 40000));
        let out = a.as_peer(from, &Message::Ping { tx: [1; 12] });
        let second = (n / 1000) as usize;
        for e in out {
            if let Effect::SendDirect { datagram, .. } = e {
                match a.read(&datagram) {
                    Some(Message::Pong { .. }) => sent[second].0 += 1,
                    Some(_) => sent[second].1 += 1,
                    None => panic!("node 1 cannot read {datagram:?}"),
                }
            }
        }
    }
    for (second, (pongs, pings)) in sent.iter().enumerate() {
        assert_eq!(*pongs, MAX_PONGS_PER_SEC as usize, "second {second}");
        assert!(
            *pings <= MAX_PINGS_PER_SEC as usize,
            "second {second}: {pings}"
        );
    }
    let peer = a.engine.peers.values().next().expect("the peer");
    assert!(peer.candidates.len() <= 2 + MAX_LEARNED_CANDIDATES);
    assert!(peer.candidates.len() <= MAX_STATE_CANDIDATES + MAX_LEARNED_CANDIDATES);
    assert!(peer.in_flight() <= MAX_OUTSTANDING_TX);
    assert!(a.engine.counters().rate_limited > 0);
}

#[test]
fn a_ping_from_a_new_address_is_answered_there_and_learned() {
    let (mut a, _) = Lone::new();
    let roamed = SocketAddr::from(([192, 0, 2, 50], 60001));
    let out = a.as_peer(roamed, &Message::Ping { tx: [9; 12] });
    let pong = out.iter().find_map(|e| match e {
        Effect::SendDirect { to, datagram } if *to == roamed => match a.read(datagram) {
            Some(Message::Pong { tx, observed }) => Some((tx, observed)),
            _ => None,
        },
        _ => None,
    });
    assert_eq!(pong, Some(([9; 12], roamed)));
    let tx = a.pings_to(&out, roamed);
    assert_eq!(tx.len(), 1, "the new address is pinged");
    a.as_peer(
        roamed,
        &Message::Pong {
            tx: tx[0],
            observed: a.peer,
        },
    );
    assert_eq!(a.path(), Path::Direct { endpoint: roamed });
}

#[test]
fn call_me_maybe_pings_every_address_at_once() {
    let (mut a, _) = Lone::new();
    let addrs: Vec<SocketAddr> = (1..=4)
        .map(|p| SocketAddr::from(([192, 0, 2, 60], 50000 + p)))
        .collect();
    let datagram = a.seal(&Message::CallMeMaybe {
        addrs: addrs.clone(),
    });
    let input = Input::DiscoRelayed {
        relay: "r1".into(),
        src: key_of(2),
        datagram,
    };
    let out = a.engine.step(input, a.now);
    for addr in addrs {
        assert_eq!(a.pings_to(&out, addr).len(), 1, "{addr}");
    }
}

/// A call-me-maybe through the relay r1, naming `addr`; answers the tx ids of the pings to it.
fn call_me_maybe(a: &mut Lone, addr: SocketAddr) -> Vec<[u8; 12]> {
    let datagram = a.seal(&Message::CallMeMaybe { addrs: vec![addr] });
    let input = Input::DiscoRelayed {
        relay: "r1".into(),
        src: key_of(2),
        datagram,
    };
    let out = a.engine.step(input, a.now);
    a.pings_to(&out, addr)
}

#[test]
fn punches_past_the_series_ping_nothing_until_the_quiet_ends_or_a_pong_comes() {
    let addr = SocketAddr::from(([192, 0, 2, 61], 50001));
    for ends_with_a_pong in [false, true] {
        let (mut a, _) = Lone::new();
        let mut last = Vec::new();
        for n in 0..PUNCHES_BEFORE_QUIET {
            last = call_me_maybe(&mut a, addr);
            assert_eq!(last.len(), 1, "punch {n} of the series");
            a.now.at += SECOND;
        }
        assert!(call_me_maybe(&mut a, addr).is_empty(), "the quiet");
        if ends_with_a_pong {
            // A direct candidate answers (the last punch passed after all): a new series.
            let pong = Message::Pong {
                tx: last[0],
                observed: a.peer,
            };
            a.as_peer(addr, &pong);
            assert_eq!(a.path(), Path::Direct { endpoint: addr });
        } else {
            // A call-me-maybe during the quiet extends it.
            a.now.at += PUNCH_QUIET - SECOND;
            assert!(call_me_maybe(&mut a, addr).is_empty(), "still quiet");
            a.now.at += PUNCH_QUIET;
        }
        assert_eq!(call_me_maybe(&mut a, addr).len(), 1, "a new series");
    }
}

#[test]
fn a_faster_candidate_replaces_a_working_one_only_past_the_hysteresis() {
    let (mut a, out) = Lone::new();
    let lan = SocketAddr::from(([10, 9, 9, 9], 51820));
    let (wan_tx, lan_tx) = (a.pings_to(&out, a.peer)[0], a.pings_to(&out, lan)[0]);
    a.now.at += Duration::from_millis(30);
    a.as_peer(
        a.peer,
        &Message::Pong {
            tx: wan_tx,
            observed: a.peer,
        },
    );
    assert_eq!(a.path(), Path::Direct { endpoint: a.peer });
    a.now.at += Duration::from_millis(5);
    a.as_peer(
        lan,
        &Message::Pong {
            tx: lan_tx,
            observed: lan,
        },
    );
    assert_eq!(
        a.path(),
        Path::Direct { endpoint: a.peer },
        "35 ms vs 30 ms: stays"
    );

    // A new round where the LAN address answers in 2 ms and the other in 30 ms.
    let out = a.later(Duration::from_secs(31));
    a.now.at += Duration::from_millis(2);
    let lan_tx = a.pings_to(&out, lan)[0];
    a.as_peer(
        lan,
        &Message::Pong {
            tx: lan_tx,
            observed: lan,
        },
    );
    assert_eq!(
        a.path(),
        Path::Direct { endpoint: lan },
        "2 ms vs 30 ms: switches"
    );
    assert!(a.engine.paths()[0].reason.starts_with("pong in 2 ms"));
}

#[test]
fn own_candidates_are_announced_when_they_change() {
    let mut e = engine(1);
    let net = Net::new([false, false]);
    let now = net.at();
    let nat = NatReport {
        mapping: NatMapping::EndpointIndependent,
        udp_blocked: false,
    };
    let addrs = vec![SocketAddr::from(([198, 51, 100, 7], 51820))];
    let reflexive = Input::Reflexive {
        addrs: addrs.clone(),
        nat: nat.clone(),
    };
    let out = e.step(reflexive.clone(), now);
    let want = Effect::Candidates {
        reflexive: addrs.clone(),
        home_relay: None,
        nat: nat.clone(),
    };
    assert_eq!(out, vec![want]);
    assert!(e.step(reflexive, now).is_empty(), "unchanged: nothing");
    let out = e.step(Input::HomeRelay(Some("r1".into())), now);
    let want = Effect::Candidates {
        reflexive: addrs,
        home_relay: Some("r1".into()),
        nat,
    };
    assert_eq!(out, vec![want]);
    assert_eq!(e.own_candidates().home_relay.as_deref(), Some("r1"));
}

#[test]
fn our_own_key_is_never_a_peer() {
    let mut e = engine(1);
    let net = Net::new([false, false]);
    let mut own = net.spec(0, None);
    own.key = key_of(1);
    let other: PeerReach = net.spec(1, None);
    e.step(Input::Peers(vec![own, other]), net.at());
    assert_eq!(e.paths().len(), 1);
    assert_eq!(e.paths()[0].hostname, "node-1");
}

#[test]
fn a_forged_ping_from_a_new_address_adds_no_candidate() {
    let (mut a, _) = Lone::new();
    let spoofed = SocketAddr::from(([192, 0, 2, 77], 40000));
    // Sealed by node 3 under node 1's sender key, and a real ping with one bit flipped.
    let stranger = PairKey::new(&shared_secret(&secret(3), &public_key(&secret(1))));
    let ping = Message::Ping { tx: [5; 12] };
    let mut forged = stranger.seal(&key_of(3), 1, &ping);
    forged[4..36].copy_from_slice(&key_of(2).0);
    let mut altered = a.seal(&ping);
    let last = altered.len() - 1;
    altered[last] ^= 1;
    for datagram in [forged, altered] {
        let out = a.deliver(spoofed, datagram);
        assert!(out.is_empty(), "answered: {out:?}");
    }
    let peer = a.engine.peers.values().next().expect("the peer");
    assert!(peer.candidate(spoofed).is_none(), "learned a forged source");
    assert_eq!(a.engine.counters().unauthentic, 2);
}

/// A peer's address inside a subnet route this node reaches through another peer would be a
/// "direct" path through that router's tunnel (WireGuard inside WireGuard, gone with the
/// router): it is neither pinged nor answered. With one of our own addresses in the route (our
/// own LAN, which the kernel reaches directly) it is a candidate like any other.
#[test]
fn an_address_this_node_routes_through_the_mesh_is_no_candidate() {
    let net = Net::new([false, false]);
    let lan = SocketAddr::from(([10, 200, 2, 7], 51820));
    let mut peer = net.spec(1, None);
    let public = peer.endpoints[0];
    peer.endpoints = vec![lan, public];
    let mut router = peer.clone();
    router.key = key_of(3);
    router.node_id = uuid::Uuid::from_u128(3);
    router.endpoints = vec![SocketAddr::from(([198, 51, 100, 3], 51820))];
    router.routes = vec!["10.200.2.0/24".parse().expect("net")];
    let sent_to = |out: &[Effect], to: SocketAddr| {
        out.iter()
            .filter(|e| matches!(e, Effect::SendDirect { to: t, .. } if *t == to))
            .count()
    };

    let mut e = engine(1);
    let now = net.at();
    let out = e.step(Input::Peers(vec![peer.clone(), router.clone()]), now);
    assert!(
        sent_to(&out, public) > 0,
        "the public candidate is pinged: {out:?}"
    );
    assert_eq!(sent_to(&out, lan), 0, "the routed one is not");
    // Nor is a ping answered or learned from inside the route (the router's masquerade of
    // the peer's own ping through its tunnel).
    let pair = PairKey::new(&shared_secret(&secret(2), &public_key(&secret(1))));
    let tunnelled = SocketAddr::from(([10, 200, 2, 10], 51820));
    let ping = pair.seal(&key_of(2), 1, &Message::Ping { tx: [7; 12] });
    let unusable = e.counters().unusable;
    let out = e.step(
        Input::DiscoDirect {
            from: tunnelled,
            datagram: ping,
        },
        now,
    );
    assert_eq!(
        sent_to(&out, tunnelled),
        0,
        "answered through the tunnel: {out:?}"
    );
    assert_eq!(e.counters().unusable, unusable + 1);

    // On that LAN ourselves: the peer's LAN address is reached directly.
    let mut e = engine(1);
    let own = SocketAddr::from(([10, 200, 2, 9], 51820));
    e.step(Input::LocalAddrs(vec![own]), now);
    let out = e.step(Input::Peers(vec![peer, router]), now);
    assert!(sent_to(&out, lan) > 0, "{out:?}");
}
