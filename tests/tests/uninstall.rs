//! `plexd uninstall` end to end, across processes: the node leaves through its running daemon
//! (or directly), then the unit, the state dir and with `--purge` the config go; a node that
//! cannot leave is refused unless `--force`, which says how an operator removes it upstream.
//! The same under real systemd is in hand_install.rs.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use plexsphere_e2e::{ControlPlane, Host, LAB_NODES_PROJECT, Proc, wait_until};

const BOUND: Duration = Duration::from_secs(60);

fn text(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The runbook's install against `cp`, with a registration and no WireGuard interface.
fn installed(cp: &ControlPlane, root: &std::path::Path) -> Host {
    let host = Host::new(root).unwrap();
    host.write_token(&cp.issue_token(LAB_NODES_PROJECT).unwrap())
        .unwrap();
    let out = host.install(&cp.url, Some(&cp.ca_file())).unwrap();
    assert!(out.status.success(), "install: {}", text(&out).1);
    let mut config = std::fs::read_to_string(host.config()).unwrap();
    config.push_str(&format!(
        "registration:\n  project_id: {LAB_NODES_PROJECT}\n  resource_handle: u\nwireguard:\n  backend: none\n"
    ));
    std::fs::write(host.config(), config).unwrap();
    host
}

/// Starts the daemon and waits until its event stream is connected.
fn start_connected(host: &Host) -> Proc {
    let proc = host.start_daemon().unwrap();
    wait_until(BOUND, "the daemon's event stream connects", || {
        Ok(host
            .status()?
            .filter(|s| s["event_stream_connected"] == true))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- plexd:\n{}", proc.output()));
    proc
}

/// Whether the control plane still has the node.
fn registered(cp: &ControlPlane, node_id: &str) -> bool {
    let out = cp
        .plexctl(&["node", "get", node_id, "--output", "json"])
        .unwrap();
    if out.status.success() {
        return true;
    }
    let (_, err) = text(&out);
    assert!(err.contains("not_found"), "{err}");
    false
}

#[test]
fn uninstall_leaves_through_the_running_daemon_and_purge_removes_the_config() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev(&tmp.path().join("cp")).unwrap();
    let host = installed(&cp, &tmp.path().join("host"));
    let mut proc = start_connected(&host);
    let node_id = host.identity().unwrap().0;
    assert!(registered(&cp, &node_id));

    let out = host.plexd(&["uninstall"]).unwrap();
    let (stdout, stderr) = text(&out);
    eprintln!("--- plexd uninstall:\n{stdout}{stderr}");
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("node {node_id} left the mesh: deregistered")),
        "{stdout}"
    );
    let unit = host.unit_dir().join("plexd.service");
    assert!(!unit.exists());
    assert!(
        stdout.contains(&format!("removed {}", unit.display())),
        "{stdout}"
    );
    assert!(!host.state_dir().exists(), "{stdout}");
    assert!(host.config().exists());
    assert!(
        stdout.contains(&format!(
            "kept {} (plexd uninstall --purge removes it)",
            host.config().display()
        )),
        "{stdout}"
    );
    assert!(!registered(&cp, &node_id));
    // The daemon left with the node and ended cleanly.
    let status = wait_until(BOUND, "the daemon exits", || proc.try_exit()).unwrap();
    assert!(status.success(), "{status}\n{}", proc.output());

    let out = host.plexd(&["uninstall", "--purge"]).unwrap();
    let (stdout, stderr) = text(&out);
    eprintln!("--- plexd uninstall --purge:\n{stdout}{stderr}");
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("this host is not enrolled"), "{stdout}");
    assert!(!host.config().exists());
    assert!(
        !host.etc().exists(),
        "the emptied config dir goes too: {stdout}"
    );
}

#[test]
fn a_node_that_cannot_leave_is_refused_unless_forced() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cp = ControlPlane::start_dev(&tmp.path().join("cp")).unwrap();
    let host = installed(&cp, &tmp.path().join("host"));
    let mut proc = start_connected(&host);
    let node_id = host.identity().unwrap().0;
    cp.proc.terminate(Duration::from_secs(15)).unwrap();

    // The control plane is down: nothing is removed, and the way on is named.
    let out = host.plexd(&["uninstall", "--purge"]).unwrap();
    let (stdout, stderr) = text(&out);
    eprintln!("--- plexd uninstall --purge:\n{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(13), "unreachable: {stdout}{stderr}");
    assert!(stderr.contains("nothing was removed"), "{stderr}");
    assert!(stderr.contains("plexd uninstall --force"), "{stderr}");
    assert!(host.state_dir().join("identity.json").exists());
    assert!(host.unit_dir().join("plexd.service").exists());
    assert!(host.config().exists());

    // --force will not pull the files from under a daemon it cannot stop.
    let out = host.plexd(&["uninstall", "--force"]).unwrap();
    let (stdout, stderr) = text(&out);
    eprintln!("--- plexd uninstall --force, the daemon running:\n{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(74), "{stdout}{stderr}");
    assert!(stderr.contains("plexd is still running"), "{stderr}");
    assert!(host.state_dir().join("identity.json").exists());
    assert!(host.unit_dir().join("plexd.service").exists());

    // Once it is stopped, --force removes plexd from the host and says the node is still
    // registered.
    proc.terminate(Duration::from_secs(15)).unwrap();
    let out = host.plexd(&["uninstall", "--force"]).unwrap();
    let (stdout, stderr) = text(&out);
    eprintln!("--- plexd uninstall --force:\n{stdout}{stderr}");
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("plexctl node revoke {node_id}")),
        "{stdout}"
    );
    assert!(!host.state_dir().exists(), "{stdout}");
    assert!(!host.unit_dir().join("plexd.service").exists());
    assert!(host.config().exists(), "no --purge: the config stays");
}
