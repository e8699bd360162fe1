//! What the daemon tests (`tests/daemon*.rs`) share: nodes of the lab-nodes Project with fast
//! timings and `wireguard.backend: none`, starting a daemon until its stream is connected, a
//! TLS-terminating proxy in front of a control plane, and reading the control plane's state.

// Test support, as in the test files these helpers came from: a failed unwrap fails the test.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::proxy::Proxy;
use crate::{ControlPlane, Host, LAB_NODES_PROJECT, Proc, wait_until};

/// The control planes of these tests send a keep-alive every second.
pub const KEEPALIVE: &[&str] = &["--sse-keepalive-secs", "1"];

pub const BOUND: Duration = Duration::from_secs(60);

/// Fast daemon timings for tests: heartbeats every second, stalls noticed after 3 s.
pub const FAST: &str = "wireguard:\n  backend: none\ndaemon:\n  stall_timeout_secs: 3\n  backoff_initial_ms: 200\n  backoff_cap_secs: 2\n  intervals:\n    heartbeat_secs: 1\n    state_poll_secs: 2\n";

/// A node of the lab-nodes Project with the config section `daemon`, against `api_url`, with a
/// fresh token.
pub fn node_with(
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
pub fn node(cp: &ControlPlane, root: &std::path::Path, name: &str, api_url: &str) -> Host {
    node_with(cp, root, name, api_url, FAST)
}

/// A node whose only way back after an outage is its event stream: no heartbeat or state poll
/// for an hour, so what it learns after the outage it learns by resuming the stream.
pub fn stream_only_node(
    cp: &ControlPlane,
    root: &std::path::Path,
    name: &str,
    api_url: &str,
) -> Host {
    let slow = FAST
        .replace("heartbeat_secs: 1", "heartbeat_secs: 3600")
        .replace("state_poll_secs: 2", "state_poll_secs: 3600");
    node_with(cp, root, name, api_url, &slow)
}

/// Starts the daemon and waits until it is enrolled and its event stream is connected.
pub fn start(host: &Host) -> (Proc, serde_json::Value) {
    let proc = host.start_daemon().unwrap();
    let status = wait_until(BOUND, "the daemon's event stream connects", || {
        Ok(host
            .status()?
            .filter(|s| s["event_stream_connected"] == true && !s["state_version"].is_null()))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- plexd output:\n{}", proc.output()));
    (proc, status)
}

/// A proxy in front of `cp` that terminates TLS with the lab certificate, so it can refuse
/// state pulls alone.
pub fn tls_proxy(cp: &ControlPlane, cp_dir: &std::path::Path) -> Proxy {
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
pub fn db_value(cp_dir: &std::path::Path, sql: &str) -> anyhow::Result<u64> {
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
pub fn resumed_from(opened: &str) -> Option<u64> {
    let rest = opened.split("last_event_id=Some(\"").nth(1)?;
    rest.split('"').next()?.parse().ok()
}
