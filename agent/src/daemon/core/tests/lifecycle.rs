//! Start, cold start after an outage, READY, the watchdog, reload, stop, status.

use std::path::PathBuf;

use super::*;
use crate::config::ConfigError;
use crate::daemon::core::cache::{CacheError, Cached};
use crate::daemon::core::protocol::{Answer, Request};
use crate::daemon::core::reload::ReloadError;

#[test]
fn the_first_tick_starts_every_task_but_ingest_and_opens_the_stream() {
    let mut h = harness();
    let e = h.step(Input::Tick);
    assert_eq!(
        calls(&e),
        vec![
            &Call::Endpoints(plexsphere_wire::node::EndpointReport {
                listen_port: 51820,
                addresses: vec![],
                reflexive: vec![],
                home_relay: None,
                nat: Default::default(),
            }),
            &Call::State { applied: None },
            &Call::Heartbeat(plexsphere_wire::node::Heartbeat {
                uptime_secs: 0,
                plexd_version: env!("CARGO_PKG_VERSION").to_owned(),
                state_version: None,
                peers: plexsphere_wire::node::PeerSummary {
                    configured: 0,
                    connected: 0
                },
            }),
        ]
    );
    assert_eq!(opens(&e), vec![(1, None)]);
    assert!(!notified(&e, "READY"), "no state yet");
}

#[test]
fn ready_waits_for_the_mesh_to_take_the_first_state() {
    let mut h = harness();
    h.auto_mesh = false;
    h.step(Input::Tick);
    h.held.clear();
    let e = h.state_answer(&one_state(4, 2));
    assert_eq!(applies(&e), vec![2]);
    assert!(matches!(e.last(), Some(Effect::SaveCache(w)) if w.last_seq == 4));
    assert!(!notified(&e, "READY"));
    let e = h.release_mesh();
    assert!(notified(&e, "READY"), "{e:?}");
    // A later state does not notify READY again.
    let e = h.state_answer(&one_state(5, 3));
    assert!(!notified(&e, "READY"));
}

#[test]
fn ready_waits_for_the_first_state_to_be_cached_too() {
    // A node that told systemd it is ready must come back into the same peers after a
    // restart without the API: READY=1 waits for the disk thread to finish the cache write.
    let mut h = harness();
    h.auto_disk = false;
    h.step(Input::Tick);
    let e = h.state_answer(&one_state(4, 2));
    assert_eq!(applies(&e), vec![2]);
    let Some(Effect::SaveCache(w)) = e.iter().find(|e| matches!(e, Effect::SaveCache(_))) else {
        panic!("{e:?}")
    };
    let first = w.id;
    assert!(
        !notified(&e, "READY"),
        "the mesh took it, the disk did not yet"
    );
    let e = h.step(Input::CacheSaved(first));
    assert!(notified(&e, "READY"), "{e:?}");
    // A later state does not notify READY again.
    let e = h.state_answer(&one_state(5, 3));
    assert!(!notified(&e, "READY"));
}

#[test]
fn outage_then_cold_start_from_the_cache_then_the_api_returns() {
    // plexd starts while the API is down, with a cached state: the mesh gets the cached
    // peers and systemd hears READY before any call succeeds.
    let mut h = harness();
    let s = one_state(7, 2);
    let envelope = signer().sign(SignContext::NodeState, &s).unwrap();
    let cached = Cached {
        promoted: false,
        state: s.clone(),
        envelope,
        events: vec![],
        last_seq: 9,
    };
    let e = h.step(Input::CacheLoaded(Ok(Some(Box::new(cached)))));
    assert_eq!(applies(&e), vec![2]);
    assert!(notified(&e, "READY"));
    assert!(
        !e.iter().any(|e| matches!(e, Effect::SaveCache(_))),
        "the cache is not written back"
    );
    // The first round fails: every call backs off, nothing exits.
    let e = h.step(Input::Tick);
    assert_eq!(
        opens(&e),
        vec![(1, Some(9))],
        "resumes after the cached seq"
    );
    for r in [
        CallResult::Heartbeat(Err(unreachable())),
        CallResult::Endpoints(Err(unreachable())),
        CallResult::State(Err(unreachable())),
    ] {
        assert!(exits(&h.call(r)).is_empty());
    }
    let e = h.stream(
        1,
        StreamMsg::Ended {
            reason: "refused".into(),
            retry_after: None,
            fatal: None,
        },
    );
    assert!(exits(&e).is_empty());
    // Later the API answers: the first pull after a start is unconditional (a 304 is unsigned,
    // and the cached state may be old).
    let mut pulled = None;
    for _ in 0..20 {
        let e = h.wake();
        if let Some(Call::State { applied }) = calls(&e)
            .into_iter()
            .find(|c| matches!(c, Call::State { .. }))
        {
            pulled = Some(*applied);
            break;
        }
    }
    assert_eq!(pulled, Some(None));
    let e = h.call(CallResult::State(Ok(StateAnswer::NotModified)));
    assert!(applies(&e).is_empty());
    // No cache at all: nothing applied, nothing ready.
    let mut cold = harness();
    let e = cold.step(Input::CacheLoaded(Ok(None)));
    assert!(e.is_empty());
    let e = cold.step(Input::CacheLoaded(Err(CacheError::Refused {
        path: PathBuf::from("/s/state.json"),
        reason: "unreadable".into(),
    })));
    assert!(e.is_empty());
}

#[test]
fn the_watchdog_is_fed_only_while_the_mesh_answers() {
    let mut h = harness_with(Config::default(), Some(Duration::from_secs(30)));
    h.auto_mesh = false;
    let e = h.step(Input::Tick);
    assert!(notified(&e, "WATCHDOG"), "a fresh daemon is healthy");
    // The probe and the heartbeat read are answered 10 s later: fed at the next turn.
    assert_eq!(h.held.len(), 2);
    h.after(Duration::from_secs(10));
    h.release_mesh();
    let e = h.after(Duration::from_secs(20));
    assert!(
        notified(&e, "WATCHDOG"),
        "the mesh answered within the bound"
    );
    // This turn's probe stays unanswered (a stuck mesh worker): 30 s later, no WATCHDOG=1,
    // and no second probe while one is outstanding.
    let e = h.after(Duration::from_secs(30));
    assert!(
        !notified(&e, "WATCHDOG"),
        "systemd will restart plexd if this lasts"
    );
    assert_eq!(
        h.held
            .iter()
            .filter(|(_, op)| *op == MeshOp::ReadLive)
            .count(),
        2,
        "the probe and a heartbeat read"
    );
    // The mesh answers again: fed at the next turn.
    h.release_mesh();
    let e = h.after(Duration::from_secs(30));
    assert!(notified(&e, "WATCHDOG"), "{e:?}");
    // Without a watchdog, nothing is probed.
    let mut off = harness();
    let e = off.step(Input::Tick);
    assert!(!notified(&e, "WATCHDOG"));
}

#[test]
fn a_busy_mesh_is_an_error_and_the_next_change_applies_again() {
    let mut h = harness();
    h.auto_mesh = false;
    h.step(Input::Tick);
    h.held.clear();
    let e = h.state_answer(&one_state(4, 2));
    let Some(Effect::Mesh { id, .. }) = e.iter().find(|e| matches!(e, Effect::Mesh { .. })) else {
        panic!("{e:?}")
    };
    let id = *id;
    h.held.clear();
    let e = h.step(Input::Mesh {
        id,
        answer: MeshAnswer::Busy,
    });
    assert!(
        notified(&e, "READY"),
        "ready even when the apply failed, as before"
    );
    assert_eq!(h.core.ingest.waiting(), 1, "the failure is an observation");
}

#[test]
fn applies_in_a_burst_coalesce_into_one_outstanding_apply() {
    let mut h = harness();
    h.auto_mesh = false;
    h.step(Input::Tick);
    h.held.clear();
    h.state_answer(&one_state(4, 1));
    h.stream(1, StreamMsg::Connected);
    let mut more = vec![];
    for (seq, n) in [(5, 10u8), (6, 11), (7, 12)] {
        more.extend(h.frame(
            1,
            seq,
            EventKind::PeerAdded {
                peer: crate::daemon::core::accept_fixtures::peer(n),
            },
        ));
    }
    assert!(applies(&more).is_empty(), "one apply runs; the rest waits");
    assert_eq!(h.held.len(), 1);
    let e = h.release_mesh();
    assert_eq!(applies(&e), vec![4], "the latest set, once");
    let e = h.release_mesh();
    assert!(applies(&e).is_empty());
}

#[test]
fn reload_during_a_pull() {
    let mut h = harness();
    let e = h.step(Input::Tick);
    assert!(calls(&e).contains(&&Call::State { applied: None }));
    // SIGHUP while the pull runs: the new state-poll interval applies to the next pull.
    let mut config = Config::default();
    config.daemon.intervals.state_poll_secs = Some(5);
    config.log.level = Some(serde_json::from_value(serde_json::json!("debug")).unwrap());
    config.wireguard.listen_port = 51999;
    let e = h.step(Input::Reload {
        path: PathBuf::from("/etc/plexd/config.yaml"),
        config: Ok(Box::new(config.clone())),
        log_level_pinned: false,
    });
    assert_eq!(e, vec![Effect::SetLogLevel("debug".into())]);
    assert_eq!(
        h.core.config().wireguard.listen_port,
        51820,
        "waits for a restart"
    );
    assert_eq!(h.core.config().daemon, config.daemon, "applies now");
    h.state_answer(&one_state(3, 1));
    let mut next = None;
    for _ in 0..10 {
        let e = h.wake();
        if calls(&e)
            .iter()
            .any(|c| matches!(c, Call::State { applied: Some(3) }))
        {
            next = Some(h.elapsed());
            break;
        }
    }
    let at = next.expect("a second pull");
    assert!(
        at >= Duration::from_millis(4500) && at <= Duration::from_millis(5500),
        "{at:?}"
    );
    // A pinned level is not changed; a config that does not load keeps the running one.
    let e = h.step(Input::Reload {
        path: PathBuf::from("/c"),
        config: Ok(Box::default()),
        log_level_pinned: true,
    });
    assert!(e.is_empty(), "{e:?}");
    let before = h.core.config().clone();
    let e = h.step(Input::Reload {
        path: PathBuf::from("/c"),
        config: Err(ReloadError::Config(ConfigError::Empty {
            path: PathBuf::from("/c"),
        })),
        log_level_pinned: false,
    });
    assert!(e.is_empty());
    assert_eq!(h.core.config(), &before);
    let mut other = before.clone();
    other.api_url = Some(crate::config::ApiUrl::parse("https://other.example").unwrap());
    other.state_dir = Some(PathBuf::from("/elsewhere"));
    h.step(Input::Reload {
        path: PathBuf::from("/c"),
        config: Ok(Box::new(other)),
        log_level_pinned: false,
    });
    assert_eq!(
        h.core.config(),
        &before,
        "api_url and state_dir keep their running values"
    );
}

#[test]
fn a_signal_stops_and_status_answers_from_the_live_peers() {
    let mut h = harness();
    h.up(&one_state(4, 2));
    let e = h.step(Input::Control {
        id: 7,
        request: Request::Status,
    });
    let Some(Effect::Answer {
        id: 7,
        answer: Answer::Status(r),
    }) = e.last()
    else {
        panic!("{e:?}")
    };
    assert_eq!(r.peers.len(), 2);
    assert_eq!(r.state_version, Some(4));
    assert!(r.event_stream_connected);
    assert_eq!(r.backend, "none");
    assert_eq!(
        r.peers[0].endpoint,
        Some("192.0.2.3:51820".parse().unwrap())
    );
    let e = h.step(Input::Stop("SIGTERM"));
    assert_eq!(exits(&e), vec![&Outcome::Stopped("SIGTERM")]);
    assert!(h.step(Input::Tick).is_empty(), "nothing after the exit");
}

#[test]
fn cached_events_newer_than_the_state_are_applied_on_top() {
    use crate::daemon::core::cache::CachedEvent;
    use plexsphere_wire::node::Event;
    let mut h = harness();
    let s = one_state(7, 2);
    let envelope = signer().sign(SignContext::NodeState, &s).unwrap();
    let event = |seq: u64, n: u8| {
        let kind = EventKind::PeerAdded {
            peer: crate::daemon::core::accept_fixtures::peer(n),
        };
        let frame = CachedEvent {
            id: seq,
            data: event_data(seq, own(), kind.clone()),
        };
        (
            Event {
                seq,
                node_id: own(),
                kind,
            },
            frame,
        )
    };
    let cached = Cached {
        promoted: false,
        state: s,
        envelope,
        events: vec![event(6, 20), event(8, 21)],
        last_seq: 8,
    };
    let e = h.step(Input::CacheLoaded(Ok(Some(Box::new(cached)))));
    assert_eq!(
        applies(&e),
        vec![3],
        "the state's 2 peers and the event after it"
    );
    assert_eq!(
        h.core.events.len(),
        1,
        "the event the state already holds is dropped"
    );
    // Reload with nothing changed: nothing to do.
    let same = h.core.config().clone();
    let e = h.step(Input::Reload {
        path: PathBuf::from("/c"),
        config: Ok(Box::new(same)),
        log_level_pinned: false,
    });
    assert!(e.is_empty());
}
