//! Sealed answers, token lifetimes and one registration a node id.

use plexsphere_wire::reach::relay::{FrameKey, TOKEN_TTL_SECS, prefix};
use plexsphere_wire::reach::{public_key, shared_secret};

use super::*;

fn key_of(sk: [u8; 32]) -> FrameKey {
    FrameKey::new(&shared_secret(&sk, &public_key(&RELAY_SK)))
}

/// The inner frame and counter of a sealed answer, checked under the node's key.
fn open(sk: [u8; 32], frame: Frame) -> (u64, Frame) {
    match frame {
        Frame::Sealed { counter, body, tag } => {
            (counter, key_of(sk).open(counter, &body, &tag).unwrap())
        }
        f => panic!("want a sealed frame, got {f:?}"),
    }
}

fn answer(f: Option<Transmit>) -> Frame {
    match f {
        Some(Transmit::Frame(out)) => out.frame,
        f => panic!("want an answer, got {f:?}"),
    }
}

fn id(n: u128) -> uuid::Uuid {
    uuid::Uuid::from_u128(n)
}

#[test]
fn a_sealed_registration_gets_sealed_answers_with_a_growing_counter() {
    let t0 = Instant::now();
    let mut c = core(Limits::default(), t0);
    let now = at(t0, 0);
    let node = public_key(&[1; 32]);
    let t = token(&node, now.unix() + 600);
    let (first, registered) = open(
        [1; 32],
        register_token(&mut c, udp(1), [1; 32], t, true, now),
    );
    assert!(
        matches!(registered, Frame::Registered { .. }),
        "{registered:?}"
    );
    assert!(
        first >= now.unix_secs() * 1_000_000,
        "the counter starts at the relay's time"
    );
    let pong = handle_frame(&mut c, Frame::Ping { nonce: [4; 8] }, udp(1), now)
        .unwrap()
        .frame;
    let (second, pong) = open([1; 32], pong);
    assert_eq!(pong, Frame::Pong { nonce: [4; 8] });
    assert!(second > first);
    let (third, gone) = open(
        [1; 32],
        answer(handle_send(&mut c, &[0xEE; 8], 10, udp(1), now)),
    );
    assert_eq!(gone, Frame::PeerGone { dst: [0xEE; 8] });
    assert!(third > second);
    // A sealed frame of node 1 does not open under node 2's key.
    let Frame::Sealed { counter, body, tag } =
        handle_frame(&mut c, Frame::Ping { nonce: [5; 8] }, udp(1), now)
            .unwrap()
            .frame
    else {
        panic!("want a sealed pong")
    };
    assert!(key_of([2; 32]).open(counter, &body, &tag).is_err());
    // A node with the plain proof (an older plexd) gets plain answers, as before.
    assert!(matches!(
        register(&mut c, udp(2), [2; 32], now),
        Frame::Registered { .. }
    ));
    let pong = handle_frame(&mut c, Frame::Ping { nonce: [6; 8] }, udp(2), now)
        .unwrap()
        .frame;
    assert_eq!(pong, Frame::Pong { nonce: [6; 8] });
    // Nobody registered at that address: a plain refusal (a hint, nothing more).
    assert!(matches!(
        answer(handle_send(&mut c, &[0xEE; 8], 10, udp(9), now)),
        Frame::Refused {
            code: RefuseCode::NotRegistered,
            ..
        }
    ));
}

#[test]
fn key_rotations_leave_one_registration_a_node_id_and_an_older_key_is_refused() {
    let t0 = Instant::now();
    let mut c = core(Limits::default(), t0);
    // One node rotating its key every 30 s for an hour: 120 keys, one registration.
    for i in 0..120u8 {
        let now = at(t0, u64::from(i) * 30);
        let sk = [i + 1; 32];
        let t = token_for(
            id(7),
            1_000 + i64::from(i) * 30,
            &public_key(&sk),
            now.unix() + 600,
        );
        let (_, f) = open(
            sk,
            register_token(&mut c, udp(u16::from(i) + 1), sk, t, true, now),
        );
        assert!(matches!(f, Frame::Registered { .. }), "key {i}: {f:?}");
    }
    assert_eq!(c.registered(), 1, "one registration for the node id");
    let now = at(t0, 119 * 30);
    // The previous key, with its own still valid token: refused, as an older generation.
    let old_sk = [119; 32];
    let t = token_for(
        id(7),
        1_000 + 118 * 30,
        &public_key(&old_sk),
        now.unix() + 600,
    );
    let (_, f) = open(
        old_sk,
        register_token(&mut c, udp(500), old_sk, t, true, now),
    );
    assert!(
        matches!(
            f,
            Frame::Refused {
                code: RefuseCode::BadToken,
                ..
            }
        ),
        "{f:?}"
    );
    // ... and its old address is no longer registered: sends from it are refused.
    assert!(matches!(
        answer(handle_send(&mut c, &[0xEE; 8], 10, udp(119), now)),
        Frame::Refused {
            code: RefuseCode::NotRegistered,
            ..
        }
    ));
    // The current key still relays to another node.
    let other = public_key(&[200; 32]);
    let t = token(&other, now.unix() + 600);
    register_token(&mut c, udp(900), [200; 32], t, true, now);
    assert!(matches!(
        handle_send(&mut c, &prefix(&other), 10, udp(120), now),
        Some(Transmit::Forward { .. })
    ));
    assert_eq!(c.registered(), 2);
}

#[test]
fn a_token_that_lives_longer_than_the_ttl_is_refused() {
    let t0 = Instant::now();
    let mut c = core(Limits::default(), t0);
    let now = at(t0, 0);
    let node = public_key(&[1; 32]);
    let day = token(&node, now.unix() + 24 * 3600);
    let (_, f) = open(
        [1; 32],
        register_token(&mut c, udp(1), [1; 32], day, true, now),
    );
    assert!(
        matches!(
            f,
            Frame::Refused {
                code: RefuseCode::BadToken,
                ..
            }
        ),
        "{f:?}"
    );
    let ttl = token(&node, now.unix() + TOKEN_TTL_SECS);
    let (_, f) = open(
        [1; 32],
        register_token(&mut c, udp(1), [1; 32], ttl, true, now),
    );
    assert!(matches!(f, Frame::Registered { .. }), "{f:?}");
}

/// A revoked node gets no fresh token from the control plane: the relay cuts it when the token
/// it has expires, and refuses that token from then on; a live node renews its registration
/// with each fresh token and keeps relaying.
#[test]
fn a_revoked_nodes_token_is_refused_after_expiry_and_a_live_node_keeps_working_across_renewals() {
    let t0 = Instant::now();
    let mut c = core(Limits::default(), t0);
    let (live, revoked) = ([1; 32], [2; 32]);
    let (live_pk, revoked_pk) = (public_key(&live), public_key(&revoked));
    let start = at(t0, 0);
    let expires = start.unix() + TOKEN_TTL_SECS;
    let revoked_token = token(&revoked_pk, expires);
    let ttl = TOKEN_TTL_SECS as u64;
    let mut s = 0;
    while s <= ttl + 60 {
        // The live node registers again every 20 s with the token of its last heartbeat.
        let now = at(t0, s);
        let fresh = token(&live_pk, now.unix() + TOKEN_TTL_SECS);
        let (_, f) = open(live, register_token(&mut c, udp(1), live, fresh, true, now));
        assert!(matches!(f, Frame::Registered { .. }), "at {s} s: {f:?}");
        if s < ttl {
            // The revoked node keeps its registration while its last token lives.
            let t = revoked_token.clone();
            let (_, f) = open(
                revoked,
                register_token(&mut c, udp(2), revoked, t, true, now),
            );
            assert!(matches!(f, Frame::Registered { .. }), "at {s} s: {f:?}");
            assert!(matches!(
                handle_send(&mut c, &prefix(&revoked_pk), 10, udp(1), now),
                Some(Transmit::Forward { .. })
            ));
        }
        s += 20;
    }
    // Its last registration was at ttl - 20 s with a lease of 60 s: the token ends it sooner.
    let after = at(t0, ttl + 1);
    assert!(matches!(
        answer(handle_send(&mut c, &prefix(&live_pk), 10, udp(2), after)),
        Frame::Refused {
            code: RefuseCode::NotRegistered,
            ..
        }
    ));
    let (_, f) = open(
        live,
        answer(handle_send(&mut c, &prefix(&revoked_pk), 10, udp(1), after)),
    );
    assert_eq!(
        f,
        Frame::PeerGone {
            dst: prefix(&revoked_pk)
        }
    );
    // And its token is refused from then on.
    let (_, f) = open(
        revoked,
        register_token(&mut c, udp(2), revoked, revoked_token, true, after),
    );
    assert!(
        matches!(
            f,
            Frame::Refused {
                code: RefuseCode::Expired,
                ..
            }
        ),
        "{f:?}"
    );
}

#[test]
fn a_registration_ends_with_its_token_unless_renewed() {
    let t0 = Instant::now();
    let mut c = core(Limits::default(), t0);
    let now = at(t0, 0);
    let (a, b) = (public_key(&[1; 32]), public_key(&[2; 32]));
    let (ta, tb) = (token(&a, now.unix() + 30), token(&b, now.unix() + 30));
    register_token(&mut c, udp(1), [1; 32], ta, true, now);
    register_token(&mut c, udp(2), [2; 32], tb, true, now);
    // Node 2 renews at 20 s with a fresh token; node 1 does not.
    let renew = at(t0, 20);
    let tb = token(&b, renew.unix() + 600);
    register_token(&mut c, udp(2), [2; 32], tb, true, renew);
    let later = at(t0, 31);
    assert!(matches!(
        answer(handle_send(&mut c, &prefix(&b), 10, udp(1), later)),
        Frame::Refused {
            code: RefuseCode::NotRegistered,
            ..
        }
    ));
    assert!(matches!(
        handle_send(&mut c, &[0xEE; 8], 10, udp(2), later),
        Some(Transmit::Frame(_))
    ));
    c.handle_timeout(later.at);
    assert_eq!(
        c.registered(),
        1,
        "the lease was 60 s, the token 30 s: the token ended it"
    );
}
