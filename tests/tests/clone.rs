//! Clone detection across processes: a node's state dir copied to a second host (a golden
//! image made after enrolment) refuses to run there, by its own host check and, when that is
//! skipped, by the control plane's; the operator sees the clone in `plexctl node get` and
//! `node list`; the original keeps heartbeating and pulling state throughout.
//!
//! The hosts are temporary roots with their own machine-id files (`PLEXD_MACHINE_ID_FILE`)
//! and `wireguard.backend: none`: this is about what crosses the API.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::process::Command;

use plexsphere_e2e::daemon::*;
use plexsphere_e2e::{ControlPlane, Host, LAB_NODES_PROJECT, Proc, wait_until};

const X: &str = "3d1219c7c4c5404aaa1f6d2a48adfda4";
const Y: &str = "0f5f1c0b2a7e4d3c9b8a796857463524";
/// plexd's exit status for a state dir enrolled on another host.
const CLONED: i32 = 16;

/// Waits for `proc` to exit and returns its status code.
fn exit_code(proc: &mut Proc) -> i32 {
    let status = wait_until(BOUND, "the copy's plexd exits", || proc.try_exit())
        .unwrap_or_else(|e| panic!("{e}\n--- plexd on the copy:\n{}", proc.output()));
    status.code().unwrap_or(-1)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    let out = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_copied_state_dir_is_refused_and_the_original_keeps_working() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev_with(&tmp.path().join("cp"), KEEPALIVE).unwrap();
    let a = node(&cp, tmp.path(), "a", &cp.url);
    a.write_machine_id(X).unwrap();
    let (proc_a, status) = start(&a);
    let id = status["node_id"].as_str().unwrap().to_owned();
    assert!(a.state_dir().join("host.json").exists());

    // The golden image: a second host with a copy of a's state dir and its own machine id.
    let b = Host::new(&tmp.path().join("b")).unwrap();
    b.write_config(&cp.url, &cp.ca_file(), LAB_NODES_PROJECT, "b", FAST)
        .unwrap();
    b.write_machine_id(Y).unwrap();
    copy_dir(&a.state_dir(), &b.state_dir());

    // Its own host check refuses it, with the line that says what to do, and exit 16 (which
    // the unit does not restart).
    let mut copy = b.start_daemon().unwrap();
    assert_eq!(exit_code(&mut copy), CLONED, "{}", copy.output());
    let out = copy.output();
    let dir = b.state_dir().display().to_string();
    assert!(
        out.contains("was enrolled on another host (copied? golden image?)")
            && out.contains(&format!("remove {dir} and enrol it with its own token"))
            && out.contains("plexd join"),
        "{out}"
    );
    // `plexd join` on the copy refuses too, rather than claiming it is enrolled.
    let join = b.plexd(&["join"]).unwrap();
    assert_eq!(join.status.code(), Some(CLONED));
    drop(copy);

    // A tampered copy that skips the local check (its binding removed, so it binds to this
    // host): the control plane refuses the credential from the second host.
    std::fs::remove_file(b.state_dir().join("host.json")).unwrap();
    let mut copy = b.start_daemon().unwrap();
    assert_eq!(exit_code(&mut copy), CLONED, "{}", copy.output());
    let out = copy.output();
    assert!(
        out.contains("the control plane refused its credential from this host (clone_refused)")
            && out.contains(&format!("remove {dir}")),
        "{out}"
    );
    drop(copy);

    // The operator sees it.
    let view = cp.node(&id).unwrap();
    assert!(view["clone"]["requests"].as_u64().unwrap() >= 1, "{view}");
    assert_eq!(view["clone"]["last_addr"], "127.0.0.1", "{view}");
    let get = cp.plexctl_ok(&["node", "get", &id]).unwrap();
    assert!(
        get.contains("clone suspected:") && get.contains("requests from 127.0.0.1"),
        "{get}"
    );
    let list = cp.plexctl_ok(&["node", "list"]).unwrap();
    let line = list.lines().find(|l| l.starts_with(&id)).unwrap();
    assert!(line.contains("+clone"), "{list}");

    // The original keeps working: its heartbeats move on, its stream stays up, it pulls state.
    let before = view["last_heartbeat_at"].as_str().unwrap().to_owned();
    wait_until(
        BOUND,
        "the original heartbeats after the clone was refused",
        || {
            let n = cp.node(&id)?;
            Ok(
                (n["last_heartbeat_at"].as_str() != Some(&before) && n["status"] == "online")
                    .then_some(()),
            )
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n--- plexd a:\n{}", proc_a.output()));
    let later = a.status().unwrap().unwrap();
    assert_eq!(later["event_stream_connected"], true, "{later}");
    assert!(!later["state_version"].is_null(), "{later}");
    // A new peer reaches it: state still flows to the original.
    let c = node(&cp, tmp.path(), "c", &cp.url);
    assert!(c.plexd(&["join"]).unwrap().status.success());
    let c_ip = c.identity().unwrap().1;
    wait_until(BOUND, "the original learns of a new peer", || {
        Ok(a.status()?.filter(|s| Host::peer_ips(s).contains(&c_ip)))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- plexd a:\n{}", proc_a.output()));
}

/// Issue 24: a copy that runs no plexd at all. It reads what the state dir holds (the
/// credential in identity.json, the binding in host.json) and calls the API with them. Before
/// the fix host.json held the very `Plexd-Host` value plexd sends, so the copy was taken for
/// the same host: it rotated the credential (no proof of the key was asked either), and the
/// original was locked out with no clone recorded.
#[test]
fn a_copy_that_sends_what_the_state_dir_holds_is_a_clone_and_cannot_rotate_the_credential() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev_with(&tmp.path().join("cp"), KEEPALIVE).unwrap();
    let a = node(&cp, tmp.path(), "a", &cp.url);
    a.write_machine_id(X).unwrap();
    let (proc_a, status) = start(&a);
    let id = status["node_id"].as_str().unwrap().to_owned();

    let copy = tmp.path().join("copy");
    copy_dir(&a.state_dir(), &copy);
    let read = |name: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(copy.join(name)).unwrap()).unwrap()
    };
    let credential = read("identity.json")["node_credential"]
        .as_str()
        .unwrap()
        .to_owned();
    let held = read("host.json")["fingerprint"]
        .as_str()
        .unwrap()
        .to_owned();

    let http = plexsphere_e2e::ha_client::client(&cp.ca_file()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let call = |method: reqwest::Method, tail: &str| {
        let r = http
            .request(method, format!("{}/v1/nodes/{id}{tail}", cp.url))
            .bearer_auth(&credential)
            .header(plexsphere_wire::host::HOST_HEADER, &held)
            .json(&serde_json::json!({}))
            .send();
        rt.block_on(async {
            let r = r.await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<serde_json::Value>().await.unwrap())
        })
    };
    let (s, body) = call(reqwest::Method::POST, "/credential");
    assert_eq!(
        (s, body["code"].as_str()),
        (409, Some("clone_refused")),
        "{body}"
    );
    let (s, body) = call(reqwest::Method::GET, "/key");
    assert_eq!(
        (s, body["code"].as_str()),
        (409, Some("clone_refused")),
        "{body}"
    );

    // Recorded as a clone; the credential is the original's.
    let view = cp.node(&id).unwrap();
    assert!(view["clone"]["requests"].as_u64().unwrap() >= 1, "{view}");
    assert!(view["credential_rotated_at"].is_null(), "{view}");
    // The original keeps working.
    let before = view["last_heartbeat_at"].as_str().unwrap().to_owned();
    wait_until(
        BOUND,
        "the original heartbeats after the copy was refused",
        || {
            let n = cp.node(&id)?;
            Ok(
                (n["last_heartbeat_at"].as_str() != Some(&before) && n["status"] == "online")
                    .then_some(()),
            )
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n--- plexd a:\n{}", proc_a.output()));
}
