//! The plexd daemon's life against the real control plane, across processes: heartbeats and
//! online/offline, an ingest batch whose answer was lost, the offline cold start, revocation
//! and leave. The event stream's tests are in daemon.rs.
//!
//! The nodes run with `wireguard.backend: none` (control plane only).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use plexsphere_e2e::daemon::*;
use plexsphere_e2e::proxy::Mode;
use plexsphere_e2e::{ControlPlane, Host, wait_until};

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
