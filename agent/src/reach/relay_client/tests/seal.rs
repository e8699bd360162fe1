//! What a spoofer who sends from the relay's address can do to a connection: nothing but make
//! it say `hello` again, at most once a second.

use super::*;

#[test]
fn a_spoofed_refused_or_peer_gone_without_a_valid_seal_changes_nothing() {
    let id = Identity::new(NODE_SECRET);
    let t0 = Instant::now();
    let mut conn = up(&id, t0, 10);
    for (i, code) in [
        RefuseCode::Expired,
        RefuseCode::BadToken,
        RefuseCode::Busy,
        RefuseCode::NotRegistered,
        RefuseCode::BadProof,
    ]
    .into_iter()
    .enumerate()
    {
        let t = t0 + Duration::from_millis(i as u64 * 10);
        let spoofed = Frame::Refused {
            code,
            reason: "spoofed".into(),
        };
        let (out, notes) = frame_in(&mut conn, spoofed, &id, t);
        assert!(notes.is_empty(), "{code:?}: {notes:?}");
        assert!(conn.is_up(), "{code:?}");
        // At most a hello, and at most one within HINT_EVERY.
        let hellos = out
            .iter()
            .filter(|f| matches!(f, Frame::Hello { .. }))
            .count();
        assert_eq!(hellos, usize::from(i == 0), "{code:?}: {out:?}");
        assert_eq!(out.len(), hellos, "{out:?}");
    }
    let (_, notes) = frame_in(&mut conn, Frame::PeerGone { dst: [9; 8] }, &id, t0);
    assert!(notes.is_empty(), "{notes:?}");
    // A forged seal (the right shape, a tag under another key) is dropped too.
    let forged = FrameKey::new(&shared_secret(&[0x66; 32], &id.public)).seal(
        99,
        &Frame::Refused {
            code: RefuseCode::Expired,
            reason: "forged".into(),
        },
    );
    let (out, notes) = frame_in(&mut conn, forged, &id, t0);
    assert!(out.is_empty() && notes.is_empty(), "{out:?} {notes:?}");
    assert!(conn.is_up());
    assert_eq!(conn.dropped_unauthentic, 7);
    // The token is kept: the next registration still carries it.
    let (out, _) = frame_in(&mut conn, Frame::Challenge { cookie: [2; 32] }, &id, t0);
    assert!(
        matches!(&out[..], [Frame::Register { token, .. }] if token == b"t"),
        "{out:?}"
    );
}

#[test]
fn a_replayed_sealed_frame_with_an_old_counter_is_ignored() {
    let id = Identity::new(NODE_SECRET);
    let t0 = Instant::now();
    let mut conn = up(&id, t0, 10);
    let gone = sealed(11, Frame::PeerGone { dst: [9; 8] });
    let (_, notes) = frame_in(&mut conn, gone.clone(), &id, t0);
    assert_eq!(notes, vec![Note::PeerGone { dst: [9; 8] }]);
    // The same frame again, and an older one: nothing.
    let (_, notes) = frame_in(&mut conn, gone, &id, t0);
    assert!(notes.is_empty(), "{notes:?}");
    let busy = Frame::Refused {
        code: RefuseCode::Busy,
        reason: "busy".into(),
    };
    let (_, notes) = frame_in(&mut conn, sealed(5, busy.clone()), &id, t0);
    assert!(notes.is_empty(), "{notes:?}");
    assert!(conn.is_up());
    assert_eq!(conn.counter(), 11);
    // A new one counts.
    let (_, notes) = frame_in(&mut conn, sealed(12, busy), &id, t0);
    assert!(matches!(&notes[..], [Note::Down { .. }]), "{notes:?}");
    // A new connection to the same relay goes on from the last counter.
    let mut next = RelayConn::new("r1".into(), public_key(&RELAY_SECRET), None, t0);
    next.resume_counter(conn.counter());
    assert_eq!(next.counter(), 12);
}

#[test]
fn unsealed_answers_never_bring_a_connection_up_or_keep_it_alive() {
    let id = Identity::new(NODE_SECRET);
    let t0 = Instant::now();
    let mut conn = with_token(t0);
    timeout(&mut conn, &id, t0);
    frame_in(&mut conn, Frame::Challenge { cookie: [1; 32] }, &id, t0);
    let (_, notes) = frame_in(&mut conn, Frame::Registered { lease_secs: 60 }, &id, t0);
    assert!(notes.is_empty() && !conn.is_up(), "{notes:?}");
    let mut conn = up(&id, t0, 10);
    // Spoofed pongs do not count as the relay being heard.
    let silent = t0 + SILENT_DOWN;
    frame_in(&mut conn, Frame::Pong { nonce: [0; 8] }, &id, silent);
    let (_, notes) = timeout(&mut conn, &id, silent);
    assert!(matches!(&notes[..], [Note::Down { .. }]), "{notes:?}");
}

#[test]
fn a_fresh_token_while_up_registers_again_with_it_at_once() {
    let id = Identity::new(NODE_SECRET);
    let t0 = Instant::now();
    let mut conn = up(&id, t0, 10);
    let t = t0 + Duration::from_secs(1);
    conn.handle_token(b"fresh".to_vec());
    let (out, _) = timeout(&mut conn, &id, t);
    assert!(
        out.iter().any(|f| matches!(f, Frame::Hello { .. })),
        "{out:?}"
    );
    let (out, _) = frame_in(&mut conn, Frame::Challenge { cookie: [3; 32] }, &id, t);
    assert!(
        matches!(&out[..], [Frame::Register { token, .. }] if token == b"fresh"),
        "{out:?}"
    );
    let (_, notes) = frame_in(
        &mut conn,
        sealed(11, Frame::Registered { lease_secs: 60 }),
        &id,
        t,
    );
    assert!(notes.is_empty() && conn.is_up(), "{notes:?}");
    // The same token again is no news.
    conn.handle_token(b"fresh".to_vec());
    let (out, _) = timeout(&mut conn, &id, t + Duration::from_secs(2));
    assert!(
        !out.iter().any(|f| matches!(f, Frame::Hello { .. })),
        "{out:?}"
    );
}
