//! The state machine against boringtun's `Tunn` (the oracle, in both roles) and against
//! itself, with the stepped clock for the timers.

use super::*;
use boringtun::noise::Tunn;
use boringtun::x25519::PublicKey;

fn key(b: u8) -> (StaticSecret, [u8; 32]) {
    let s = StaticSecret::from([b; 32]);
    let p = PublicKey::from(&s).to_bytes();
    (s, p)
}

fn limiter(public: &[u8; 32], limit: u64) -> Arc<RateLimiter> {
    Arc::new(RateLimiter::new(&PublicKey::from(*public), limit))
}

/// A tunnel as the device builds one: the OS's random source and both clocks read now.
fn tunnel(
    private: StaticSecret,
    peer: [u8; 32],
    psk: Option<[u8; 32]>,
    index: u32,
    rate_limiter: Arc<RateLimiter>,
) -> Tunnel {
    let rng = Box::new(rand_core::OsRng);
    Tunnel::new(private, peer, psk, index, rate_limiter, rng, Now::system())
}

/// Ours as `a` (index 1), and `b`'s keys.
fn ours(psk: Option<[u8; 32]>) -> (Tunnel, StaticSecret, [u8; 32]) {
    let (sa, pa) = key(1);
    let (sb, pb) = key(2);
    (tunnel(sa, pb, psk, 1, limiter(&pa, 100)), sb, pa)
}

fn ipv4(src: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 20 + payload.len()];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&[10, 0, 0, 9]);
    p[20..].copy_from_slice(payload);
    p
}

fn net(out: Result<Output, NoiseError>, buf: &[u8]) -> Vec<u8> {
    match out {
        Ok(Output::Network(n)) => buf[..n].to_vec(),
        other => panic!("expected a message for the network, got {other:?}"),
    }
}

#[test]
fn our_initiator_and_boringtuns_responder_carry_packets_both_ways() {
    let now = Instant::now();
    let (mut a, sb, pa) = ours(Some([4; 32]));
    let (_, pb) = key(2);
    let mut b = Tunn::new(
        sb,
        PublicKey::from(pa),
        Some([4; 32]),
        None,
        2,
        Some(limiter(&pb, 100)),
    );
    let mut buf = vec![0u8; 2048];
    let mut bbuf = vec![0u8; 2048];
    let p1 = ipv4([10, 0, 0, 1], b"first");
    let init = net(a.encapsulate(now, &p1, &mut buf), &buf);
    assert_eq!(
        init[0], INITIATION,
        "no session: the packet waits, an initiation leaves"
    );
    let TunnResult::WriteToNetwork(resp) = b.decapsulate(None, &init, &mut bbuf) else {
        panic!("boringtun did not answer our initiation");
    };
    let resp = resp.to_vec();
    let ka = net(a.decapsulate(now, None, &resp, &mut buf), &buf);
    assert_eq!(
        ka.len(),
        DATA_MIN,
        "the session is confirmed with a keepalive"
    );
    assert!(matches!(
        b.decapsulate(None, &ka, &mut bbuf),
        TunnResult::Done
    ));
    let queued = a
        .next_queued(now, &mut buf)
        .expect("the queued packet leaves now");
    match b.decapsulate(None, &buf[..queued], &mut bbuf) {
        TunnResult::WriteToTunnelV4(p, _) => assert_eq!(p, &p1[..]),
        _ => panic!("boringtun did not open our data"),
    }
    assert!(a.next_queued(now, &mut buf).is_none());
    let p2 = ipv4([10, 0, 0, 2], b"answer, longer than the first");
    let TunnResult::WriteToNetwork(d) = b.encapsulate(&p2, &mut bbuf) else {
        panic!("boringtun has a session");
    };
    let d = d.to_vec();
    assert_eq!(
        a.decapsulate(now, None, &d, &mut buf),
        Ok(Output::Tunnel(
            p2.len(),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))
        ))
    );
    assert_eq!(&buf[..p2.len()], &p2[..]);
    assert_eq!(
        a.decapsulate(now, None, &d, &mut buf),
        Err(NoiseError::Replay)
    );
}

#[test]
fn boringtuns_initiator_and_our_responder_carry_packets_both_ways() {
    let now = Instant::now();
    let (sa, pa) = key(1);
    let (sb, pb) = key(2);
    let mut a = Tunn::new(
        sa,
        PublicKey::from(pb),
        None,
        None,
        1,
        Some(limiter(&pa, 100)),
    );
    let mut b = tunnel(sb, pa, None, 2, limiter(&pb, 100));
    let mut abuf = vec![0u8; 2048];
    let mut buf = vec![0u8; 2048];
    let TunnResult::WriteToNetwork(init) = a.format_handshake_initiation(&mut abuf, false) else {
        panic!("initiation");
    };
    let init = init.to_vec();
    let resp = net(b.decapsulate(now, None, &init, &mut buf), &buf);
    assert_eq!(resp[0], RESPONSE);
    let p = ipv4([10, 0, 0, 2], b"not before the initiator confirms");
    let again = net(b.encapsulate(now, &p, &mut buf), &buf);
    assert_eq!(
        again[0], INITIATION,
        "the responder does not send on an unconfirmed session"
    );
    let TunnResult::WriteToNetwork(ka) = a.decapsulate(None, &resp, &mut abuf) else {
        panic!("boringtun confirms with a keepalive");
    };
    let ka = ka.to_vec();
    assert_eq!(b.decapsulate(now, None, &ka, &mut buf), Ok(Output::Done));
    assert!(b.has_session(now), "confirmed");
    let n = b
        .next_queued(now, &mut buf)
        .expect("the waiting packet leaves");
    match a.decapsulate(None, &buf[..n], &mut abuf) {
        TunnResult::WriteToTunnelV4(got, _) => assert_eq!(got, &p[..]),
        _ => panic!("boringtun did not open it"),
    }
    let back = ipv4([10, 0, 0, 1], b"and back");
    let TunnResult::WriteToNetwork(d) = a.encapsulate(&back, &mut abuf) else {
        panic!("data");
    };
    let d = d.to_vec();
    assert!(matches!(
        b.decapsulate(now, None, &d, &mut buf),
        Ok(Output::Tunnel(..))
    ));
    assert_eq!(
        b.decapsulate(now, None, &init, &mut buf),
        Err(NoiseError::ReplayedInitiation),
        "a replayed initiation makes no session"
    );
}

/// Two of ours, `a` initiating; answers (a, b).
fn pair(now: Instant) -> (Tunnel, Tunnel) {
    let (mut a, sb, pa) = ours(None);
    let (_, pb) = key(2);
    let mut b = tunnel(sb, pa, None, 2, limiter(&pb, 100));
    let mut buf = vec![0u8; 256];
    let init = net(a.encapsulate(now, &[], &mut buf), &buf);
    let resp = net(b.decapsulate(now, None, &init, &mut buf), &buf);
    let ka = net(a.decapsulate(now, None, &resp, &mut buf), &buf);
    assert_eq!(b.decapsulate(now, None, &ka, &mut buf), Ok(Output::Done));
    (a, b)
}

/// Both sides initiate at once and each answers the other's initiation before its own
/// response arrives: each must still receive on the session it answered (the peer sends on
/// it until it sees the other), and data flows both ways on the first try.
#[test]
fn simultaneous_initiations_leave_both_sides_able_to_talk() {
    let now = Instant::now();
    let (mut a, sb, pa) = ours(None);
    let (_, pb) = key(2);
    let mut b = tunnel(sb, pa, None, 2, limiter(&pb, 100));
    let mut buf = vec![0u8; 256];
    let init_a = net(
        a.encapsulate(now, &ipv4([10, 0, 0, 1], b"from a"), &mut buf),
        &buf,
    );
    let init_b = net(
        b.encapsulate(now, &ipv4([10, 0, 0, 2], b"from b"), &mut buf),
        &buf,
    );
    let resp_a = net(a.decapsulate(now, None, &init_b, &mut buf), &buf);
    let resp_b = net(b.decapsulate(now, None, &init_a, &mut buf), &buf);
    let ka = net(a.decapsulate(now, None, &resp_b, &mut buf), &buf);
    let kb = net(b.decapsulate(now, None, &resp_a, &mut buf), &buf);
    assert_eq!(b.decapsulate(now, None, &ka, &mut buf), Ok(Output::Done));
    assert_eq!(a.decapsulate(now, None, &kb, &mut buf), Ok(Output::Done));
    let qa = a.next_queued(now, &mut buf).expect("a's packet leaves");
    let qa = buf[..qa].to_vec();
    let qb = b.next_queued(now, &mut buf).expect("b's packet leaves");
    let qb = buf[..qb].to_vec();
    assert!(matches!(
        b.decapsulate(now, None, &qa, &mut buf),
        Ok(Output::Tunnel(..))
    ));
    assert_eq!(&buf[20..26], b"from a");
    assert!(matches!(
        a.decapsulate(now, None, &qb, &mut buf),
        Ok(Output::Tunnel(..))
    ));
    assert_eq!(&buf[20..26], b"from b");
    // a rekeys while b still sends on the session a answered: that one stays receivable
    // until b moves to the new session.
    a.rekey_wanted = true;
    let t1 = now + Duration::from_secs(1);
    let init = net(a.update_timers(t1, &mut buf), &buf);
    let resp = net(b.decapsulate(t1, None, &init, &mut buf), &buf);
    let in_flight = net(
        b.encapsulate(t1, &ipv4([10, 0, 0, 2], b"in flight"), &mut buf),
        &buf,
    );
    net(a.decapsulate(t1, None, &resp, &mut buf), &buf);
    assert!(
        matches!(
            a.decapsulate(t1, None, &in_flight, &mut buf),
            Ok(Output::Tunnel(..))
        ),
        "b's packet sent before it saw a's new session still opens"
    );
}

#[test]
fn data_opened_out_of_order_within_the_window_is_delivered_once() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    let mut msgs = Vec::new();
    for i in 0..5u8 {
        let mut buf = vec![0u8; 256];
        let n = match a.encapsulate(now, &ipv4([10, 0, 0, 1], &[i; 10]), &mut buf) {
            Ok(Output::Network(n)) => n,
            other => panic!("{other:?}"),
        };
        buf.truncate(n);
        msgs.push(buf);
    }
    let mut out = vec![0u8; 256];
    for i in [4, 0, 2, 1, 3] {
        assert!(matches!(
            b.decapsulate(now, None, &msgs[i], &mut out),
            Ok(Output::Tunnel(30, _))
        ));
        assert_eq!(out[20], i as u8);
    }
    for m in &msgs {
        assert_eq!(
            b.decapsulate(now, None, m, &mut out),
            Err(NoiseError::Replay)
        );
    }
    let mut forged = msgs[0].clone();
    forged[8] = 99; // another counter: the nonce no longer matches
    assert_eq!(
        b.decapsulate(now, None, &forged, &mut out),
        Err(NoiseError::Decrypt)
    );
    let mut bad_index = msgs[0].clone();
    bad_index[4] ^= 1;
    assert_eq!(
        b.decapsulate(now, None, &bad_index, &mut out),
        Err(NoiseError::UnknownSession)
    );
}

#[test]
fn the_split_path_opens_elsewhere_and_finishes_in_order() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    let (keys, counter) = a.reserve_send(now, false).expect("session");
    let p = ipv4([10, 0, 0, 1], b"sealed on a worker");
    let mut msg = vec![0u8; 256];
    let n = seal_data(&keys, counter, &p, &mut msg);
    let ticket = b.open_check(now, &msg[..n]).expect("fresh");
    let mut body = msg[DATA_HEADER..n].to_vec();
    let len = ticket
        .keys
        .recv
        .open(ticket.counter, &[], &mut body)
        .expect("opens");
    assert_eq!(
        b.open_finish(now, &ticket, &body[..len]),
        Ok(Output::Tunnel(
            p.len(),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))
        ))
    );
    assert_eq!(
        b.open_finish(now, &ticket, &body[..len]),
        Err(NoiseError::Replay)
    );
    let mut body = vec![0u8; 256];
    let padded = [&p[..], &[0u8; 12]].concat();
    let (keys, counter) = a.reserve_send(now, false).expect("session");
    let n = seal_data(&keys, counter, &padded, &mut msg);
    assert_eq!(
        b.decapsulate(now, None, &msg[..n], &mut body),
        Ok(Output::Tunnel(
            p.len(),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))
        )),
        "padding is cut to the IP length"
    );
    let (keys, counter) = a.reserve_send(now, false).expect("session");
    let n = seal_data(&keys, counter, b"\x45not an ip packet", &mut msg);
    assert_eq!(
        b.decapsulate(now, None, &msg[..n], &mut body),
        Err(NoiseError::BadPacket)
    );
}

#[test]
fn initiations_are_retried_then_given_up_and_their_queue_dropped() {
    let t0 = Instant::now();
    let (mut a, _, _) = ours(None);
    let mut buf = vec![0u8; 256];
    let first = net(
        a.encapsulate(t0, &ipv4([10, 0, 0, 1], b"x"), &mut buf),
        &buf,
    );
    assert_eq!(first[0], INITIATION);
    assert_eq!(
        a.encapsulate(
            t0 + Duration::from_secs(1),
            &ipv4([10, 0, 0, 1], b"y"),
            &mut buf
        ),
        Ok(Output::Done),
        "one initiation per REKEY_TIMEOUT"
    );
    assert_eq!(
        a.update_timers(t0 + Duration::from_secs(4), &mut buf),
        Ok(Output::Done)
    );
    let retry = net(
        a.update_timers(t0 + Duration::from_millis(5_400), &mut buf),
        &buf,
    );
    assert_eq!(retry[0], INITIATION);
    assert_ne!(
        retry[4..8],
        first[4..8],
        "a retry is a new initiation with a new index"
    );
    assert_eq!(a.queue.len(), 2);
    assert_eq!(
        a.update_timers(t0 + REKEY_ATTEMPT_TIME, &mut buf),
        Ok(Output::Done)
    );
    assert!(a.queue.is_empty(), "given up after REKEY_ATTEMPT_TIME");
    assert!(a.handshake.is_none());
}

#[test]
fn keepalives_rekeys_and_the_key_wipe_follow_the_clock() {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(t0);
    let mut buf = vec![0u8; 256];
    // b got data and sent nothing: a keepalive after KEEPALIVE_TIMEOUT.
    let m = net(
        a.encapsulate(t0, &ipv4([10, 0, 0, 1], b"d"), &mut buf),
        &buf,
    );
    assert!(matches!(
        b.decapsulate(t0, None, &m, &mut buf),
        Ok(Output::Tunnel(..))
    ));
    assert_eq!(
        b.update_timers(t0 + Duration::from_secs(9), &mut buf),
        Ok(Output::Done)
    );
    let ka = net(b.update_timers(t0 + KEEPALIVE_TIMEOUT, &mut buf), &buf);
    assert_eq!(ka.len(), DATA_MIN);
    assert_eq!(
        b.update_timers(t0 + Duration::from_secs(11), &mut buf),
        Ok(Output::Done),
        "once"
    );
    // a sent data and heard nothing for KEEPALIVE + REKEY_TIMEOUT: a new handshake.
    let late = net(
        a.update_timers(t0 + Duration::from_secs(15), &mut buf),
        &buf,
    );
    assert_eq!(late[0], INITIATION);

    // The initiator rekeys after REKEY_AFTER_TIME when it sends.
    let (mut a, _) = pair(t0);
    let t = t0 + REKEY_AFTER_TIME;
    assert!(matches!(
        a.encapsulate(t, &ipv4([10, 0, 0, 1], b"d"), &mut buf),
        Ok(Output::Network(_))
    ));
    let rekey = net(a.update_timers(t, &mut buf), &buf);
    assert_eq!(rekey[0], INITIATION);
    // Data received late in the initiator's session asks for a new one, once.
    let (mut a, mut b) = pair(t0);
    let late = t0 + REJECT_AFTER_TIME - KEEPALIVE_TIMEOUT - REKEY_TIMEOUT;
    let m = net(
        b.encapsulate(late, &ipv4([10, 0, 0, 2], b"d"), &mut buf),
        &buf,
    );
    assert!(matches!(
        a.decapsulate(late, None, &m, &mut buf),
        Ok(Output::Tunnel(..))
    ));
    let init = net(a.update_timers(late, &mut buf), &buf);
    assert_eq!(init[0], INITIATION);
    let m = net(
        b.encapsulate(late, &ipv4([10, 0, 0, 2], b"e"), &mut buf),
        &buf,
    );
    assert!(matches!(
        a.decapsulate(late, None, &m, &mut buf),
        Ok(Output::Tunnel(..))
    ));
    let resp = net(b.decapsulate(late, None, &init, &mut buf), &buf);
    net(a.decapsulate(late, None, &resp, &mut buf), &buf);
    assert!(!a.rekey_wanted, "the new session asks for nothing");
    assert_eq!(a.update_timers(late, &mut buf), Ok(Output::Done));
    // Sessions die at REJECT_AFTER_TIME, every key after three times that.
    let (mut a, _) = pair(t0);
    assert!(a.has_session(t0 + REJECT_AFTER_TIME - Duration::from_secs(1)));
    assert!(!a.has_session(t0 + REJECT_AFTER_TIME));
    let _ = a.update_timers(t0 + REJECT_AFTER_TIME * 3, &mut buf);
    assert!(a.current.is_none() && a.previous.is_none() && a.last_handshake.is_none());
}

#[test]
fn a_responder_keeps_the_old_session_until_the_new_one_is_confirmed() {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(t0);
    let mut buf = vec![0u8; 256];
    // a rekeys: b answers, but keeps sending on the old session until a's data arrives.
    let t1 = t0 + Duration::from_secs(130);
    a.rekey_wanted = true;
    let init = net(a.update_timers(t1, &mut buf), &buf);
    let old_local = b.current.as_ref().map(|s| s.keys.local_index);
    let resp = net(b.decapsulate(t1, None, &init, &mut buf), &buf);
    assert_eq!(b.current.as_ref().map(|s| s.keys.local_index), old_local);
    let on_old = net(
        b.encapsulate(t1, &ipv4([10, 0, 0, 2], b"old"), &mut buf),
        &buf,
    );
    assert!(matches!(
        a.decapsulate(t1, None, &on_old, &mut buf),
        Ok(Output::Tunnel(..))
    ));
    let ka = net(a.decapsulate(t1, None, &resp, &mut buf), &buf);
    assert_eq!(b.decapsulate(t1, None, &ka, &mut buf), Ok(Output::Done));
    assert_ne!(
        b.current.as_ref().map(|s| s.keys.local_index),
        old_local,
        "confirmed"
    );
    assert!(
        matches!(
            a.decapsulate(t1, None, &on_old, &mut buf),
            Err(NoiseError::Replay)
        ),
        "the previous session still answers (here: a replay)"
    );
    // Initiations faster than MIN_INITIATION_INTERVAL are dropped.
    a.rekey_wanted = true;
    let again = net(
        a.update_timers(t1 + Duration::from_millis(10), &mut buf),
        &buf,
    );
    assert_eq!(
        b.decapsulate(t1 + Duration::from_millis(10), None, &again, &mut buf),
        Err(NoiseError::InitiationFlood)
    );
}

#[test]
fn a_loaded_responder_cookie_reaches_our_next_initiation() {
    let now = Instant::now();
    let (mut a, sb, pa) = ours(None);
    let (_, pb) = key(2);
    // A limit of 0: the responder asks every initiation for a cookie.
    let loaded = limiter(&pb, 0);
    let mut b = Tunn::new(sb, PublicKey::from(pa), None, None, 2, Some(loaded.clone()));
    let mut buf = vec![0u8; 256];
    let mut bbuf = vec![0u8; 256];
    let init = net(a.encapsulate(now, &[], &mut buf), &buf);
    let TunnResult::WriteToNetwork(cookie) =
        b.decapsulate(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), &init, &mut bbuf)
    else {
        panic!("a cookie reply");
    };
    let cookie = cookie.to_vec();
    assert_eq!(cookie[0], COOKIE_REPLY);
    assert_eq!(
        a.decapsulate(now, None, &cookie, &mut buf),
        Ok(Output::Done)
    );
    assert!(a.cookie.is_some());
    let mut forged = cookie.clone();
    forged[40] ^= 1;
    assert_eq!(
        a.decapsulate(now, None, &forged, &mut buf),
        Err(NoiseError::Handshake)
    );
    let retry = net(
        a.update_timers(now + Duration::from_secs(6), &mut buf),
        &buf,
    );
    assert_ne!(&retry[132..], &[0u8; 16], "MAC2 carries the cookie");
    assert!(
        matches!(b.decapsulate(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), &retry, &mut bbuf), TunnResult::WriteToNetwork(r) if r[0] == RESPONSE),
        "the loaded responder answers an initiation with a valid cookie"
    );
}

#[test]
fn garbage_of_every_length_and_type_is_refused_without_panic() {
    let now = Instant::now();
    let (mut a, _) = pair(now);
    let mut buf = vec![0u8; 256];
    for len in 0..200 {
        for t in 0..6u8 {
            let mut d = vec![0xa5u8; len];
            if let Some(b) = d.first_mut() {
                *b = t;
            }
            assert!(
                !matches!(
                    a.decapsulate(now, None, &d, &mut buf),
                    Ok(Output::Tunnel(..))
                ),
                "len {len} type {t}"
            );
        }
    }
    let mut small = [0u8; 8];
    assert_eq!(
        a.encapsulate(now, b"x", &mut small),
        Err(NoiseError::Buffer)
    );
}

#[test]
fn our_timestamps_grow_even_within_the_clocks_resolution() {
    let (mut a, _, _) = ours(None);
    let now = Instant::now();
    let t1 = a.next_timestamp(now);
    let t2 = a.next_timestamp(now);
    let t3 = a.next_timestamp(now);
    assert!(t1 < t2 && t2 < t3);
}

/// A tunnel with a seeded random source and a given wall clock, as a test builds one.
fn seeded(seed: u64, clock: Now) -> Tunnel {
    let (sa, pa) = key(1);
    let (_, pb) = key(2);
    let rng = Box::new(plexsphere_test_support::seeded::SeededRng::new(seed));
    Tunnel::new(sa, pb, None, 1, limiter(&pa, 100), rng, clock)
}

/// The random source is the one the tunnel was built with: the same seed and the same inputs
/// give the same initiation byte for byte (ephemeral key, MACs and all), another seed another
/// ephemeral key.
#[test]
fn a_seeded_random_source_gives_the_same_initiation() {
    let clock = Now::new(
        Instant::now(),
        std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    );
    let initiation = |seed| {
        let mut a = seeded(seed, clock);
        let mut buf = vec![0u8; 256];
        net(a.encapsulate(clock.at, &[], &mut buf), &buf)
    };
    let first = initiation(7);
    assert_eq!(first[0], INITIATION);
    assert_eq!(first, initiation(7));
    let other = initiation(8);
    assert_ne!(
        first[8..40],
        other[8..40],
        "another seed, another ephemeral key"
    );
}

/// A failing random source makes no initiation at all (never one with a weak key), and the
/// packet waits in the queue as it would for a handshake in flight.
#[test]
fn a_failing_random_source_makes_no_initiation() {
    let (sa, pa) = key(1);
    let (_, pb) = key(2);
    let rng = Box::new(plexsphere_test_support::seeded::Failing);
    let mut a = Tunnel::new(sa, pb, None, 1, limiter(&pa, 100), rng, Now::system());
    let mut buf = vec![0u8; 256];
    let now = Instant::now();
    assert_eq!(
        a.encapsulate(now, &ipv4([10, 0, 0, 1], b"x"), &mut buf),
        Err(NoiseError::Crypto)
    );
    assert!(a.handshake.is_none(), "nothing in flight");
    assert_eq!(a.queue.len(), 1, "the packet waits for a handshake");
}

/// The initiation carries the wall time the tunnel was handed plus the monotonic time since,
/// as TAI64N, which the responder reads after decrypting it; a later input with an earlier
/// `now` (another thread's) or within the label's resolution still gets a newer timestamp,
/// which the responder takes.
#[test]
fn the_initiation_carries_the_given_wall_time_and_never_an_older_one() {
    let t0 = Instant::now();
    let wall = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut a = seeded(1, Now::new(t0, wall));
    let (sb, pb) = key(2);
    let (_, pa) = key(1);
    let mut b = tunnel(sb, pa, None, 2, limiter(&pb, 100));
    let mut buf = vec![0u8; 256];

    let later = t0 + Duration::from_secs(7);
    let init = net(a.encapsulate(later, &[], &mut buf), &buf);
    net(b.decapsulate(later, None, &init, &mut buf), &buf);
    let first = b.last_timestamp.expect("the responder took the initiation");
    assert_eq!(first, crypto::tai64n(wall + Duration::from_secs(7)));

    // Drop the initiation in flight (as a round given up does) so the next packet starts
    // another at once; it arrives with an earlier `now` than the first, as from another
    // thread.
    a.handshake = None;
    let earlier = t0 + Duration::from_secs(1);
    let init = net(a.encapsulate(earlier, &[], &mut buf), &buf);
    let at_b = later + MIN_INITIATION_INTERVAL;
    net(b.decapsulate(at_b, None, &init, &mut buf), &buf);
    let second = b
        .last_timestamp
        .expect("the responder took the second initiation");
    assert!(
        second > first,
        "never an older timestamp than the last sent"
    );
}
