//! The real binaries on the multi-replica store: `plexsphere dev --database-url postgres://...`
//! on a scratch database of the Postgres that `scripts/test` starts
//! (`PLEXSPHERE_TEST_POSTGRES_URL`), and two plexd daemons that enrol, heartbeat, learn of each
//! other over the event stream, and see one of them leave. Under `CI` a missing Postgres is a
//! failure, not a skip.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::process::Command;
use std::time::Duration;

use plexsphere_e2e::{ControlPlane, Host, LAB_NODES_PROJECT, wait_until};

const BOUND: Duration = Duration::from_secs(60);

const DAEMON: &str = "wireguard:\n  backend: none\ndaemon:\n  intervals:\n    heartbeat_secs: 1\n    state_poll_secs: 2\n";

/// A scratch database on the test server, dropped when the guard goes.
struct ScratchDb {
    admin: String,
    name: String,
    url: String,
}

impl ScratchDb {
    fn create() -> Option<Self> {
        let url = std::env::var("PLEXSPHERE_TEST_POSTGRES_URL").ok();
        let Some(admin) = url.filter(|u| !u.is_empty()) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but PLEXSPHERE_TEST_POSTGRES_URL is not: scripts/test starts a Postgres for this test"
            );
            eprintln!("skipping: set PLEXSPHERE_TEST_POSTGRES_URL (scripts/test does)");
            return None;
        };
        let name = format!("plexsphere_e2e_{}", std::process::id());
        psql(&admin, &format!("DROP DATABASE IF EXISTS {name}"));
        psql(&admin, &format!("CREATE DATABASE {name}"));
        // postgres://user@host:port/<db>?params: the same server, the scratch database.
        let (base, params) = admin.split_once('?').unwrap_or((&admin, ""));
        let server = base.rsplit_once('/').map_or(base, |(s, _)| s);
        let url = if params.is_empty() {
            format!("{server}/{name}")
        } else {
            format!("{server}/{name}?{params}")
        };
        Some(Self { admin, name, url })
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                &self.admin,
                "-qc",
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            ])
            .output();
    }
}

/// Runs `sql` on `url`; answers what it printed (unaligned, tuples only).
fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qAtc", sql])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn node(cp: &ControlPlane, root: &std::path::Path, name: &str) -> Host {
    let host = Host::new(&root.join(name)).unwrap();
    host.write_config(&cp.url, &cp.ca_file(), LAB_NODES_PROJECT, name, DAEMON)
        .unwrap();
    host.write_token(&cp.issue_token(LAB_NODES_PROJECT).unwrap())
        .unwrap();
    host
}

#[test]
fn daemons_enrol_meet_and_leave_on_a_postgres_control_plane() {
    let Some(db) = ScratchDb::create() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev_with(
        &tmp.path().join("cp"),
        &["--database-url", &db.url, "--sse-keepalive-secs", "1"],
    )
    .unwrap();
    assert!(
        !tmp.path().join("cp/plexsphere.db").exists(),
        "no SQLite file: the store is Postgres"
    );
    let a = node(&cp, tmp.path(), "a");
    let b = node(&cp, tmp.path(), "b");
    let pa = a.start_daemon().unwrap();
    let mut pb = b.start_daemon().unwrap();
    let ip = |h: &Host| {
        wait_until(BOUND, "the node enrols", || Ok(h.identity().ok()))
            .unwrap()
            .1
    };
    let (a_ip, b_ip) = (ip(&a), ip(&b));
    for (h, peer, proc) in [(&a, &b_ip, &pa), (&b, &a_ip, &pb)] {
        wait_until(BOUND, "each node has the other as a peer", || {
            Ok(h.status()?.filter(|s| {
                s["event_stream_connected"] == true && Host::peer_ips(s).contains(peer)
            }))
        })
        .unwrap_or_else(|e| panic!("{e}\n--- plexd:\n{}", proc.output()));
    }
    let b_id = b.identity().unwrap().0;
    wait_until(BOUND, "the control plane shows b online", || {
        Ok(Some(cp.node(&b_id)?).filter(|n| n["status"] == "online"))
    })
    .unwrap();

    // b leaves: the row goes from Postgres, and a hears of it over its stream.
    let out = b.plexd(&["leave"]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(BOUND, "the leaving daemon exits", || pb.try_exit()).unwrap();
    wait_until(BOUND, "a drops b", || {
        Ok(a.status()?.filter(|s| !Host::peer_ips(s).contains(&b_ip)))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- plexd a:\n{}", pa.output()));
    let list = cp
        .plexctl_ok(&["node", "list", "--output", "json"])
        .unwrap();
    assert!(!list.contains(&b_id), "{list}");
    let a_id = a.identity().unwrap().0;
    assert!(list.contains(&a_id), "{list}");
    assert_eq!(
        psql(&db.url, "SELECT id FROM nodes"),
        a_id,
        "the rows are in Postgres"
    );
}
