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

/// A control plane that keeps events for one second (so a resume soon gets a resync), behind a
/// TLS-terminating proxy.
fn short_window(cp_dir: &std::path::Path) -> (ControlPlane, Proxy) {
    let cp = ControlPlane::start_dev_with(
        cp_dir,
        &["--sse-keepalive-secs", "1", "--event-retention-secs", "1"],
    )
    .unwrap();
    let proxy = tls_proxy(&cp, cp_dir);
    (cp, proxy)
}

#[test]
fn a_resume_from_before_the_replay_window_gets_a_resync_and_a_full_pull() {
    let tmp = tempfile::tempdir().unwrap();
    let cp_dir = tmp.path().join("cp");
    let (cp, proxy) = short_window(&cp_dir);
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

/// Where [`record`] asks: the server's URL and CA, and the node's state directory.
struct Recorder {
    url: String,
    ca: std::path::PathBuf,
    state_dir: std::path::PathBuf,
    /// The node's `Plexd-Host` (computed from its machine id: the state dir does not hold it).
    host: String,
}

/// Records what the real server answers the node with its own credential (an attacker on the
/// transport sees the same plaintext): `curl` against `path` with `extra` headers.
fn record(r: &Recorder, path: &str, extra: &[&str], secs: u32) -> Vec<u8> {
    let identity: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(r.state_dir.join("identity.json")).unwrap())
            .unwrap();
    let (id, credential) = (
        identity["node_id"].as_str().unwrap(),
        identity["node_credential"].as_str().unwrap(),
    );
    // The node's host binding travels with every call: an attacker on the path sees it too.
    let fingerprint = &r.host;
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sN", "--max-time", &secs.to_string(), "--cacert"])
        .arg(&r.ca)
        .args(["-H", &format!("Authorization: Bearer {credential}")])
        .args(["-H", &format!("Plexd-Host: {fingerprint}")]);
    for h in extra {
        cmd.args(["-H", h]);
    }
    let out = cmd
        .arg(format!(
            "{}/v1/nodes/{id}{path}",
            r.url.trim_end_matches('/')
        ))
        .output()
        .unwrap();
    // 28: --max-time ended a stream, which is how a stream recording ends.
    assert!(
        out.status.success() || out.status.code() == Some(28),
        "curl {path}: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The attack: a TLS-terminating proxy records the node's signed state and event
/// frames while a peer is in the mesh, the peer is revoked, and the proxy then answers every
/// state pull with the recorded state and every stream with a recorded (older) resync and the
/// recorded `peer_added`. The node must keep the revocation: none of it is newer than what it
/// applied. (Before the fix the resync reset the node's position and the old state applied.)
#[test]
fn a_replaying_proxy_cannot_roll_a_node_back_past_a_revocation() {
    let tmp = tempfile::tempdir().unwrap();
    let cp_dir = tmp.path().join("cp");
    let (cp, proxy) = short_window(&cp_dir);
    let a = node(&cp, tmp.path(), "a", &proxy.url());
    let (proc, before) = start(&a);
    let rec = Recorder {
        url: cp.url.clone(),
        ca: cp.ca_file(),
        state_dir: a.state_dir(),
        host: a
            .sent_fingerprint(before["node_id"].as_str().unwrap())
            .unwrap(),
    };

    // Record the live stream while b joins: its signed peer_added.
    let from = format!(
        "Last-Event-ID: {}",
        before["last_event_id"].as_u64().unwrap()
    );
    let stream = std::thread::scope(|s| {
        let recording = s.spawn(|| record(&rec, "/events", &[&from], 8));
        std::thread::sleep(Duration::from_secs(2));
        let b = node(&cp, tmp.path(), "b", &cp.url);
        assert!(b.plexd(&["join"]).unwrap().status.success());
        (recording.join().unwrap(), b)
    });
    let (frames_b, b) = stream;
    let (b_id, b_ip) = b.identity().unwrap();
    assert!(
        String::from_utf8_lossy(&frames_b).contains("peer_added"),
        "the recording holds b's arrival: {}",
        String::from_utf8_lossy(&frames_b)
    );
    wait_until(BOUND, "a applies b", || {
        Ok(a.status()?.filter(|s| Host::peer_ips(s).contains(&b_ip)))
    })
    .unwrap();
    // The signed state with b in it.
    let state_with_b = record(&rec, "/state", &[], 10);
    assert!(String::from_utf8_lossy(&state_with_b).contains("signature"));
    // A signed resync, got by resuming from an id the server no longer keeps.
    let head = db_value(&cp_dir, "SELECT max(seq) FROM events").unwrap();
    wait_until(BOUND, "the server prunes its replay window", || {
        let pruned = db_value(&cp_dir, "SELECT max(pruned_through) FROM domain_events")?;
        Ok((pruned >= head).then_some(()))
    })
    .unwrap();
    let resync = record(&rec, "/events", &["Last-Event-ID: 1"], 3);
    assert!(
        String::from_utf8_lossy(&resync).contains("resync"),
        "{}",
        String::from_utf8_lossy(&resync)
    );

    // b is revoked; a drops it.
    cp.plexctl_ok(&["node", "revoke", &b_id, "--yes"]).unwrap();
    let revoked = wait_until(BOUND, "a drops the revoked b", || {
        Ok(a.status()?.filter(|s| !Host::peer_ips(s).contains(&b_ip)))
    })
    .unwrap();

    // From now on the proxy replays the recordings; cut what is open first.
    let mut frames = resync;
    frames.extend_from_slice(&frames_b);
    proxy.set_replay(state_with_b, frames);
    proxy.set_mode(Mode::Refuse);
    wait_until(BOUND, "a's stream is cut", || {
        Ok(a.status()?.filter(|s| s["event_stream_connected"] == false))
    })
    .unwrap();
    proxy.set_mode(Mode::Replay);
    // The node holds a replayed stream open (it sends keep-alives) and refuses what it carries;
    // its state pulls keep getting the recorded state.
    wait_until(BOUND, "the proxy replays pulls and a stream", || {
        let (states, streams) = proxy.replayed();
        Ok((states >= 3 && streams >= 1).then_some(()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e} (replayed {:?})\n--- plexd:\n{}",
            proxy.replayed(),
            proc.output()
        )
    });

    let during = a.status().unwrap().unwrap();
    assert!(
        !Host::peer_ips(&during).contains(&b_ip),
        "the replay brought the revoked peer back:\n{}",
        proc.output()
    );
    for field in ["state_version", "last_event_id"] {
        assert!(
            during[field].as_u64().unwrap() >= revoked[field].as_u64().unwrap(),
            "{field} went back from {} to {}",
            revoked[field],
            during[field]
        );
    }
    let log = proc.output();
    assert!(
        log.contains("refused a state document") && log.contains("older than the applied"),
        "the node says why it refused the replayed state:\n{log}"
    );
    assert!(
        log.contains("refused a resync at seq"),
        "the node says why it refused the replayed resync:\n{log}"
    );

    // The real server again: a keeps working.
    proxy.set_mode(Mode::Pass);
    wait_until(BOUND, "a's stream connects again", || {
        Ok(a.status()?.filter(|s| s["event_stream_connected"] == true))
    })
    .unwrap();
    assert!(!Host::peer_ips(&a.status().unwrap().unwrap()).contains(&b_ip));
}
