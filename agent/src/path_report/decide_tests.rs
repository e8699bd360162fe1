use super::*;
use plexsphere_wire::paths::PathTransport;
use uuid::Uuid;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn direct(peer: u128, rtt: f64) -> PeerPath {
    PeerPath {
        peer_node_id: Uuid::from_u128(peer),
        path: PathKind::Direct {
            endpoint: "192.0.2.7:51820".parse().unwrap_or_else(|_| unreachable!()),
        },
        rtt_ms: Some(rtt),
        last_handshake_at: Some(100),
    }
}

fn relayed(peer: u128, rtt: f64) -> PeerPath {
    PeerPath {
        path: PathKind::Relay {
            relay: "r1".into(),
            transport: PathTransport::Udp,
        },
        ..direct(peer, rtt)
    }
}

/// One step of a table: at `at` ms, sample `sample` (if any), answer the report in flight
/// (if any), and expect a report (with its first peer's path kind) or none.
struct Step {
    at: u64,
    sample: Option<Vec<PeerPath>>,
    answer: Option<Answer>,
    expect: Option<&'static str>,
}

fn step(
    at: u64,
    sample: Option<Vec<PeerPath>>,
    answer: Option<Answer>,
    expect: Option<&'static str>,
) -> Step {
    Step {
        at,
        sample,
        answer,
        expect,
    }
}

fn run(name: &str, steps: Vec<Step>) -> PathReporter {
    let t0 = Instant::now();
    let mut r = PathReporter::default();
    for (i, s) in steps.into_iter().enumerate() {
        let now = t0 + ms(s.at);
        if let Some(a) = s.answer {
            r.handle_answer(a, now);
        }
        if let Some(p) = s.sample {
            r.handle_sample(p, now);
        }
        let got = r.poll_report(now).map(|rep| rep.peers[0].path.as_str());
        assert_eq!(got, s.expect, "{name}: step {i} at {} ms", s.at);
    }
    r
}

#[test]
fn the_schedule_follows_the_table() {
    let ok = || Some(Answer::Stored);
    // A first sample goes out after the debounce; a path change after the debounce and the
    // gap; the same paths again send nothing.
    run(
        "first report and a change",
        vec![
            step(0, Some(vec![direct(1, 3.0)]), None, None),
            step(400, Some(vec![direct(1, 3.0)]), None, None),
            step(500, None, None, Some("direct")),
            step(600, None, ok(), None),
            step(1000, Some(vec![relayed(1, 9.0)]), None, None),
            step(1600, None, None, None), // debounced, but inside the 2 s gap
            step(2600, None, None, Some("relay")),
            step(2700, None, ok(), None),
            step(5000, Some(vec![relayed(1, 9.0)]), None, None),
        ],
    );
    // A path that flaps during the debounce is one report of where it settled.
    run(
        "flapping",
        vec![
            step(0, Some(vec![direct(1, 3.0)]), None, None),
            step(300, Some(vec![relayed(1, 3.0)]), None, None),
            step(600, Some(vec![direct(1, 3.0)]), None, None),
            step(1000, None, None, None),
            step(1100, None, None, Some("direct")),
        ],
    );
    // RTT jitter is not a report; drift is, at most every 10 s; a handshake is drift too.
    run(
        "rtt drift",
        vec![
            step(0, Some(vec![direct(1, 10.0)]), None, None),
            step(500, None, None, Some("direct")),
            step(500, None, ok(), None),
            step(3000, Some(vec![direct(1, 11.0)]), None, None), // within 2 ms / 20 %
            step(10_600, None, None, None),
            // Drift, due 10 s after the last report (at 10.5 s): out at once.
            step(11_000, Some(vec![direct(1, 30.0)]), None, Some("direct")),
            step(11_100, None, ok(), None),
            step(
                12_000,
                Some(vec![PeerPath {
                    last_handshake_at: Some(200),
                    ..direct(1, 30.0)
                }]),
                None,
                None,
            ),
            step(21_000, None, None, None),
            step(21_100, None, None, Some("direct")),
        ],
    );
    // 404: stop for good; 429: wait as told; another failure: retry after RETRY.
    let r = run(
        "not supported",
        vec![
            step(0, Some(vec![direct(1, 3.0)]), None, None),
            step(500, None, None, Some("direct")),
            step(600, None, Some(Answer::NotSupported), None),
            step(5000, Some(vec![relayed(1, 3.0)]), None, None),
            step(60_000, None, None, None),
        ],
    );
    assert!(r.stopped && r.poll_timeout().is_none());
    run(
        "429 and failures",
        vec![
            step(0, Some(vec![direct(1, 3.0)]), None, None),
            step(500, None, None, Some("direct")),
            step(600, None, Some(Answer::TooSoon(ms(3000))), None),
            step(3500, None, None, None),
            step(3600, None, None, Some("direct")),
            step(3700, None, Some(Answer::Failed("unreachable".into())), None),
            step(8600, None, None, None),
            step(8700, None, None, Some("direct")),
            step(8800, None, ok(), None),
        ],
    );
}

#[test]
fn one_report_in_flight_and_a_change_meanwhile_follows_after_the_gap() {
    let t0 = Instant::now();
    let mut r = PathReporter::default();
    r.handle_sample(vec![direct(1, 3.0)], t0);
    assert!(r.poll_report(t0 + DEBOUNCE).is_some());
    r.handle_sample(vec![relayed(1, 3.0)], t0 + ms(600));
    assert_eq!(r.poll_timeout(), None, "one in flight");
    assert!(r.poll_report(t0 + ms(5000)).is_none());
    r.handle_answer(Answer::Stored, t0 + ms(700));
    assert_eq!(r.poll_timeout(), Some(t0 + ms(700) + MIN_GAP));
    let next = r.poll_report(t0 + ms(2700)).map(|rep| rep.peers);
    assert_eq!(next, Some(vec![relayed(1, 3.0)]));
}

#[test]
fn a_report_is_bounded_and_keeps_peers_with_a_path() {
    let mut peers: Vec<PeerPath> = (0..MAX_PATH_PEERS as u128 + 5)
        .map(|i| PeerPath {
            path: PathKind::None,
            ..direct(i, 1.0)
        })
        .collect();
    peers.push(direct(100_000, 1.0));
    let b = bounded(peers);
    assert_eq!(b.len(), MAX_PATH_PEERS);
    assert!(b.iter().any(|p| p.peer_node_id == Uuid::from_u128(100_000)));
    assert!(b.windows(2).all(|w| w[0].peer_node_id < w[1].peer_node_id));
}
