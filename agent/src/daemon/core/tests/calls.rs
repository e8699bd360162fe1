//! Call answers: success, backoff with seeded jitter, revoked and deleted, each task's own
//! follow-up, ingest batches.

use plexsphere_wire::ApiError;
use plexsphere_wire::node::{Observation, ObservationKind};

use super::*;
use crate::daemon::core::schedule::Task;

fn refused(status: u16) -> CallError {
    CallError::Refused {
        status,
        error: ApiError::new("x", "no"),
        retry_after: None,
    }
}

#[test]
fn settle_table() {
    // (error, leaving) -> (exit, reachable afterwards)
    let rows: Vec<(Option<CallError>, bool, Option<Outcome>, bool)> = vec![
        (None, false, None, true),
        (Some(unreachable()), false, None, false),
        (Some(refused(500)), false, None, true),
        (
            Some(CallError::Unauthorized),
            false,
            Some(Outcome::Gone(DELETED.into())),
            false,
        ),
        (
            Some(CallError::Revoked),
            false,
            Some(Outcome::Gone(REVOKED.into())),
            false,
        ),
        (Some(CallError::Unauthorized), true, None, false),
        (Some(CallError::Revoked), true, None, false),
    ];
    for (err, leaving, outcome, reachable) in rows {
        let label = format!("{err:?} leaving={leaving}");
        let mut h = harness();
        h.step(Input::Tick);
        if leaving {
            h.step(Input::Control {
                id: 1,
                request: crate::daemon::core::protocol::Request::Leave,
            });
        }
        let res = match &err {
            None => Ok(plexsphere_wire::node::EndpointAck {
                observed: "203.0.113.1:51820".parse().unwrap(),
                endpoints: vec![],
            }),
            Some(e) => Err(e.clone()),
        };
        let e = h.call(CallResult::Endpoints(res));
        assert_eq!(
            exits(&e).into_iter().cloned().collect::<Vec<_>>(),
            outcome.clone().into_iter().collect::<Vec<_>>(),
            "{label}"
        );
        assert_eq!(h.core.api.reachable(), reachable, "{label}");
        if outcome.is_none() {
            let at = h.core.schedule.next_due().expect("rescheduled");
            let wait = at - h.now.at;
            let bound = match (&err, leaving) {
                (None, _) => Duration::from_secs(66),
                (Some(_), true) => LEAVING_RETRY,
                (Some(_), false) => Duration::from_secs(1),
            };
            assert!(wait <= bound, "{label}: {wait:?}");
        }
    }
}

/// The retry delays of `n` failures in a row of one task.
fn delays(seed: u64, n: usize) -> Vec<Duration> {
    let mut h = harness();
    h.core.jitter = Jitter::seeded(seed);
    h.step(Input::Tick);
    let mut out = vec![];
    for _ in 0..n {
        h.call(CallResult::State(Err(unreachable())));
        let at = h.core.schedule.next_due().unwrap_or(h.now.at);
        out.push(at - h.now.at);
        // Run the pull again when it is due.
        while !calls(&h.wake())
            .iter()
            .any(|c| matches!(c, Call::State { .. }))
        {}
    }
    out
}

#[test]
fn backoff_and_jitter_stay_in_bounds_and_replay_with_a_fixed_seed() {
    let a = delays(SEED, 9);
    assert_eq!(a, delays(SEED, 9), "the same seed picks the same delays");
    assert_ne!(a, delays(SEED + 1, 9));
    // Full jitter under a doubling ceiling (1 s initial, 60 s cap), never past the normal
    // interval (300 s ± 10%).
    for (i, d) in a.iter().enumerate() {
        let ceiling = Duration::from_secs(1u64 << i.min(6)).min(Duration::from_secs(60));
        assert!(*d <= ceiling, "attempt {i}: {d:?} > {ceiling:?}");
    }
    // Success resets the backoff: the next failure waits at most the initial delay.
    let mut h = harness();
    h.step(Input::Tick);
    for _ in 0..5 {
        h.call(CallResult::State(Err(unreachable())));
        while !calls(&h.wake())
            .iter()
            .any(|c| matches!(c, Call::State { .. }))
        {}
    }
    assert_eq!(h.core.api.backoff_attempts(), 5);
    h.call(CallResult::State(Ok(StateAnswer::NotModified)));
    assert_eq!(h.core.api.backoff_attempts(), 0);
    // A scheduled task comes back within ±10% of its interval.
    let next = h.core.schedule.next_due().unwrap() - h.now.at;
    assert!(
        next >= Duration::from_secs(27) && next <= Duration::from_secs(330),
        "{next:?}"
    );
}

#[test]
fn heartbeat_answers_set_intervals_and_ask_for_newer_state() {
    let mut h = harness();
    h.up(&one_state(4, 1));
    // (server's state version) -> pull soon
    for (version, pull) in [(4u64, false), (3, false), (9, true)] {
        while !calls(&h.wake())
            .iter()
            .any(|c| matches!(c, Call::Heartbeat(_)))
        {}
        let mut a = ack(version);
        a.intervals.heartbeat_secs = 10;
        h.call(CallResult::Heartbeat(Ok(a)));
        assert_eq!(
            h.core.schedule.next_due() == Some(h.now.at),
            pull,
            "{version}"
        );
        assert_eq!(
            h.core.schedule.interval(Task::Heartbeat),
            Duration::from_secs(10)
        );
        assert!(h.core.last_heartbeat.is_some());
    }
    // After a resync, any heartbeat asks for a pull, an unconditional one.
    let mut h = harness();
    h.up(&one_state(4, 1));
    h.frame(
        1,
        5,
        EventKind::Resync {
            reason: "trimmed".into(),
        },
    );
    let e = h.step(Input::Tick);
    assert!(calls(&e).contains(&&Call::State { applied: None }));
    h.call(CallResult::State(Err(unreachable())));
    assert!(
        h.core.schedule.next_due() > Some(h.now.at),
        "the retry waits"
    );
    h.call(CallResult::Heartbeat(Ok(ack(0))));
    assert_eq!(h.core.schedule.next_due(), Some(h.now.at), "a pull at once");
    assert_eq!(
        h.core.state_version,
        Some(4),
        "a resync never forgets what was applied"
    );
    assert!(h.core.full_pull);
}

#[test]
fn state_answers_table() {
    let mut h = harness();
    h.up(&one_state(4, 2));
    // An older version is refused and observed; 304 changes nothing; a newer one applies.
    h.call(CallResult::State(Err(unreachable())));
    let before = h.core.ingest.waiting();
    let e = h.state_answer(&one_state(3, 5));
    assert!(applies(&e).is_empty());
    assert_eq!(h.core.ingest.waiting(), before + 1);
    let e = h.call(CallResult::State(Ok(StateAnswer::NotModified)));
    assert!(applies(&e).is_empty());
    let e = h.state_answer(&one_state(6, 5));
    assert_eq!(applies(&e), vec![5]);
    assert_eq!(h.core.state_version, Some(6));
    let e = h.call(CallResult::State(Ok(StateAnswer::Body(
        b"not json".to_vec(),
    ))));
    assert!(applies(&e).is_empty());
}

#[test]
fn revoked_while_resyncing() {
    let mut h = harness();
    h.up(&one_state(4, 2));
    h.frame(
        1,
        5,
        EventKind::Resync {
            reason: "trimmed".into(),
        },
    );
    let e = h.step(Input::Tick);
    assert!(
        calls(&e).contains(&&Call::State { applied: None }),
        "a full pull"
    );
    // The pull finds the node revoked: every peer goes, then exit 15.
    let e = h.call(CallResult::State(Err(CallError::Revoked)));
    assert_eq!(applies(&e), vec![0]);
    assert_eq!(exits(&e), vec![&Outcome::Gone(REVOKED.into())]);
    assert!(h.mesh.live_peers().unwrap().is_empty());
    // What arrives later changes nothing.
    assert!(h.state_answer(&one_state(9, 3)).is_empty());
}

fn observation() -> Observation {
    Observation {
        at: 1,
        kind: ObservationKind::Error {
            message: "x".into(),
        },
    }
}

/// Runs the ingest flush; returns the batch it sent.
fn flush(h: &mut Harness) -> Option<plexsphere_wire::node::IngestBatch> {
    for _ in 0..10 {
        let e = h.wake();
        if let Some(Call::Ingest(b)) = calls(&e).into_iter().find(|c| matches!(c, Call::Ingest(_)))
        {
            return Some(b.clone());
        }
    }
    None
}

#[test]
fn a_refused_batch_counts_as_dropped_and_a_failed_one_goes_again() {
    let mut h = harness();
    h.up(&one_state(4, 1));
    for _ in 0..3 {
        h.core.ingest.push(observation());
    }
    let first = flush(&mut h).expect("a batch");
    assert_eq!(first.observations.len(), 3);
    // A transient failure: the same batch again.
    h.call(CallResult::Ingest(Err(unreachable())));
    let again = flush(&mut h).expect("again");
    assert_eq!(again.batch_id, first.batch_id);
    // Refused for good (422): given up, counted as dropped in the next batch.
    h.call(CallResult::Ingest(Err(refused(422))));
    assert_eq!(h.core.ingest.dropped(), 3);
    h.core.ingest.push(observation());
    let next = flush(&mut h).expect("next");
    assert_ne!(next.batch_id, first.batch_id);
    assert_eq!(next.dropped, 3);
    h.call(CallResult::Ingest(Ok(())));
    assert_eq!(h.core.ingest.dropped(), 0);
    assert_eq!(h.core.ingest.waiting(), 0);
    // Nothing to say: no call, the flush is rescheduled.
    let e = h.after(Duration::from_secs(70));
    assert!(!calls(&e).iter().any(|c| matches!(c, Call::Ingest(_))));
    assert!(h.core.schedule.next_due().is_some());
}

#[test]
fn handshakes_and_traffic_become_observations_once() {
    let mut h = harness();
    h.up(&one_state(4, 1));
    let key = crate::daemon::core::accept_fixtures::peer(3).public_key;
    let live = |hs: u64, rx: u64| crate::mesh::LivePeer {
        public_key: key.clone(),
        endpoint: None,
        last_handshake: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(hs)),
        rx_bytes: rx,
        tx_bytes: 1,
    };
    h.core.on_live(LiveFor::Observe, &[live(10, 5)], h.now);
    let e = h.drain();
    let Some(Call::Ingest(b)) = calls(&e).into_iter().next() else {
        panic!("{e:?}")
    };
    assert_eq!(b.observations.len(), 2, "a handshake and traffic");
    h.call(CallResult::Ingest(Ok(())));
    h.core.on_live(LiveFor::Observe, &[live(10, 5)], h.now);
    assert!(calls(&h.drain()).is_empty(), "nothing new");
    // A live peer no wanted set names is not observed.
    let mut stranger = live(50, 50);
    stranger.public_key = "c3RyYW5nZXI=".into();
    h.core.on_live(LiveFor::Observe, &[stranger], h.now);
    assert!(calls(&h.drain()).is_empty());
    h.core.on_live(LiveFor::Observe, &[live(11, 5)], h.now);
    let e = h.drain();
    let Some(Call::Ingest(b)) = calls(&e).into_iter().next() else {
        panic!("{e:?}")
    };
    assert_eq!(b.observations.len(), 1, "a new handshake only");
}

#[test]
fn an_unsigned_304_is_trusted_only_for_a_while_and_a_stale_state_is_refused() {
    let mut h = harness();
    h.up(&one_state(4, 2));
    // Right after a signed state, a pull may ask If-None-Match.
    h.core.schedule.run_soon(Task::StatePoll, h.now.at);
    let e = h.step(Input::Tick);
    assert!(
        calls(&e).contains(&&Call::State { applied: Some(4) }),
        "{e:?}"
    );
    h.call(CallResult::State(Ok(StateAnswer::NotModified)));
    // Past STATE_REFRESH the pull is unconditional, however many 304s came meanwhile.
    let e = h.after(super::super::STATE_REFRESH + Duration::from_secs(1));
    let mut pulled = calls(&e).into_iter().find_map(|c| match c {
        Call::State { applied } => Some(*applied),
        _ => None,
    });
    if pulled.is_none() {
        h.core.schedule.run_soon(Task::StatePoll, h.now.at);
        let e = h.step(Input::Tick);
        pulled = calls(&e).into_iter().find_map(|c| match c {
            Call::State { applied } => Some(*applied),
            _ => None,
        });
    }
    assert_eq!(
        pulled,
        Some(None),
        "an unconditional pull after STATE_REFRESH"
    );
    // A newer version that was issued long ago is a replay: refused and observed.
    let before = h.core.ingest.waiting();
    let mut old = one_state(9, 3);
    old.issued_at -= i64::try_from(super::super::MAX_STATE_AGE.as_secs()).unwrap() + 60;
    let e = h.state_answer(&old);
    assert!(applies(&e).is_empty(), "a stale state does not apply");
    assert_eq!(h.core.state_version, Some(4));
    assert_eq!(h.core.ingest.waiting(), before + 1);
    // The same version issued now applies.
    let mut fresh = one_state(9, 3);
    let now_secs = h
        .now
        .wall
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap();
    fresh.issued_at = i64::try_from(now_secs.as_secs()).unwrap();
    let e = h.state_answer(&fresh);
    assert!(!applies(&e).is_empty());
    assert_eq!(h.core.state_version, Some(9));
}

fn offload_effects(effects: &[Effect]) -> Vec<Option<plexsphere_wire::node::UdpOffload>> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::UdpOffload(s) => Some(*s),
            _ => None,
        })
        .collect()
}

#[test]
fn the_signed_states_udp_offload_reaches_the_data_plane_once_per_change() {
    use plexsphere_wire::node::UdpOffload;
    let mut h = harness();
    // No setting (an older server): the data plane keeps its default, nothing to hand over.
    let e = h.up(&one_state(4, 1));
    assert!(offload_effects(&e).is_empty());
    let mut off = one_state(5, 1);
    off.udp_offload = Some(UdpOffload::Off);
    let e = h.state_answer(&off);
    assert_eq!(offload_effects(&e), vec![Some(UdpOffload::Off)]);
    // The same setting in a newer state changes nothing.
    off.version = 6;
    assert!(offload_effects(&h.state_answer(&off)).is_empty());
    let e = h.state_answer(&one_state(7, 1));
    assert_eq!(offload_effects(&e), vec![None], "back to the default");
}
