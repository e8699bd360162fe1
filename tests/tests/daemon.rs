//! The plexd daemon against the real control plane, across processes: heartbeats and
//! online/offline, the event stream through server restarts, silent proxies and tampering,
//! the offline cold start, revocation and leave, an ingest batch whose answer was lost.
//!
//! The nodes run with `wireguard.backend: none` (control plane only): these tests are about
//! what crosses the API. The mesh itself is tested in mesh.rs.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use plexsphere_e2e::proxy::{Mode, Proxy};
use plexsphere_e2e::{ControlPlane, Host, LAB_NODES_PROJECT, Proc, wait_until};

/// The control planes of these tests send a keep-alive every second.
const KEEPALIVE: &[&str] = &["--sse-keepalive-secs", "1"];

const BOUND: Duration = Duration::from_secs(60);

/// Fast daemon timings for tests: heartbeats every second, stalls noticed after 3 s.
const FAST: &str = "wireguard:\n  backend: none\ndaemon:\n  stall_timeout_secs: 3\n  backoff_initial_ms: 200\n  backoff_cap_secs: 2\n  intervals:\n    heartbeat_secs: 1\n    state_poll_secs: 2\n";

/// A node of the lab-nodes Project with the config section `daemon`, against `api_url`, with a
/// fresh token.
fn node_with(
    cp: &ControlPlane,
    root: &std::path::Path,
    name: &str,
    api_url: &str,
    daemon: &str,
) -> Host {
    let host = Host::new(&root.join(name)).unwrap();
    host.write_config(api_url, &cp.ca_file(), LAB_NODES_PROJECT, name, daemon)
        .unwrap();
    host.write_token(&cp.issue_token(LAB_NODES_PROJECT).unwrap())
        .unwrap();
    host
}

/// A node with the [`FAST`] timings.
fn node(cp: &ControlPlane, root: &std::path::Path, name: &str, api_url: &str) -> Host {
    node_with(cp, root, name, api_url, FAST)
}

/// A node whose only way back after an outage is its event stream: no heartbeat or state poll
/// for an hour, so what it learns after the outage it learns by resuming the stream.
fn stream_only_node(cp: &ControlPlane, root: &std::path::Path, name: &str, api_url: &str) -> Host {
    let slow = FAST
        .replace("heartbeat_secs: 1", "heartbeat_secs: 3600")
        .replace("state_poll_secs: 2", "state_poll_secs: 3600");
    node_with(cp, root, name, api_url, &slow)
}

/// Starts the daemon and waits until it is enrolled and its event stream is connected.
fn start(host: &Host) -> (Proc, serde_json::Value) {
    let proc = host.start_daemon().unwrap();
    let status = wait_until(BOUND, "the daemon's event stream connects", || {
        Ok(host
            .status()?
            .filter(|s| s["event_stream_connected"] == true && !s["state_version"].is_null()))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- plexd output:\n{}", proc.output()));
    (proc, status)
}

#[test]
fn heartbeats_mark_the_node_online_and_a_stopped_daemon_goes_offline() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev_with(
        &tmp.path().join("cp"),
        &[
            "--sse-keepalive-secs",
            "1",
            "--heartbeat-secs",
            "1",
            "--offline-after-secs",
            "3",
        ],
    )
    .unwrap();
    let a = node(&cp, tmp.path(), "a", &cp.url);
    let (mut proc, status) = start(&a);
    let id = status["node_id"].as_str().unwrap().to_owned();
    assert!(
        proc.output().contains(&id),
        "the registration is logged with the node id"
    );

    wait_until(BOUND, "the node is online", || {
        Ok(Some(cp.node(&id)?).filter(|n| n["status"] == "online"))
    })
    .unwrap();
    let hb = wait_until(BOUND, "a heartbeat is seen by the daemon", || {
        Ok(a.status()?
            .filter(|s| !s["last_heartbeat_age_secs"].is_null()))
    })
    .unwrap();
    assert_eq!(hb["api"]["reachable"], true);

    let exit = proc.terminate(Duration::from_secs(15)).unwrap();
    assert!(exit.success(), "SIGTERM exits 0: {exit}");
    wait_until(BOUND, "the stopped node turns offline", || {
        Ok(Some(cp.node(&id)?).filter(|n| n["status"] == "offline"))
    })
    .unwrap();
    assert!(
        a.status().unwrap().is_none(),
        "no daemon answers after SIGTERM"
    );
}

/// A proxy in front of `cp` that terminates TLS with the lab certificate, so it can refuse
/// state pulls alone.
fn tls_proxy(cp: &ControlPlane, cp_dir: &std::path::Path) -> Proxy {
    let tls = cp_dir.join("tls");
    Proxy::start_tls(
        cp.addr().unwrap(),
        &tls.join("server.crt"),
        &tls.join("server.key"),
        &tls.join("ca.crt"),
    )
    .unwrap()
}

/// One value from the control plane's SQLite database.
fn db_value(cp_dir: &std::path::Path, sql: &str) -> anyhow::Result<u64> {
    let out = std::process::Command::new("sqlite3")
        .arg(cp_dir.join("plexsphere.db"))
        .arg(sql)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "sqlite3 {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.trim().parse().unwrap_or(0))
}

/// The Last-Event-ID of the newest `sse: stream opened` line in a server's output.
fn resumed_from(opened: &str) -> Option<u64> {
    let rest = opened.split("last_event_id=Some(\"").nth(1)?;
    rest.split('"').next()?.parse().ok()
}

#[test]
fn the_stream_resumes_after_a_server_restart_without_missing_events() {
    let tmp = tempfile::tempdir().unwrap();
    let cp_dir = tmp.path().join("cp");
    let mut cp = ControlPlane::start_dev_with(&cp_dir, KEEPALIVE).unwrap();
    let proxy = tls_proxy(&cp, &cp_dir);
    // Only the stream brings it back, so the missed events must come from the resume.
    let a = stream_only_node(&cp, tmp.path(), "a", &proxy.url());
    let (proc, before) = start(&a);
    let last_before = before["last_event_id"].as_u64().unwrap();

    // The server goes away while the node is connected, and comes back on another port.
    proxy.set_mode(Mode::Refuse);
    cp.proc.terminate(Duration::from_secs(15)).unwrap();
    let cp2 = ControlPlane::start_dev_with(&cp_dir, KEEPALIVE).unwrap();
    proxy.set_upstream(cp2.addr().unwrap());
    drop(cp);

    // Two nodes register while the node cannot reach the server: two events it has not seen.
    let first_missed = db_value(&cp_dir, "SELECT max(seq) FROM events").unwrap() + 1;
    let mut ips = Vec::new();
    for name in ["b", "c"] {
        let h = node(&cp2, tmp.path(), name, &cp2.url);
        let out = h.plexd(&["join"]).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        ips.push(h.identity().unwrap().1);
    }
    // State pulls stay refused (a pull the node had pending at the outage would otherwise race
    // the stream), so the peers can only come from the resumed stream.
    proxy.set_mode(Mode::RefuseStatePulls);

    let after = wait_until(BOUND, "the node applies both missed peers", || {
        Ok(a.status()?.filter(|s| {
            let peers = Host::peer_ips(s);
            s["event_stream_connected"] == true && ips.iter().all(|ip| peers.contains(ip))
        }))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n--- plexd:\n{}\n--- plexsphere:\n{}",
            proc.output(),
            cp2.proc.output()
        )
    });
    proxy.set_mode(Mode::Pass);
    assert!(after["last_event_id"].as_u64().unwrap() >= last_before + 2);
    // The stream was resumed from where the node was, before the missed events, not restarted
    // from scratch and not answered with a resync.
    let opened = cp2
        .proc
        .wait_for_line(BOUND, |l| l.contains("sse: stream opened"))
        .unwrap();
    let resumed = resumed_from(&opened).unwrap_or_else(|| panic!("not a resume: {opened}"));
    assert!(
        resumed >= last_before && resumed < first_missed,
        "resumed after {resumed}; the node had {last_before}, the first missed event is {first_missed}"
    );
    assert!(!cp2.proc.output().contains("sse: resync"), "{opened}");
}

#[test]
fn a_resume_from_before_the_replay_window_gets_a_resync_and_a_full_pull() {
    let tmp = tempfile::tempdir().unwrap();
    let cp_dir = tmp.path().join("cp");
    let cp = ControlPlane::start_dev_with(
        &cp_dir,
        &["--sse-keepalive-secs", "1", "--event-retention-secs", "1"],
    )
    .unwrap();
    let proxy = tls_proxy(&cp, &cp_dir);
    // The resume itself must lead to the full pull.
    let a = stream_only_node(&cp, tmp.path(), "a", &proxy.url());
    let (proc, _) = start(&a);

    proxy.set_mode(Mode::Refuse);
    let b = node(&cp, tmp.path(), "b", &cp.url);
    assert!(b.plexd(&["join"]).unwrap().status.success());
    let b_ip = b.identity().unwrap().1;
    // Wait until the server pruned every event up to b's arrival out of its replay window.
    let head = db_value(&cp_dir, "SELECT max(seq) FROM events").unwrap();
    wait_until(BOUND, "the missed event is pruned", || {
        let pruned = db_value(&cp_dir, "SELECT max(pruned_through) FROM domain_events")?;
        Ok((pruned >= head).then_some(()))
    })
    .unwrap();
    // The stream may reconnect, state pulls may not: the node learns of the gap from the
    // resync alone.
    proxy.set_mode(Mode::RefuseStatePulls);
    cp.proc
        .wait_for_line(BOUND, |l| l.contains("sse: resync"))
        .unwrap();
    proc.wait_for_line(BOUND, |l| l.contains("resync")).unwrap();
    assert!(
        !Host::peer_ips(&a.status().unwrap().unwrap()).contains(&b_ip),
        "no pull went through yet, so the node cannot know b"
    );

    proxy.set_mode(Mode::Pass);
    wait_until(
        BOUND,
        "the node pulls the full state with the new peer",
        || Ok(a.status()?.filter(|s| Host::peer_ips(s).contains(&b_ip))),
    )
    .unwrap_or_else(|e| panic!("{e}\n--- plexd:\n{}", proc.output()));
}

#[test]
fn a_silent_proxy_is_noticed_and_the_stream_reopened() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev_with(&tmp.path().join("cp"), KEEPALIVE).unwrap();
    let proxy = Proxy::start(cp.addr().unwrap()).unwrap();
    let a = node(&cp, tmp.path(), "a", &proxy.url());
    let (proc, _) = start(&a);

    let before = proxy.connections();
    proxy.set_mode(Mode::Silent);
    // The node tears the silent stream down after its stall timeout (3 s here) and dials again.
    proc.wait_for_line(BOUND, |l| l.contains("event stream disconnected"))
        .unwrap();
    wait_until(BOUND, "the node dials again", || {
        Ok((proxy.connections() > before).then_some(()))
    })
    .unwrap();
    proxy.set_mode(Mode::Pass);
    let b = node(&cp, tmp.path(), "b", &cp.url);
    assert!(b.plexd(&["join"]).unwrap().status.success());
    let b_ip = b.identity().unwrap().1;
    wait_until(BOUND, "the reopened stream delivers the new peer", || {
        Ok(a.status()?
            .filter(|s| s["event_stream_connected"] == true && Host::peer_ips(s).contains(&b_ip)))
    })
    .unwrap();
}

#[test]
fn tampered_state_and_events_are_refused_and_the_last_good_state_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let cp_dir = tmp.path().join("cp");
    let cp = ControlPlane::start_dev_with(&cp_dir, KEEPALIVE).unwrap();
    let proxy = tls_proxy(&cp, &cp_dir);
    let a = node(&cp, tmp.path(), "a", &proxy.url());
    let (proc, _) = start(&a);

    proxy.set_mode(Mode::FlipSignatures);
    // Everything signed from here on reaches the node tampered. Its own endpoint report may
    // still move the head before b arrives, so "kept" means: never past the head as it stood
    // when tampering began, and nothing of b.
    let untampered = db_value(&cp_dir, "SELECT max(seq) FROM events").unwrap();
    let b = node(&cp, tmp.path(), "b", &cp.url);
    assert!(b.plexd(&["join"]).unwrap().status.success());
    let b_ip = b.identity().unwrap().1;
    wait_until(BOUND, "a tampered document reaches the node", || {
        Ok((proxy.flips() > 0).then_some(()))
    })
    .unwrap();
    proc.wait_for_line(BOUND, |l| l.contains("signature"))
        .unwrap();
    let during = a.status().unwrap().unwrap();
    for field in ["state_version", "last_event_id"] {
        let applied = during[field].as_u64().unwrap();
        assert!(
            applied <= untampered,
            "the last good state is kept: {field} {applied} is past {untampered}, the head before tampering"
        );
    }
    assert!(
        !Host::peer_ips(&during).contains(&b_ip),
        "nothing from a tampered document is applied"
    );

    proxy.set_mode(Mode::Pass);
    wait_until(BOUND, "the untampered state arrives", || {
        Ok(a.status()?.filter(|s| Host::peer_ips(s).contains(&b_ip)))
    })
    .unwrap();
}

#[test]
fn an_ingest_batch_whose_answer_was_lost_is_sent_again_and_stored_once() {
    let tmp = tempfile::tempdir().unwrap();
    let cp_dir = tmp.path().join("cp");
    let cp = ControlPlane::start_dev_with(&cp_dir, KEEPALIVE).unwrap();
    let proxy = tls_proxy(&cp, &cp_dir);
    let every_second = FAST.replace(
        "state_poll_secs: 2\n",
        "state_poll_secs: 2\n    ingest_secs: 1\n",
    );
    let a = node_with(&cp, tmp.path(), "a", &proxy.url(), &every_second);
    let (proc, _) = start(&a);
    let a_id = a.identity().unwrap().0;

    // Tampered documents give the node errors to report; the server stores the batch, but the
    // answers never reach the node.
    proxy.lose_ingest_answers(true);
    proxy.set_mode(Mode::FlipSignatures);
    let b = node(&cp, tmp.path(), "b", &cp.url);
    assert!(b.plexd(&["join"]).unwrap().status.success());
    wait_until(BOUND, "two ingest answers are lost", || {
        Ok((proxy.lost_answers() >= 2).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- plexd:\n{}", proc.output()));
    let lost = proxy.ingests();
    let batch = lost[0].clone();
    assert!(batch.observations > 0, "{lost:?}");
    let waiting = a.status().unwrap().unwrap()["ingest"]["waiting"]
        .as_u64()
        .unwrap();
    assert!(
        waiting >= batch.observations as u64,
        "plexd status counts the unacknowledged batch as waiting: {waiting}"
    );
    assert!(
        lost.iter().all(|i| *i == batch),
        "every try is the same batch: {lost:?}"
    );

    proxy.lose_ingest_answers(false);
    proxy.set_mode(Mode::Pass);
    let tries = wait_until(
        BOUND,
        "the batch is sent again with its answer let through",
        || {
            let tries = proxy.ingests().iter().filter(|i| **i == batch).count();
            Ok((tries > lost.len()).then_some(tries))
        },
    )
    .unwrap();
    // Every try after the first reached the server and was recognised as a copy.
    wait_until(BOUND, "the server recognises every copy", || {
        let copies = cp
            .proc
            .output()
            .lines()
            .filter(|l| l.contains("not stored twice") && l.contains(&batch.batch_id))
            .count();
        Ok((copies == tries - 1).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- plexsphere:\n{}", cp.proc.output()));
    wait_until(BOUND, "every distinct batch is stored once", || {
        let distinct: std::collections::HashMap<String, usize> = proxy
            .ingests()
            .into_iter()
            .map(|i| (i.batch_id, i.observations))
            .collect();
        let expected = distinct.values().sum::<usize>() as u64;
        let stored = db_value(
            &cp_dir,
            &format!("SELECT count(*) FROM observations WHERE node_id = '{a_id}'"),
        )?;
        Ok((stored == expected).then_some(()))
    })
    .unwrap();
}

#[test]
fn a_cold_start_without_the_control_plane_applies_the_cached_state() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cp = ControlPlane::start_dev_with(&tmp.path().join("cp"), KEEPALIVE).unwrap();
    let a = node(&cp, tmp.path(), "a", &cp.url);
    let b = node(&cp, tmp.path(), "b", &cp.url);
    assert!(b.plexd(&["join"]).unwrap().status.success());
    let b_ip = b.identity().unwrap().1;
    let (mut proc, _) = start(&a);
    wait_until(BOUND, "the node has its peer", || {
        Ok(a.status()?.filter(|s| Host::peer_ips(s).contains(&b_ip)))
    })
    .unwrap();
    proc.terminate(Duration::from_secs(15)).unwrap();
    cp.proc.terminate(Duration::from_secs(15)).unwrap();

    // The control plane is down; the restarted node comes up on its cached state.
    let proc = a.start_daemon().unwrap();
    let status = wait_until(BOUND, "the daemon answers with its cached peers", || {
        Ok(a.status()?.filter(|s| Host::peer_ips(s).contains(&b_ip)))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- plexd output:\n{}", proc.output()));
    assert_eq!(status["api"]["reachable"], false);
    assert_eq!(status["event_stream_connected"], false);
}

#[test]
fn revocation_and_leave_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev_with(&tmp.path().join("cp"), KEEPALIVE).unwrap();
    let hosts: Vec<Host> = ["a", "b", "c"]
        .iter()
        .map(|n| node(&cp, tmp.path(), n, &cp.url))
        .collect();
    let mut procs = Vec::new();
    for h in &hosts {
        procs.push(start(h).0);
    }
    let ids: Vec<(String, String)> = hosts.iter().map(|h| h.identity().unwrap()).collect();
    wait_until(BOUND, "every node sees the two others", || {
        for h in &hosts {
            let Some(s) = h.status()? else {
                return Ok(None);
            };
            if Host::peer_ips(&s).len() != 2 {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .unwrap();

    // Revoke a: it stops (exit 15), and the others drop it as a peer.
    cp.plexctl_ok(&["node", "revoke", &ids[0].0, "--yes"])
        .unwrap();
    let exit = wait_until(BOUND, "the revoked daemon exits", || procs[0].try_exit()).unwrap();
    assert_eq!(exit.code(), Some(15), "{}", procs[0].output());
    wait_until(BOUND, "b and c drop the revoked node", || {
        for h in &hosts[1..] {
            let Some(s) = h.status()? else {
                return Ok(None);
            };
            if Host::peer_ips(&s).contains(&ids[0].1) {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .unwrap();
    assert_eq!(cp.node(&ids[0].0).unwrap()["status"], "revoked");

    // b leaves through its running daemon: the server forgets it, c drops it, b's identity is gone.
    let out = hosts[1].plexd(&["leave"]).unwrap();
    assert!(
        out.status.success(),
        "plexd leave: {}\n{}\n--- b's daemon:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        procs[1].output()
    );
    assert!(!hosts[1].state_dir().join("identity.json").exists());
    assert!(
        cp.plexctl(&["node", "get", &ids[1].0])
            .unwrap()
            .status
            .code()
            != Some(0)
    );
    wait_until(BOUND, "c drops the node that left", || {
        Ok(hosts[2].status()?.filter(|s| Host::peer_ips(s).is_empty()))
    })
    .unwrap();
}
