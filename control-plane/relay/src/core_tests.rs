use std::sync::Arc;
use std::time::UNIX_EPOCH;

use plexsphere_wire::reach::relay::{LEASE_SECS, RefuseCode, RelayToken};
use plexsphere_wire::signed::{DomainSigner, SignContext};

use super::*;

const RELAY_SK: [u8; 32] = [11; 32];

fn signer() -> DomainSigner {
    DomainSigner::from_seed(&[3; 32]).unwrap()
}

fn core(limits: Limits, t0: Instant) -> Core {
    let verifier = DomainVerifier::from_b64(&signer().public_key_b64()).unwrap();
    Core::new(
        RELAY_SK,
        [9; 32],
        vec![verifier],
        limits,
        Arc::new(Counters::default()),
        t0,
    )
}

fn token(node: &PublicKey, expires_at: i64) -> Vec<u8> {
    // One node id a key, unless a test says otherwise.
    let id = uuid::Uuid::from_bytes(node.0[..16].try_into().unwrap());
    token_for(id, 1, node, expires_at)
}

fn token_for(
    node_id: uuid::Uuid,
    key_generation: i64,
    node: &PublicKey,
    expires_at: i64,
) -> Vec<u8> {
    let t = RelayToken {
        domain_id: uuid::Uuid::nil(),
        node_id,
        public_key: node.to_base64(),
        expires_at,
        key_generation,
    };
    serde_json::to_vec(&signer().sign(SignContext::RelayToken, &t).unwrap()).unwrap()
}

/// Runs hello + register for node secret `sk` from `peer`; the answer's frame.
fn register(core: &mut Core, peer: Peer, sk: [u8; 32], now: Now) -> Frame {
    let node = plexsphere_wire::reach::public_key(&sk);
    register_token(core, peer, sk, token(&node, now.unix() + 600), false, now)
}

/// Runs hello + register with `token`, with the sealed proof when `sealed`.
fn register_token(
    core: &mut Core,
    peer: Peer,
    sk: [u8; 32],
    token: Vec<u8>,
    sealed: bool,
    now: Now,
) -> Frame {
    let node = plexsphere_wire::reach::public_key(&sk);
    let cookie = match handle_frame(core, Frame::Hello { node }, peer, now)
        .unwrap()
        .frame
    {
        Frame::Challenge { cookie } => cookie,
        f => panic!("want a challenge, got {f:?}"),
    };
    let relay_pk = plexsphere_wire::reach::public_key(&RELAY_SK);
    let shared = plexsphere_wire::reach::shared_secret(&sk, &relay_pk);
    let proof = if sealed {
        plexsphere_wire::reach::relay::sealed_proof(&shared, &cookie, &node)
    } else {
        plexsphere_wire::reach::relay::proof(&shared, &cookie, &node)
    };
    let frame = Frame::Register {
        node,
        cookie,
        proof,
        token,
    };
    handle_frame(core, frame, peer, now).unwrap().frame
}

/// Hands the core one frame and takes what it answered: at most one frame.
fn handle_frame(core: &mut Core, frame: Frame, peer: Peer, now: Now) -> Option<Out> {
    core.handle_frame(frame, peer, now);
    match core.poll_transmit() {
        Some(Transmit::Frame(out)) => Some(out),
        None => None,
        Some(t) => panic!("want a frame, got {t:?}"),
    }
}

/// Hands the core one `send` and takes what it answered (`None`: dropped).
fn handle_send(
    core: &mut Core,
    dst: &KeyPrefix,
    len: usize,
    peer: Peer,
    now: Now,
) -> Option<Transmit> {
    core.handle_send(dst, len, peer, now);
    core.poll_transmit()
}

fn at(t0: Instant, secs: u64) -> Now {
    Now::new(
        t0 + Duration::from_secs(secs),
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs),
    )
}

fn udp(port: u16) -> Peer {
    Peer::Udp(SocketAddr::from(([192, 0, 2, 1], port)))
}

#[test]
fn max_nodes_refuses_busy_until_a_lease_ends() {
    let t0 = Instant::now();
    let mut c = core(
        Limits {
            max_nodes: 2,
            ..Limits::default()
        },
        t0,
    );
    assert!(matches!(
        register(&mut c, udp(1), [1; 32], at(t0, 0)),
        Frame::Registered { .. }
    ));
    assert!(matches!(
        register(&mut c, udp(2), [2; 32], at(t0, 0)),
        Frame::Registered { .. }
    ));
    match register(&mut c, udp(3), [3; 32], at(t0, 1)) {
        Frame::Refused { code, .. } => assert_eq!(code, RefuseCode::Busy),
        f => panic!("want busy, got {f:?}"),
    }
    // A registered node renews at the limit.
    assert!(matches!(
        register(&mut c, udp(1), [1; 32], at(t0, 30)),
        Frame::Registered { .. }
    ));
    // Node 2's lease has ended by now (it did not renew): room for node 3.
    let later = at(t0, u64::from(LEASE_SECS) + 1);
    assert!(matches!(
        register(&mut c, udp(3), [3; 32], later),
        Frame::Registered { .. }
    ));
    assert_eq!(c.registered(), 2);
}

#[test]
fn budget_cuts_a_flood_and_refills_with_time() {
    let t0 = Instant::now();
    let mut c = core(
        Limits {
            node_frames_per_sec: 10,
            ..Limits::default()
        },
        t0,
    );
    let now = at(t0, 0);
    register(&mut c, udp(1), [1; 32], now);
    register(&mut c, udp(2), [2; 32], now);
    let dst = plexsphere_wire::reach::relay::prefix(&plexsphere_wire::reach::public_key(&[2; 32]));
    let delivered = (0..100)
        .filter(|_| {
            matches!(
                handle_send(&mut c, &dst, 100, udp(1), now),
                Some(Transmit::Forward { .. })
            )
        })
        .count();
    assert_eq!(delivered, 10);
    assert_eq!(c.counters.dropped_budget.get(), 90);
    // Half a second later, five more.
    let half = Now {
        at: t0 + Duration::from_millis(500),
        ..now
    };
    let delivered = (0..100)
        .filter(|_| {
            matches!(
                handle_send(&mut c, &dst, 100, udp(1), half),
                Some(Transmit::Forward { .. })
            )
        })
        .count();
    assert_eq!(delivered, 5);
}

#[test]
fn a_new_registration_moves_the_key_and_the_old_address_is_unregistered() {
    let t0 = Instant::now();
    let mut c = core(Limits::default(), t0);
    let now = at(t0, 0);
    register(&mut c, udp(1), [1; 32], now);
    register(&mut c, udp(2), [2; 32], now);
    let dst = plexsphere_wire::reach::relay::prefix(&plexsphere_wire::reach::public_key(&[2; 32]));
    // Node 1 roams to port 9.
    register(&mut c, udp(9), [1; 32], now);
    assert!(matches!(
        handle_send(&mut c, &dst, 10, udp(9), now),
        Some(Transmit::Forward { .. })
    ));
    match handle_send(&mut c, &dst, 10, udp(1), now) {
        Some(Transmit::Frame(Out {
            frame: Frame::Refused { code, .. },
            ..
        })) => assert_eq!(code, RefuseCode::NotRegistered),
        f => panic!("want not registered, got {f:?}"),
    }
    // Node 2 sees node 1 at its new address.
    let src = plexsphere_wire::reach::relay::prefix(&plexsphere_wire::reach::public_key(&[1; 32]));
    match handle_send(&mut c, &src, 10, udp(2), now) {
        Some(Transmit::Forward { to: To::Udp(a), .. }) => assert_eq!(Peer::Udp(a), udp(9)),
        f => panic!("want delivery, got {f:?}"),
    }
}

#[test]
fn peer_gone_and_refusals_are_rate_limited() {
    let t0 = Instant::now();
    let mut c = core(
        Limits {
            node_answers_per_sec: 3,
            refusals_per_sec: 4,
            ..Limits::default()
        },
        t0,
    );
    let now = at(t0, 0);
    register(&mut c, udp(1), [1; 32], now);
    let nobody = [0xEE; 8];
    let gone = (0..50)
        .filter(|_| {
            matches!(
                handle_send(&mut c, &nobody, 10, udp(1), now),
                Some(Transmit::Frame(_))
            )
        })
        .count();
    assert_eq!(gone, 3);
    assert_eq!(c.counters.peer_gone.get(), 50);
    // A stranger's sends: at most the global refusal rate is answered.
    let refused = (0..50)
        .filter(|_| {
            matches!(
                handle_send(&mut c, &nobody, 10, udp(77), now),
                Some(Transmit::Frame(_))
            )
        })
        .count();
    assert_eq!(refused, 4);
}

#[test]
fn a_closed_tcp_connection_takes_its_registration_along() {
    let t0 = Instant::now();
    let mut c = core(
        Limits {
            max_tcp_connections: 1,
            ..Limits::default()
        },
        t0,
    );
    let (tx, _rx) = mpsc::channel(4);
    let addr = SocketAddr::from(([192, 0, 2, 5], 443));
    let id = c.handle_tcp_open(tx.clone(), addr, t0).unwrap();
    assert!(
        c.handle_tcp_open(tx, addr, t0).is_none(),
        "over max_tcp_connections"
    );
    let now = at(t0, 0);
    assert!(matches!(
        register(&mut c, Peer::Tcp(id), [1; 32], now),
        Frame::Registered { .. }
    ));
    assert_eq!(c.registered(), 1);
    c.handle_tcp_close(id);
    assert_eq!(c.registered(), 0);
}

#[test]
fn tcp_connections_are_capped_per_source_and_64() {
    let t0 = Instant::now();
    let mut c = core(
        Limits {
            max_tcp_connections: 10,
            max_tcp_per_source: 2,
            ..Limits::default()
        },
        t0,
    );
    let (tx, _rx) = mpsc::channel(4);
    let open = |c: &mut Core, a: &str| c.handle_tcp_open(tx.clone(), a.parse().unwrap(), t0);
    let a = open(&mut c, "192.0.2.1:1000").unwrap();
    open(&mut c, "192.0.2.1:1001").unwrap();
    assert!(
        open(&mut c, "192.0.2.1:1002").is_none(),
        "a third from one address"
    );
    // The neighbour address is another source; one IPv6 /64 is one source.
    assert!(open(&mut c, "192.0.2.2:1000").is_some());
    open(&mut c, "[2001:db8:0:1::1]:1").unwrap();
    open(&mut c, "[2001:db8:0:1::2]:1").unwrap();
    assert!(
        open(&mut c, "[2001:db8:0:1:ffff::3]:1").is_none(),
        "the same /64"
    );
    assert!(open(&mut c, "[2001:db8:0:2::1]:1").is_some(), "another /64");
    assert_eq!(c.counters.tcp_refused_per_source.get(), 2);
    // A closed connection gives its source a slot back.
    c.handle_tcp_close(a);
    assert!(open(&mut c, "192.0.2.1:1003").is_some());
}

#[test]
fn strangers_get_no_pong_and_answers_within_their_prefixs_bucket() {
    let t0 = Instant::now();
    let mut c = core(
        Limits {
            prefix_answers: crate::prefix::PrefixLimits {
                per_sec: 1,
                burst: 3,
                max_prefixes: 8,
            },
            ..Limits::default()
        },
        t0,
    );
    let now = at(t0, 0);
    // A ping from nobody gets nothing.
    assert!(handle_frame(&mut c, Frame::Ping { nonce: [1; 8] }, udp(5), now).is_none());
    assert_eq!(c.counters.dropped_unregistered.get(), 1);
    // Hellos from one /24 (whatever the port or the address within it): 3 challenges.
    let hello = Frame::Hello {
        node: PublicKey([7; 32]),
    };
    let answered = (0..20u16)
        .filter(|p| {
            let from = Peer::Udp(SocketAddr::from(([192, 0, 2, (p % 5) as u8], 2000 + p)));
            handle_frame(&mut c, hello.clone(), from, now).is_some()
        })
        .count();
    assert_eq!(answered, 3);
    assert_eq!(c.counters.dropped_prefix_rate.get(), 17);
    // The same /24's STUN and refusals draw on the same (empty) bucket.
    assert!(!c.may_answer(udp(9), now.at));
    assert!(handle_send(&mut c, &[0; 8], 10, udp(9), now).is_none());
    // Another /24 has its own; a TCP connection is never charged.
    let other = Peer::Udp(SocketAddr::from(([198, 51, 100, 1], 1)));
    assert!(handle_frame(&mut c, hello.clone(), other, now).is_some());
    assert!(c.may_answer(Peer::Tcp(1), now.at));
    // A second later, one more for the first /24.
    let later = at(t0, 1);
    assert!(handle_frame(&mut c, hello.clone(), udp(3), later).is_some());
    assert!(handle_frame(&mut c, hello, udp(3), later).is_none());
}

#[test]
fn a_registered_address_is_answered_beyond_the_prefix_bucket() {
    let t0 = Instant::now();
    let mut c = core(
        Limits {
            prefix_answers: crate::prefix::PrefixLimits {
                per_sec: 1,
                burst: 2,
                max_prefixes: 8,
            },
            ..Limits::default()
        },
        t0,
    );
    let now = at(t0, 0);
    // The challenge takes one of the two tokens of 192.0.2.0/24; `registered` is not charged.
    assert!(matches!(
        register(&mut c, udp(1), [1; 32], now),
        Frame::Registered { .. }
    ));
    // From now on the registered address gets pongs, STUN and renewals however often.
    for i in 0..10u8 {
        assert!(c.may_answer(udp(1), now.at));
        assert!(matches!(
            handle_frame(&mut c, Frame::Ping { nonce: [i; 8] }, udp(1), now)
                .unwrap()
                .frame,
            Frame::Pong { .. }
        ));
    }
    assert!(matches!(
        register(&mut c, udp(1), [1; 32], now),
        Frame::Registered { .. }
    ));
}

#[test]
fn one_source_always_leaves_a_slot() {
    let limits = |global, per_source| Limits {
        max_tcp_connections: global,
        max_tcp_per_source: per_source,
        ..Limits::default()
    };
    assert_eq!(limits(10_000, 256).tcp_per_source(), 256);
    assert_eq!(limits(100, 256).tcp_per_source(), 99);
    assert_eq!(limits(1, 256).tcp_per_source(), 1);
    let t0 = Instant::now();
    let mut c = core(limits(3, 256), t0);
    let (tx, _rx) = mpsc::channel(4);
    let a: SocketAddr = "192.0.2.1:1".parse().unwrap();
    assert!(c.handle_tcp_open(tx.clone(), a, t0).is_some());
    assert!(c.handle_tcp_open(tx.clone(), a, t0).is_some());
    assert!(c.handle_tcp_open(tx.clone(), a, t0).is_none());
    assert!(
        c.handle_tcp_open(tx, "192.0.2.2:1".parse().unwrap(), t0)
            .is_some()
    );
}

#[test]
fn the_sweep_is_due_at_poll_timeout_and_not_before() {
    let t0 = Instant::now();
    let mut c = core(Limits::default(), t0);
    assert_eq!(c.poll_timeout(), Some(t0 + SWEEP_EVERY));
    register(&mut c, udp(1), [1; 32], at(t0, 0));
    let lease_end = t0 + Duration::from_secs(u64::from(LEASE_SECS));
    // A sweep a moment before the lease ends keeps it, and sets the next deadline.
    let before = lease_end - SWEEP_EVERY / 2;
    c.handle_timeout(before);
    assert_eq!(c.registered(), 1);
    let due = before + SWEEP_EVERY;
    assert_eq!(c.poll_timeout(), Some(due));
    assert!(due > lease_end);
    // The lease has ended, but the sweep is not due yet: nothing happens.
    c.handle_timeout(due - Duration::from_nanos(1));
    assert_eq!(c.registered(), 1, "swept before its deadline");
    assert_eq!(c.poll_timeout(), Some(due));
    // At the deadline the ended lease is swept.
    c.handle_timeout(due);
    assert_eq!(c.registered(), 0);
    assert_eq!(c.poll_timeout(), Some(due + SWEEP_EVERY));
    assert!(c.poll_transmit().is_none(), "a sweep answers nothing");
}

#[test]
fn outputs_nobody_drains_stop_at_max_outputs_and_the_oldest_stay() {
    let t0 = Instant::now();
    let mut c = core(Limits::default(), t0);
    let now = at(t0, 0);
    register(&mut c, udp(1), [1; 32], now);
    let extra = 10;
    for i in 0..MAX_OUTPUTS + extra {
        let nonce = [u8::try_from(i).unwrap(); 8];
        c.handle_frame(Frame::Ping { nonce }, udp(1), now);
    }
    assert_eq!(c.counters.dropped_outputs.get(), extra as u64);
    for i in 0..MAX_OUTPUTS {
        match c.poll_transmit() {
            Some(Transmit::Frame(Out {
                frame: Frame::Pong { nonce },
                ..
            })) => assert_eq!(nonce, [u8::try_from(i).unwrap(); 8]),
            t => panic!("want pong {i}, got {t:?}"),
        }
    }
    assert!(c.poll_transmit().is_none());
    // Drained, the queue takes outputs again.
    c.handle_frame(Frame::Ping { nonce: [0; 8] }, udp(1), now);
    assert!(c.poll_transmit().is_some());
    assert_eq!(c.counters.dropped_outputs.get(), extra as u64);
}

#[path = "core_seal_tests.rs"]
mod seal;
