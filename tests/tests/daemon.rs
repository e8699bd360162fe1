//! The plexd daemon against the real control plane, across processes: the event stream
//! through server restarts, a resume from before the replay window, silent proxies and
//! tampering. Heartbeats, the offline cold start, revocation and leave, and an ingest batch
//! whose answer was lost are in daemon_lifecycle.rs; the helpers in plexsphere_e2e::daemon.
//!
//! The nodes run with `wireguard.backend: none` (control plane only): these tests are about
//! what crosses the API. The mesh itself is tested in mesh.rs.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use plexsphere_e2e::daemon::*;
use plexsphere_e2e::proxy::{Mode, Proxy};
use plexsphere_e2e::{ControlPlane, Host, wait_until};

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
