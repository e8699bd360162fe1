//! The relay client against a tiny relay stand-in on loopback, built from the wire codecs: it
//! checks the proof and the token like a relay, and echoes `send` back as `recv`.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use plexsphere_wire::reach::relay::FrameKey;
use plexsphere_wire::reach::{public_key, shared_secret};

use super::*;

const RELAY_SECRET: [u8; 32] = [0x52; 32];
const NODE_SECRET: [u8; 32] = [0x4e; 32];

/// `frame` sealed by the relay for the node (as a relay answers a sealed registration).
fn sealed(counter: u64, frame: Frame) -> Frame {
    FrameKey::new(&shared_secret(&RELAY_SECRET, &public_key(&NODE_SECRET))).seal(counter, &frame)
}

/// Answers hello with a challenge, a register with a good sealed proof and the expected token
/// with registered (else refused), send with recv from the destination, ping with pong; what a
/// relay seals, sealed.
fn stand_in(token: Vec<u8>) -> (SocketAddr, Arc<AtomicBool>, thread::JoinHandle<()>) {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let addr = s.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let t = thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let cookie = [0xC0; 32];
        let mut counter = 0;
        let mut seal = |f: Frame| {
            counter += 1;
            sealed(counter, f)
        };
        while !st.load(Ordering::Relaxed) {
            let Ok((n, from)) = s.recv_from(&mut buf) else {
                continue;
            };
            let answer = match Frame::from_datagram(&buf[..n]) {
                Ok(Frame::Hello { .. }) => Frame::Challenge { cookie },
                Ok(Frame::Register {
                    node,
                    cookie: c,
                    proof,
                    token: t,
                }) => {
                    let shared = shared_secret(&RELAY_SECRET, &node);
                    if !relay::sealed_proof_matches(&shared, &c, &node, &proof) || c != cookie {
                        Frame::Refused {
                            code: RefuseCode::BadProof,
                            reason: "bad proof".into(),
                        }
                    } else if t != token {
                        seal(Frame::Refused {
                            code: RefuseCode::Expired,
                            reason: "the token expired".into(),
                        })
                    } else {
                        seal(Frame::Registered { lease_secs: 60 })
                    }
                }
                Ok(Frame::Send { dst, payload }) => Frame::Recv { src: dst, payload },
                Ok(Frame::Ping { nonce }) => seal(Frame::Pong { nonce }),
                _ => continue,
            };
            let _ = s.send_to(&answer.to_datagram(), from);
        }
    });
    (addr, stop, t)
}

/// Everything `conn` queued since the last drain: its frames, then its notes.
fn drain(conn: &mut RelayConn) -> (Vec<Frame>, Vec<Note>) {
    let out = std::iter::from_fn(|| conn.poll_transmit()).collect();
    let notes = std::iter::from_fn(|| conn.poll_note()).collect();
    (out, notes)
}

/// `conn.handle_timeout` at `now`, and what it queued.
fn timeout(conn: &mut RelayConn, id: &Identity, now: Instant) -> (Vec<Frame>, Vec<Note>) {
    conn.handle_timeout(id, now);
    drain(conn)
}

/// `conn.handle_frame`, and what it queued.
fn frame_in(
    conn: &mut RelayConn,
    frame: Frame,
    id: &Identity,
    now: Instant,
) -> (Vec<Frame>, Vec<Note>) {
    conn.handle_frame(frame, id, now);
    drain(conn)
}

/// Drives `conn` over a real socket until `done` says so (bounded).
fn drive(
    conn: &mut RelayConn,
    id: &Identity,
    sock: &UdpSocket,
    relay: SocketAddr,
    mut done: impl FnMut(&RelayConn, &[Note]) -> bool,
) -> Vec<Note> {
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        let (out, notes) = timeout(conn, id, Instant::now());
        all.extend(notes);
        for f in out {
            sock.send_to(&f.to_datagram(), relay).unwrap();
        }
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            let (out, notes) = frame_in(
                conn,
                Frame::from_datagram(&buf[..n]).unwrap(),
                id,
                Instant::now(),
            );
            all.extend(notes);
            for f in out {
                sock.send_to(&f.to_datagram(), relay).unwrap();
            }
        }
        if done(conn, &all) {
            return all;
        }
    }
    panic!("not done within 10 s: {all:?}");
}

/// A connection to "r1" holding the token `t`, idle at `t0`.
fn with_token(t0: Instant) -> RelayConn {
    RelayConn::new(
        "r1".into(),
        public_key(&RELAY_SECRET),
        Some(b"t".to_vec()),
        t0,
    )
}

/// A connection that registered with a good proof (sealed `registered` with `counter`, a
/// 60 s lease) at `t0`.
fn up(id: &Identity, t0: Instant, counter: u64) -> RelayConn {
    let mut conn = with_token(t0);
    timeout(&mut conn, id, t0);
    let (out, _) = frame_in(&mut conn, Frame::Challenge { cookie: [1; 32] }, id, t0);
    match &out[..] {
        [Frame::Register { node, proof, .. }] => {
            let shared = shared_secret(&RELAY_SECRET, node);
            assert!(relay::sealed_proof_matches(&shared, &[1; 32], node, proof));
        }
        other => panic!("{other:?}"),
    }
    let (_, notes) = frame_in(
        &mut conn,
        sealed(counter, Frame::Registered { lease_secs: 60 }),
        id,
        t0,
    );
    assert!(matches!(notes[..], [Note::Up { .. }]), "{notes:?}");
    conn
}

#[test]
fn registers_with_proof_and_token_then_relays_and_measures_the_rtt() {
    let token = br#"{"payload":"x"}"#.to_vec();
    let (relay, stop, t) = stand_in(token.clone());
    let id = Identity::new(NODE_SECRET);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut conn = RelayConn::new(
        "r1".into(),
        public_key(&RELAY_SECRET),
        Some(token),
        Instant::now(),
    );
    // Queued before the registration, sent once it completes.
    conn.handle_send(PublicKey([9; 32]), b"early".to_vec(), Instant::now());
    assert_eq!(conn.poll_transmit(), None);
    let notes = drive(&mut conn, &id, &sock, relay, |_, n| {
        n.iter().any(|x| matches!(x, Note::Recv { .. }))
    });
    assert!(matches!(notes[0], Note::Up { .. }), "{notes:?}");
    assert!(notes.contains(&Note::Recv {
        src: [9; 8],
        payload: b"early".to_vec()
    }));
    assert!(conn.is_up());
    // The ping that went out with the flush is answered: the RTT is known.
    drive(&mut conn, &id, &sock, relay, |c, _| c.rtt().is_some());
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
}

#[test]
fn an_expired_token_waits_for_a_fresh_one_and_then_registers() {
    let good = b"fresh".to_vec();
    let (relay, stop, t) = stand_in(good.clone());
    let id = Identity::new(NODE_SECRET);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut conn = RelayConn::new(
        "r1".into(),
        public_key(&RELAY_SECRET),
        Some(b"old".to_vec()),
        Instant::now(),
    );
    let notes = drive(&mut conn, &id, &sock, relay, |_, n| !n.is_empty());
    match &notes[0] {
        Note::Down { why, .. } => assert!(why.contains("waiting for a fresh token"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Down for good: polling sends nothing, however long.
    let (out, _) = timeout(&mut conn, &id, Instant::now() + Duration::from_secs(3600));
    assert!(out.is_empty());
    conn.handle_token(good);
    let notes = drive(&mut conn, &id, &sock, relay, |_, n| !n.is_empty());
    assert!(matches!(notes[0], Note::Up { .. }), "{notes:?}");
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
}

#[test]
fn a_silent_relay_is_down_after_give_up_and_retried_later_and_pings_are_answered() {
    let id = Identity::new(NODE_SECRET);
    let t0 = Instant::now();
    let mut conn = with_token(t0);
    let (out, _) = timeout(&mut conn, &id, t0);
    assert_eq!(out, vec![Frame::Hello { node: id.public }]);
    // Retried every ANSWER_WITHIN, down at GIVE_UP.
    let (out, _) = timeout(&mut conn, &id, t0 + ANSWER_WITHIN);
    assert_eq!(out.len(), 1);
    let (_, notes) = timeout(&mut conn, &id, t0 + GIVE_UP);
    assert!(
        matches!(
            &notes[..],
            [Note::Down {
                unanswered: true,
                ..
            }]
        ),
        "{notes:?}"
    );
    assert!(conn.is_down());
    let (out, _) = timeout(&mut conn, &id, t0 + GIVE_UP + RETRY_AFTER);
    assert_eq!(out, vec![Frame::Hello { node: id.public }]);
    let (out, _) = frame_in(&mut conn, Frame::Ping { nonce: [3; 8] }, &id, t0);
    assert_eq!(out, vec![Frame::Pong { nonce: [3; 8] }]);
    // An unregistered node's sends queue, bounded.
    for _ in 0..(MAX_QUEUED + 5) {
        conn.handle_send(PublicKey([1; 32]), vec![1], t0);
        assert!(conn.poll_transmit().is_none());
    }
    assert_eq!(conn.queue.len(), MAX_QUEUED);
}

#[test]
fn an_up_relay_that_goes_silent_is_down_within_seconds_not_at_the_lease_end() {
    let id = Identity::new(NODE_SECRET);
    let t0 = Instant::now();
    let mut conn = up(&id, t0, 1);
    // Keepalive pings go out while it answers, and answers keep it up.
    let (out, notes) = timeout(&mut conn, &id, t0 + KEEPALIVE);
    assert!(
        out.iter().any(|f| matches!(f, Frame::Ping { .. })),
        "{out:?}"
    );
    assert!(notes.is_empty());
    frame_in(
        &mut conn,
        sealed(2, Frame::Pong { nonce: [0; 8] }),
        &id,
        t0 + KEEPALIVE,
    );
    let (_, notes) = timeout(
        &mut conn,
        &id,
        t0 + KEEPALIVE + SILENT_DOWN - Duration::from_millis(1),
    );
    assert!(notes.is_empty(), "still heard recently: {notes:?}");
    // Then silence: down once nothing was heard for SILENT_DOWN, long before the lease ends.
    let (_, notes) = timeout(&mut conn, &id, t0 + KEEPALIVE + SILENT_DOWN);
    match &notes[..] {
        [Note::Down { why, .. }] => assert!(why.contains("stopped answering"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(SILENT_DOWN < Duration::from_secs(60));
    assert!(conn.is_down());
}

#[test]
fn outputs_nobody_drains_stop_at_max_outputs_and_the_oldest_stay() {
    let id = Identity::new(NODE_SECRET);
    let t0 = Instant::now();
    let mut conn = up(&id, t0, 1);
    let dst = PublicKey([1; 32]);
    for i in 0..(MAX_OUTPUTS + 10) {
        conn.handle_send(dst, i.to_be_bytes().to_vec(), t0);
        let recv = Frame::Recv {
            src: [2; 8],
            payload: i.to_be_bytes().to_vec(),
        };
        conn.handle_frame(recv, &id, t0);
    }
    let (out, notes) = drain(&mut conn);
    assert_eq!((out.len(), notes.len()), (MAX_OUTPUTS, MAX_OUTPUTS));
    assert_eq!(conn.dropped_outputs, 20);
    let last = (MAX_OUTPUTS - 1).to_be_bytes().to_vec();
    assert_eq!(
        out.last(),
        Some(&Frame::Send {
            dst: relay::prefix(&dst),
            payload: last.clone(),
        })
    );
    assert_eq!(
        notes.last(),
        Some(&Note::Recv {
            src: [2; 8],
            payload: last,
        })
    );
    // Drained, it queues again.
    conn.handle_send(dst, vec![7], t0);
    assert!(conn.poll_transmit().is_some());
}

/// Polls `conn` just before its next deadline (nothing happens) and at it (something does);
/// answers that time and what the poll there gave.
fn step(conn: &mut RelayConn, id: &Identity) -> (Instant, Vec<Frame>, Vec<Note>) {
    let at = conn.poll_timeout().expect("a deadline");
    let (out, notes) = timeout(conn, id, at - Duration::from_millis(1));
    assert!(
        out.is_empty() && notes.is_empty(),
        "early: {out:?} {notes:?}"
    );
    let (out, notes) = timeout(conn, id, at);
    assert!(
        !(out.is_empty() && notes.is_empty()),
        "nothing at the deadline"
    );
    (at, out, notes)
}

#[test]
fn poll_timeout_names_every_retry_keepalive_and_give_up_and_nothing_is_due_before_it() {
    let id = Identity::new(NODE_SECRET);
    let t0 = Instant::now();
    let mut conn = with_token(t0);
    // Idle with a token: due at once.
    assert!(conn.poll_timeout().is_some_and(|at| at <= t0));
    let (out, _) = timeout(&mut conn, &id, t0);
    assert_eq!(out, vec![Frame::Hello { node: id.public }]);
    // A silent relay: a hello every ANSWER_WITHIN, down at GIVE_UP, a hello RETRY_AFTER later.
    let mut hellos = Vec::new();
    while !conn.is_down() {
        let (at, out, _) = step(&mut conn, &id);
        if !out.is_empty() {
            hellos.push(at - t0);
        }
    }
    assert_eq!(
        hellos,
        vec![ANSWER_WITHIN, ANSWER_WITHIN * 2, ANSWER_WITHIN * 3]
    );
    let (at, out, _) = step(&mut conn, &id);
    assert_eq!(at, t0 + GIVE_UP + RETRY_AFTER);
    assert_eq!(out, vec![Frame::Hello { node: id.public }]);
    // Up: a keepalive every KEEPALIVE, down once nothing was heard for SILENT_DOWN.
    frame_in(&mut conn, Frame::Challenge { cookie: [1; 32] }, &id, at);
    frame_in(
        &mut conn,
        sealed(1, Frame::Registered { lease_secs: 60 }),
        &id,
        at,
    );
    assert!(conn.is_up());
    let up = at;
    let mut pings = Vec::new();
    while conn.is_up() {
        let (t, out, _) = step(&mut conn, &id);
        if out.iter().any(|f| matches!(f, Frame::Ping { .. })) {
            pings.push(t - up);
        }
    }
    assert_eq!(pings, vec![KEEPALIVE, KEEPALIVE * 2, KEEPALIVE * 3]);
    assert_eq!(conn.poll_timeout(), Some(up + SILENT_DOWN + RETRY_AFTER));
    // Refused for its token: nothing planned until a new token comes.
    let expired = Frame::Refused {
        code: RefuseCode::Expired,
        reason: "expired".into(),
    };
    frame_in(&mut conn, sealed(2, expired), &id, up + SILENT_DOWN);
    assert!(conn.is_down());
    assert_eq!(conn.poll_timeout(), None);
}

#[test]
fn poll_timeout_of_an_up_connection_says_when_to_register_again() {
    let id = Identity::new(NODE_SECRET);
    let t0 = Instant::now();
    let mut conn = up(&id, t0, 1);
    // Answered keepalives keep it up; the hello again is due REREGISTER_SECS after registering.
    let mut counter = 2;
    let at = loop {
        let (at, out, notes) = step(&mut conn, &id);
        assert!(notes.is_empty(), "{notes:?}");
        if out.iter().any(|f| matches!(f, Frame::Hello { .. })) {
            break at;
        }
        frame_in(
            &mut conn,
            sealed(counter, Frame::Pong { nonce: [0; 8] }),
            &id,
            at,
        );
        counter += 1;
    };
    assert_eq!(at, t0 + Duration::from_secs(REREGISTER_SECS));
    // Registered again; a new token makes the next hello due at once.
    frame_in(
        &mut conn,
        sealed(counter, Frame::Registered { lease_secs: 60 }),
        &id,
        at,
    );
    assert!(conn.poll_timeout().is_some_and(|d| d > at));
    conn.handle_token(b"t2".to_vec());
    assert!(conn.poll_timeout().is_some_and(|d| d <= at));
    let (out, _) = timeout(&mut conn, &id, at);
    assert!(
        out.iter().any(|f| matches!(f, Frame::Hello { .. })),
        "{out:?}"
    );
}

mod seal;
