//! The event stream: connect, frames and their refusals, stall then resume, ends.

use super::*;
use crate::daemon::core::accept_fixtures::{peer, peer_id};
use crate::daemon::core::stream_state::Stream;

fn ended(reason: &str) -> StreamMsg {
    StreamMsg::Ended {
        reason: reason.into(),
        retry_after: None,
        fatal: None,
    }
}

#[test]
fn stream_stall_then_resume_after_the_last_applied_event() {
    let mut h = harness();
    h.up(&one_state(4, 1));
    h.frame(1, 5, EventKind::PeerAdded { peer: peer(9) });
    h.frame(
        1,
        6,
        EventKind::PeerRemoved {
            peer_node_id: peer_id(9),
            public_key: "k".into(),
        },
    );
    // Keep-alives keep it open...
    h.after(Duration::from_secs(20));
    h.stream(1, StreamMsg::Activity);
    let e = h.after(Duration::from_secs(20));
    assert!(!e.iter().any(|e| matches!(e, Effect::CloseStream { .. })));
    // ...silence for the stall timeout (30 s) closes it, and the next attempt resumes after 6.
    let e = h.after(Duration::from_secs(10));
    assert!(e.contains(&Effect::CloseStream { conn: 1 }), "{e:?}");
    assert!(notified(&e, "STATUS"), "the status line says disconnected");
    let mut reopened = vec![];
    for _ in 0..5 {
        reopened = opens(&h.wake());
        if !reopened.is_empty() {
            break;
        }
    }
    assert_eq!(reopened, vec![(2, Some(6))]);
    // Messages of the old connection are ignored.
    assert!(
        h.frame(1, 7, EventKind::PeerAdded { peer: peer(10) })
            .is_empty()
    );
    let e = h.stream(2, StreamMsg::Connected);
    assert!(notified(&e, "STATUS"));
}

#[test]
fn frames_apply_as_deltas_and_refusals_keep_the_last_good_state() {
    let mut h = harness();
    h.up(&one_state(4, 2));
    // Table: (seq, event) -> (peers applied or None, state pull soon)
    let moved = vec!["198.51.100.1:51820".parse().unwrap()];
    let rows: Vec<(u64, EventKind, Option<usize>, bool)> = vec![
        (5, EventKind::PeerAdded { peer: peer(9) }, Some(3), false),
        (5, EventKind::PeerAdded { peer: peer(10) }, None, false), // already applied
        (6, EventKind::PeerAdded { peer: peer(9) }, None, false),  // unchanged
        (
            7,
            EventKind::EndpointChanged {
                peer_node_id: peer_id(3),
                endpoints: moved,
                home_relay: None,
            },
            Some(3),
            false,
        ),
        (
            8,
            EventKind::EndpointChanged {
                peer_node_id: peer_id(77),
                endpoints: vec![],
                home_relay: None,
            },
            None,
            true,
        ),
        (
            9,
            EventKind::Resync {
                reason: "log trimmed".into(),
            },
            None,
            true,
        ),
    ];
    for (seq, kind, applied, pull) in rows {
        let label = format!("{seq} {kind:?}");
        let e = h.frame(1, seq, kind);
        assert_eq!(
            applies(&e),
            applied.into_iter().collect::<Vec<_>>(),
            "{label}"
        );
        // A pull "soon" is due at once.
        let due = h.core.schedule.next_due() == Some(h.now.at);
        assert_eq!(due, pull, "{label}");
        if pull {
            let e = h.step(Input::Tick);
            assert!(
                calls(&e).iter().any(|c| matches!(c, Call::State { .. })),
                "{label}"
            );
            // The server's state version is its Domain's head: the seq just seen.
            h.state_answer(&one_state(seq, 2));
        }
    }
    // A resync with a seq at or below ours still wins and forgets the applied version.
    let (version, seq) = (h.core.state_version, h.core.last_seq);
    assert_eq!(version, Some(9));
    // A replayed resync (an older seq) is refused and observed: signed state never goes back.
    let before = h.core.ingest.waiting();
    let e = h.frame(
        1,
        2,
        EventKind::Resync {
            reason: "reset".into(),
        },
    );
    assert!(calls(&e).is_empty(), "no pull for a replayed resync");
    assert_eq!((h.core.state_version, h.core.last_seq), (version, seq));
    assert_eq!(h.core.ingest.waiting(), before + 1);
    assert_ne!(
        h.core.schedule.next_due(),
        Some(h.now.at),
        "a replayed resync schedules no pull"
    );
    // Older events stay refused after it, and an older state is refused too.
    assert!(
        applies(&h.frame(1, 3, EventKind::PeerAdded { peer: peer(20) })).is_empty(),
        "an event older than the applied position does not apply"
    );
    let e = h.state_answer(&one_state(3, 5));
    assert!(applies(&e).is_empty(), "an older state does not apply");
    assert_eq!(h.core.state_version, version);
    // A frame with a bad signature is refused and observed.
    let before = h.core.ingest.waiting();
    let e = h.stream(
        1,
        StreamMsg::Frame {
            id: Some("10".into()),
            event: "peer_added".into(),
            data: "{}".into(),
        },
    );
    assert!(e.is_empty());
    assert_eq!(h.core.ingest.waiting(), before + 1);
    // A resync ahead of the position is taken: the next pull is unconditional.
    h.frame(
        1,
        20,
        EventKind::Resync {
            reason: "trimmed".into(),
        },
    );
    assert_eq!(h.core.last_seq, 20);
    assert_eq!(h.core.state_version, version, "the applied version stays");
    let e = h.step(Input::Tick);
    assert!(calls(&e).contains(&&Call::State { applied: None }));
    let e = h.frame(1, 21, EventKind::PeerAdded { peer: peer(20) });
    assert_eq!(applies(&e).len(), 1);
}

#[test]
fn too_many_cached_events_pull_the_full_state() {
    let mut h = harness();
    h.up(&one_state(1, 1));
    for seq in 2..(2 + MAX_CACHED_EVENTS as u64 + 1) {
        h.frame(1, seq, EventKind::PeerAdded { peer: peer(9) });
    }
    assert_eq!(h.core.events.len(), MAX_CACHED_EVENTS + 1);
    assert_eq!(
        h.core.schedule.next_due(),
        Some(h.now.at),
        "a state pull folds them in"
    );
}

#[test]
fn stream_ends_table() {
    // (fatal, leaving) -> outcome
    let rows: Vec<(Option<CallError>, bool, Option<Outcome>)> = vec![
        (None, false, None),
        (
            Some(CallError::Revoked),
            false,
            Some(Outcome::Gone(REVOKED.into())),
        ),
        (
            Some(CallError::Unauthorized),
            false,
            Some(Outcome::Gone(DELETED.into())),
        ),
        (Some(CallError::Revoked), true, None),
        (Some(CallError::Unauthorized), true, None),
    ];
    for (fatal, leaving, outcome) in rows {
        let label = format!("{fatal:?} leaving={leaving}");
        let mut h = harness();
        h.up(&one_state(4, 2));
        if leaving {
            h.step(Input::Control {
                id: 1,
                request: crate::daemon::core::protocol::Request::Leave,
            });
        }
        let e = h.stream(
            1,
            StreamMsg::Ended {
                reason: "x".into(),
                retry_after: Some(Duration::from_secs(9)),
                fatal: fatal.clone(),
            },
        );
        assert_eq!(
            exits(&e).into_iter().cloned().collect::<Vec<_>>(),
            outcome.clone().into_iter().collect::<Vec<_>>(),
            "{label}"
        );
        if outcome == Some(Outcome::Gone(REVOKED.into())) {
            assert_eq!(applies(&e), vec![0], "the revocation removes every peer");
        }
        if outcome.is_none() {
            // Retry-After is a floor for the reconnect.
            let Stream::Waiting { until } = h.core.stream.state() else {
                panic!("{label}")
            };
            assert!(until >= h.now.at + Duration::from_secs(9), "{label}");
        }
    }
}

#[test]
fn a_revoked_event_ends_the_node_unless_it_is_leaving() {
    let mut h = harness();
    h.up(&one_state(4, 2));
    let e = h.frame(1, 5, EventKind::NodeRevoked);
    assert_eq!(exits(&e), vec![&Outcome::Gone(REVOKED.into())]);
    assert_eq!(applies(&e), vec![0]);
    let mut l = harness();
    l.up(&one_state(4, 2));
    l.step(Input::Control {
        id: 1,
        request: crate::daemon::core::protocol::Request::Leave,
    });
    let e = l.frame(1, 5, EventKind::NodeRevoked);
    assert!(exits(&e).is_empty(), "the leave's answer ends it");
    let e = l.stream(1, ended("the stream closed"));
    assert!(exits(&e).is_empty());
}

/// Feeds the frames `(seq, event)` on stream 1 without asking for effects in between, as the
/// executor feeds the inputs already waiting in one turn.
fn feed_frames(h: &mut Harness, frames: impl IntoIterator<Item = (u64, EventKind)>) {
    for (seq, kind) in frames {
        let msg = frame_msg(seq, kind);
        h.core.handle(Input::Stream { conn: 1, msg }, h.now);
    }
}

fn reach_peer_lists(effects: &[Effect]) -> Vec<usize> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Reach(crate::daemon::core::io::ReachOp::Peers(p)) => Some(p.len()),
            _ => None,
        })
        .collect()
}

fn cache_writes(effects: &[Effect]) -> Vec<(u64, usize)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::SaveCache(w) => Some((w.last_seq, w.events.len())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_burst_of_events_in_one_turn_is_one_apply_one_reach_list_and_one_cache_write() {
    let mut h = harness();
    h.up(&one_state(4, 2));
    // 241 peers join while the executor was busy: their frames wait and come in one turn.
    feed_frames(
        &mut h,
        (10..=250u8).map(|n| (u64::from(n), EventKind::PeerAdded { peer: peer(n) })),
    );
    let e = h.step(Input::Tick);
    assert_eq!(applies(&e), vec![243], "one apply of every peer: {e:?}");
    assert_eq!(reach_peer_lists(&e), vec![243]);
    assert_eq!(cache_writes(&e), vec![(250, 241)]);
    // One event alone is applied and saved at once, as before.
    let e = h.frame(
        1,
        251,
        EventKind::PeerRemoved {
            peer_node_id: peer_id(250),
            public_key: "k".into(),
        },
    );
    assert_eq!(applies(&e), vec![242]);
    assert_eq!(cache_writes(&e), vec![(251, 242)]);
}

#[test]
fn a_revocation_later_in_the_turn_wins_over_the_peers_added_before_it() {
    let mut h = harness();
    h.up(&one_state(4, 2));
    feed_frames(
        &mut h,
        [
            (5, EventKind::PeerAdded { peer: peer(9) }),
            (6, EventKind::NodeRevoked),
        ],
    );
    let e = h.step(Input::Tick);
    assert_eq!(
        applies(&e),
        vec![0],
        "only the removal of every peer: {e:?}"
    );
    assert!(
        cache_writes(&e).is_empty(),
        "a revoked node writes no cache"
    );
    assert_eq!(exits(&e).len(), 1);
}

/// The control plane makes a state at its head when the pull arrives; a node registering just
/// after sends its `peer_added` over the stream, which can arrive before the pull's answer. The
/// state is older than that event but not stale: it is installed and the event applied again on
/// top (refused, as before, it left the state's own new peers off until the next poll).
#[test]
fn a_state_older_than_an_event_that_overtook_it_is_installed_with_the_event_on_top() {
    let mut h = harness();
    h.up(&one_state(4, 2)); // peers 3, 4
    let mut pulled = false;
    for _ in 0..1000 {
        h.stream(1, StreamMsg::Activity); // the stream stays up
        if calls(&h.after(Duration::from_secs(5)))
            .iter()
            .any(|c| matches!(c, Call::State { .. }))
        {
            pulled = true;
            break;
        }
    }
    assert!(pulled, "the next state pull");
    h.frame(1, 6, EventKind::PeerAdded { peer: peer(10) });
    let mut s = one_state(5, 2);
    s.peers.push(peer(9)); // registered at seq 5, before the state was made
    let e = h.state_answer(&s);
    assert_eq!(
        applies(&e),
        vec![4],
        "3, 4, 9 from the state, 10 from the event: {e:?}"
    );
    assert_eq!(h.core.state_version, Some(5));
    assert_eq!(h.core.last_seq, 6);
    // Older than the newest state installed stays refused, and so does the installed one
    // served again while an event came since (a replay: a state made since is newer).
    for replayed in [4, 5] {
        let e = h.state_answer(&one_state(replayed, 2));
        assert!(applies(&e).is_empty(), "state {replayed}: {e:?}");
        assert_eq!(h.core.state_version, Some(5));
    }
}

/// After a resync at seq 8, events before it may be lost: a state made before it stays refused.
#[test]
fn a_state_older_than_a_resync_is_refused() {
    let mut h = harness();
    h.up(&one_state(4, 2));
    h.frame(
        1,
        8,
        EventKind::Resync {
            reason: "trimmed".into(),
        },
    );
    let e = h.state_answer(&one_state(7, 3));
    assert!(applies(&e).is_empty(), "{e:?}");
    assert_eq!(h.core.state_version, Some(4));
    let e = h.state_answer(&one_state(8, 3));
    assert_eq!(applies(&e), vec![3], "{e:?}");
}
