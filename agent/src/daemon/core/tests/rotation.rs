//! Rotation: each trigger starts one, each answer leads where `core/rotation.rs`'s table says;
//! the crash points (a pending key at start, the control plane already holding the new key,
//! the interface failing to take it) end with the node on the new key.

use plexsphere_wire::ApiError;
use plexsphere_wire::rotation::KeyRotated;

use super::*;
use crate::config::rotation::Interval;
use crate::daemon::core::io::KeyDone;
use crate::daemon::core::protocol::{Answer, Request};
use crate::daemon::core::rotation::{ROTATION_RETRY, RotationStart};
use crate::identity::rotation::KeySecret;

fn done(already: bool) -> KeyDone {
    KeyDone {
        secret: KeySecret([9; 32]),
        old_public_key: "old".into(),
        answer: KeyRotated {
            public_key: "new".into(),
            state_version: 7,
            already,
            relay_token: None,
        },
    }
}

fn rotations(effects: &[Effect]) -> usize {
    calls(effects)
        .iter()
        .filter(|c| matches!(c, Call::RotateKey))
        .count()
}

fn set_keys(effects: &[Effect]) -> usize {
    effects
        .iter()
        .filter(|e| matches!(e, Effect::Mesh { op: MeshOp::SetKey(k), .. } if k.0 == [9; 32]))
        .count()
}

fn promoted(effects: &[Effect]) -> bool {
    effects.iter().any(|e| matches!(e, Effect::PromoteKey))
}

fn answer_of(effects: &[Effect], id: ControlId) -> Option<&Answer> {
    effects.iter().find_map(|e| match e {
        Effect::Answer { id: i, answer } if *i == id => Some(answer),
        _ => None,
    })
}

fn refused(status: u16, retry: Option<u64>) -> CallError {
    CallError::Refused {
        status,
        error: ApiError::new("x", "no"),
        retry_after: retry.map(Duration::from_secs),
    }
}

/// A harness with the schedule off (only the triggers under test start a rotation).
fn quiet() -> Harness {
    let mut config = Config::default();
    config.rotation.key_interval = Interval(None);
    config.rotation.credential_interval = Interval(None);
    harness_with(config, None)
}

#[test]
fn a_pending_key_at_start_is_sent_again_and_the_repeat_answered_as_done_switches_and_promotes() {
    // The crash: the pending key was written (and maybe taken by the control plane), the
    // daemon stopped before the interface used it.
    let mut h = quiet();
    h.core.start_rotations(
        RotationStart {
            pending_key: true,
            ..Default::default()
        },
        h.now,
    );
    let e = h.step(Input::Tick);
    assert_eq!(rotations(&e), 1, "{e:?}");
    // Nothing starts twice while it runs.
    assert_eq!(rotations(&h.after(Duration::from_secs(60))), 0);
    let e = h.call(CallResult::RotateKey(Ok(done(true))));
    assert_eq!(set_keys(&e), 1, "{e:?}");
    assert!(
        promoted(&e),
        "promoted only after the interface took it: {e:?}"
    );
    let at = e
        .iter()
        .position(|x| {
            matches!(
                x,
                Effect::Mesh {
                    op: MeshOp::SetKey(_),
                    ..
                }
            )
        })
        .unwrap();
    let p = e
        .iter()
        .position(|x| matches!(x, Effect::PromoteKey))
        .unwrap();
    assert!(at < p, "{e:?}");
    // With the schedule off nothing else follows.
    assert_eq!(rotations(&h.after(Duration::from_secs(365 * 86_400))), 0);
}

#[test]
fn plexd_rotate_key_is_answered_once_the_interface_has_the_key() {
    let mut h = quiet();
    h.auto_mesh = false;
    h.step(Input::Tick);
    let e = h.step(Input::Control {
        id: 5,
        request: Request::RotateKey,
    });
    assert_eq!(rotations(&e), 1);
    // A second request while it runs waits for the same rotation.
    let e = h.step(Input::Control {
        id: 6,
        request: Request::RotateKey,
    });
    assert_eq!(rotations(&e), 0);
    let e = h.call(CallResult::RotateKey(Ok(done(false))));
    assert!(answer_of(&e, 5).is_none() && !promoted(&e), "{e:?}");
    let e = h.release_mesh();
    assert!(promoted(&e), "{e:?}");
    for id in [5, 6] {
        match answer_of(&e, id) {
            Some(Answer::Rotated { message }) => {
                assert!(
                    message.contains("new") && message.contains("old"),
                    "{message}"
                )
            }
            other => panic!("{id}: {other:?}"),
        }
    }
}

#[test]
fn an_interface_that_refuses_the_key_keeps_it_pending_and_the_rotation_is_repeated() {
    let mut h = quiet();
    h.auto_mesh = false;
    h.step(Input::Tick);
    h.step(Input::Control {
        id: 1,
        request: Request::RotateKey,
    });
    h.call(CallResult::RotateKey(Ok(done(false))));
    let (id, _) = h.held.pop().unwrap();
    let err = crate::mesh::MeshError {
        backend: "userspace",
        interface: "plexd0".into(),
        what: "stopped".into(),
    };
    let e = h.step(Input::Mesh {
        id,
        answer: MeshAnswer::KeySet(Err(err)),
    });
    assert!(!promoted(&e), "{e:?}");
    assert!(
        matches!(answer_of(&e, 1), Some(Answer::Error { message, .. }) if message.contains("tries again"))
    );
    // Tried again after the retry; the control plane answers it as done this time.
    assert_eq!(
        rotations(&h.after(ROTATION_RETRY - Duration::from_secs(1))),
        0
    );
    assert_eq!(rotations(&h.after(Duration::from_secs(1))), 1);
    h.call(CallResult::RotateKey(Ok(done(true))));
    assert!(promoted(&h.release_mesh()));
}

#[test]
fn refusals_conflict_discards_rate_limit_waits_gone_ends() {
    // 409: the key can never be taken: the pending key goes, no retry before the schedule.
    let mut h = quiet();
    h.step(Input::Tick);
    h.step(Input::Control {
        id: 1,
        request: Request::RotateKey,
    });
    let e = h.call(CallResult::RotateKey(Err(refused(409, None))));
    assert!(
        e.iter().any(|x| matches!(x, Effect::DiscardPendingKey)),
        "{e:?}"
    );
    assert!(matches!(answer_of(&e, 1), Some(Answer::Error { .. })));
    assert_eq!(rotations(&h.after(Duration::from_secs(3600))), 0);

    // 429: again after its Retry-After, the pending key kept.
    let mut h = quiet();
    h.step(Input::Tick);
    h.step(Input::Control {
        id: 1,
        request: Request::RotateKey,
    });
    let e = h.call(CallResult::RotateKey(Err(refused(429, Some(12)))));
    assert!(!e.iter().any(|x| matches!(x, Effect::DiscardPendingKey)));
    assert_eq!(rotations(&h.after(Duration::from_secs(11))), 0);
    assert_eq!(rotations(&h.after(Duration::from_secs(1))), 1);

    // 401: the node is gone, as for every call.
    let mut h = quiet();
    h.step(Input::Tick);
    h.step(Input::Control {
        id: 1,
        request: Request::RotateKey,
    });
    let e = h.call(CallResult::RotateKey(Err(CallError::Unauthorized)));
    assert_eq!(exits(&e), vec![&Outcome::Gone(DELETED.into())]);
}

#[test]
fn the_schedule_counts_from_the_age_of_the_key_with_jitter() {
    let mut config = Config::default();
    config.rotation.key_interval = Interval(Some(Duration::from_secs(86_400)));
    config.rotation.credential_interval = Interval(None);
    let mut h = harness_with(config, None);
    h.core.start_rotations(
        RotationStart {
            key_age: Some(Duration::from_secs(3600)),
            ..Default::default()
        },
        h.now,
    );
    // Due between 0.9 and 1.1 days after the key was written, an hour ago.
    assert_eq!(rotations(&h.after(Duration::from_secs(20 * 3600))), 0);
    assert_eq!(rotations(&h.after(Duration::from_secs(5 * 3600))), 1);
    h.call(CallResult::RotateKey(Ok(done(false))));
    // The next one a day (±10 %) after this one.
    assert_eq!(rotations(&h.after(Duration::from_secs(21 * 3600))), 0);
    assert_eq!(rotations(&h.after(Duration::from_secs(6 * 3600))), 1);

    // A key older than its interval rotates at once.
    let mut h = harness();
    h.core.start_rotations(
        RotationStart {
            key_age: Some(Duration::from_secs(40 * 86_400)),
            credential_age: Some(Duration::ZERO),
            pending_key: false,
        },
        h.now,
    );
    let e = h.step(Input::Tick);
    assert_eq!(rotations(&e), 1, "the default is 30 days: {e:?}");
    assert!(
        !calls(&e)
            .iter()
            .any(|c| matches!(c, Call::RotateCredential))
    );
}

#[test]
fn an_operators_request_starts_one_rotation_and_an_older_answer_does_not_repeat_it() {
    let mut h = quiet();
    let mut asked = ack(1);
    asked.rotate_key = true;
    h.step(Input::Tick);
    let e = h.call(CallResult::Heartbeat(Ok(asked.clone())));
    assert_eq!(rotations(&e), 1);
    h.call(CallResult::RotateKey(Ok(done(false))));
    // The answer to a heartbeat sent before the rotation ended still carries the request.
    assert_eq!(
        rotations(&h.call(CallResult::Heartbeat(Ok(asked.clone())))),
        0
    );
    // A heartbeat sent after it that still says so is a new request.
    h.after(Duration::from_secs(40));
    assert_eq!(rotations(&h.call(CallResult::Heartbeat(Ok(asked)))), 1);
}

#[test]
fn the_credential_rotates_on_request_and_answers() {
    let mut h = quiet();
    h.step(Input::Tick);
    let e = h.step(Input::Control {
        id: 3,
        request: Request::RotateCredential,
    });
    assert!(
        calls(&e)
            .iter()
            .any(|c| matches!(c, Call::RotateCredential))
    );
    let e = h.call(CallResult::RotateCredential(Ok(())));
    assert!(matches!(answer_of(&e, 3), Some(Answer::Rotated { .. })));
    // A leave in flight: nothing starts, the request is refused.
    h.step(Input::Control {
        id: 4,
        request: Request::Leave,
    });
    let e = h.step(Input::Control {
        id: 5,
        request: Request::RotateKey,
    });
    assert_eq!(rotations(&e), 0);
    assert!(matches!(answer_of(&e, 5), Some(Answer::Error { .. })));
}
