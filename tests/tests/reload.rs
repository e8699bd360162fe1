//! `plexd run` re-reads its config on SIGHUP, against the real control plane: what can change
//! at run time (log level, intervals) applies at once; a config it cannot use is refused and
//! the running one kept; what needs a restart (wireguard) or a new enrolment (api_url) is
//! named and not half-applied.
//!
//! Heartbeats are counted on the server, in its `nodes.last_heartbeat_at` column: the node view
//! of `plexctl node get` has only `last_seen_at`, which every authenticated call moves.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use plexsphere_e2e::{ControlPlane, Host, LAB_NODES_PROJECT, Proc, wait_until};

const BOUND: Duration = Duration::from_secs(60);
const KEEPALIVE: &[&str] = &["--sse-keepalive-secs", "1"];
/// An origin where nothing listens.
const ELSEWHERE: &str = "https://127.0.0.1:9";

/// A control-plane-only node (`wireguard.backend: none`) with these heartbeat, state pull and
/// endpoint report intervals (seconds); `extra` is appended YAML (e.g. a `log:` section).
fn yaml(heartbeat: u32, state_poll: u32, endpoints: u32, extra: &str) -> String {
    format!(
        "wireguard:\n  backend: none\ndaemon:\n  intervals:\n    heartbeat_secs: {heartbeat}\n    state_poll_secs: {state_poll}\n    endpoint_report_secs: {endpoints}\n    ingest_secs: 3600\n{extra}"
    )
}

/// `plexd run` (with `flags`) without PLEXD_LOG from the test's environment, so `log.level`
/// decides unless a flag says otherwise.
fn spawn_daemon(host: &Host, flags: &[&str]) -> Proc {
    let mut cmd = host.command().unwrap();
    cmd.arg("run").args(flags).env_remove("PLEXD_LOG");
    Proc::spawn(cmd).unwrap()
}

/// One enrolled, running node against its own control plane.
struct Node {
    proc: Proc,
    cp: ControlPlane,
    host: Host,
    id: String,
    _tmp: tempfile::TempDir,
}

impl Node {
    /// Starts the node and waits until it is enrolled, its stream is connected and its first
    /// heartbeat was acknowledged.
    fn start(config: &str) -> Self {
        Self::start_with(config, &[])
    }

    /// [`Node::start`] with extra `plexd run` flags.
    fn start_with(config: &str, flags: &[&str]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let cp = ControlPlane::start_dev_with(&tmp.path().join("cp"), KEEPALIVE).unwrap();
        let host = Host::new(&tmp.path().join("a")).unwrap();
        host.write_config(&cp.url, &cp.ca_file(), LAB_NODES_PROJECT, "a", config)
            .unwrap();
        host.write_token(&cp.issue_token(LAB_NODES_PROJECT).unwrap())
            .unwrap();
        let mut node = Self {
            proc: spawn_daemon(&host, flags),
            cp,
            host,
            id: String::new(),
            _tmp: tmp,
        };
        node.id = node.running();
        node
    }

    /// Waits until the daemon answers, its stream is connected and a heartbeat was
    /// acknowledged; returns the node id.
    fn running(&self) -> String {
        let status = self.check(wait_until(BOUND, "the daemon is up", || {
            Ok(self.host.status()?.filter(|s| {
                s["event_stream_connected"] == true
                    && !s["state_version"].is_null()
                    && !s["last_heartbeat_age_secs"].is_null()
            }))
        }));
        status["node_id"].as_str().unwrap().to_owned()
    }

    /// Rewrites the node's config file (the daemon reads it on SIGHUP).
    fn configure(&self, api_url: &str, config: &str) {
        self.host
            .write_config(api_url, &self.cp.ca_file(), LAB_NODES_PROJECT, "a", config)
            .unwrap();
    }

    fn sighup(&self) {
        self.proc.signal("HUP").unwrap();
    }

    /// The next daemon output line matching `pred`.
    fn line(&self, pred: impl Fn(&str) -> bool) -> String {
        self.check(self.proc.wait_for_line(BOUND, pred))
    }

    /// The unwrap that shows the daemon's output on failure.
    fn check<T>(&self, r: anyhow::Result<T>) -> T {
        r.unwrap_or_else(|e| panic!("{e:#}\n--- plexd output:\n{}", self.proc.output()))
    }

    fn db(&self) -> PathBuf {
        self.cp.data_dir.join("plexsphere.db")
    }

    /// The server's time of the node's last heartbeat (unix seconds).
    fn last_heartbeat(&self) -> anyhow::Result<i64> {
        let sql = format!(
            "SELECT last_heartbeat_at FROM nodes WHERE id = '{}'",
            self.id
        );
        let out = Command::new("sqlite3").arg(self.db()).arg(&sql).output()?;
        anyhow::ensure!(
            out.status.success(),
            "sqlite3 {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
    }

    /// Waits until the server recorded `n` heartbeats (distinct seconds) later than `after`.
    fn heartbeats_after(&self, after: i64, n: usize) {
        let mut seen = BTreeSet::new();
        self.check(wait_until(
            BOUND,
            &format!("{n} more heartbeats reach the server"),
            || {
                let at = self.last_heartbeat()?;
                if at > after {
                    seen.insert(at);
                }
                Ok((seen.len() >= n).then_some(()))
            },
        ));
    }

    /// The daemon answers `plexd status` and keeps heartbeating to its control plane.
    fn still_heartbeating(&self) {
        let before = self.check(self.last_heartbeat());
        let status = self.check(self.host.status()).expect("the daemon answers");
        assert_eq!(status["node_id"], self.id.as_str());
        self.heartbeats_after(before, 2);
    }
}

#[test]
fn sighup_applies_a_new_heartbeat_interval_and_log_level() {
    // Hourly everything: after start-up nothing reaches the server until the reload.
    let n = Node::start(&yaml(3600, 3600, 3600, ""));
    let before = n.check(n.last_heartbeat());
    assert!(
        !n.proc.output().contains("DEBUG"),
        "the daemon starts at info: {}",
        n.proc.output()
    );

    n.configure(&n.cp.url, &yaml(1, 1, 3600, "log:\n  level: debug\n"));
    n.sighup();
    let reloaded = n.line(|l| l.contains("SIGHUP: config reloaded:"));
    assert!(
        reloaded.contains("log.level -> debug") && reloaded.contains("daemon (intervals"),
        "{reloaded}"
    );
    // Heartbeats every second now; they could not come from the hourly schedule.
    n.heartbeats_after(before, 2);
    // The state pull answers 304 every second, logged at debug only.
    n.line(|l| l.contains("DEBUG") && l.contains("state unchanged (304)"));
    assert_eq!(n.check(n.cp.node(&n.id))["status"], "online");
}

#[test]
fn a_log_level_from_the_command_line_outlasts_a_reload() {
    let n = Node::start_with(&yaml(1, 1, 3600, ""), &["--log-level", "info"]);

    n.configure(&n.cp.url, &yaml(1, 1, 3600, "log:\n  level: debug\n"));
    n.sighup();
    n.line(|l| {
        l.contains("SIGHUP: log.level changed to debug, but PLEXD_LOG/--log-level overrides it")
    });
    n.line(|l| l.contains("SIGHUP: config reloaded: log.level -> debug"));
    // A second's state pulls (304, debug only) and heartbeats pass, still at info.
    n.still_heartbeating();
    assert!(!n.proc.output().contains("DEBUG"), "{}", n.proc.output());
}

#[test]
fn an_unusable_config_is_refused_and_a_fixed_one_reloads() {
    let n = Node::start(&yaml(1, 1, 3600, ""));
    let file = n.host.config().display().to_string();

    std::fs::write(n.host.config(), "api_url: [never closed\n").unwrap();
    n.sighup();
    let refused = n.line(|l| l.contains("SIGHUP: the config was not reloaded:"));
    assert!(
        refused.contains(&file) && refused.contains("keeping the running config"),
        "{refused}"
    );
    n.still_heartbeating();

    n.configure(&n.cp.url, &yaml(1, 1, 3600, "heartbeat_every: 1\n"));
    n.sighup();
    let refused = n.line(|l| l.contains("SIGHUP: the config was not reloaded:"));
    assert!(
        refused.contains(&file) && refused.contains("heartbeat_every"),
        "{refused}"
    );
    n.still_heartbeating();
    assert!(!n.proc.output().contains("DEBUG"), "{}", n.proc.output());

    // Compared with the config that kept running, only the level differs.
    n.configure(&n.cp.url, &yaml(1, 1, 3600, "log:\n  level: debug\n"));
    n.sighup();
    let reloaded = n.line(|l| l.contains("SIGHUP: config reloaded"));
    assert!(
        reloaded.contains("config reloaded: log.level -> debug") && !reloaded.contains("daemon"),
        "{reloaded}"
    );
    n.line(|l| l.contains("DEBUG") && l.contains("state unchanged (304)"));
}

#[test]
fn a_changed_api_url_is_named_and_the_node_stays_with_its_control_plane() {
    let config = yaml(1, 3600, 3600, "");
    let mut n = Node::start(&config);

    n.configure(ELSEWHERE, &config);
    n.sighup();
    let warned = n.line(|l| l.contains("SIGHUP: api_url changed"));
    assert!(
        warned.contains(ELSEWHERE) && warned.contains(n.cp.url.trim_end_matches('/')),
        "names the new URL and the one in use: {warned}"
    );
    n.line(|l| l.contains("SIGHUP: config reloaded:") && l.contains("api_url"));
    n.still_heartbeating();
    let status = n.check(n.host.status()).unwrap();
    assert_eq!(status["api"]["url"], n.cp.url.as_str(), "{status}");
    assert_eq!(status["api"]["reachable"], true, "{status}");
    assert_eq!(n.check(n.cp.node(&n.id))["status"], "online");

    // A restart keeps the control plane the node registered with, as the warning says.
    let stopped = n.proc.terminate(Duration::from_secs(15));
    n.check(stopped);
    n.proc = spawn_daemon(&n.host, &[]);
    assert_eq!(n.running(), n.id);
    let status = n.check(n.host.status()).unwrap();
    assert_eq!(status["api"]["url"], n.cp.url.as_str(), "{status}");
    n.still_heartbeating();
}

#[test]
fn a_changed_wireguard_section_waits_for_a_restart() {
    // Endpoint reports every second, logged at debug with the port they advertise.
    let config = yaml(3600, 3600, 1, "log:\n  level: debug\n");
    let n = Node::start(&config);
    let interface = n.check(n.host.status()).unwrap()["interface"].clone();
    n.line(|l| l.contains("endpoints reported") && l.contains(":51820"));

    let changed = config.replace(
        "  backend: none\n",
        "  backend: none\n  listen_port: 51999\n  interface: plexd-next\n",
    );
    n.configure(&n.cp.url, &changed);
    n.sighup();
    n.line(|l| l.contains("SIGHUP: wireguard changed; it takes effect when plexd restarts"));
    n.line(|l| l.contains("SIGHUP: config reloaded:") && l.contains("wireguard"));
    // The second report after the reload started after it: still the port WireGuard uses.
    n.line(|l| l.contains("endpoints reported"));
    let report = n.line(|l| l.contains("endpoints reported"));
    assert!(
        report.contains(":51820") && !report.contains(":51999"),
        "{report}"
    );
    let view = n.check(n.cp.node(&n.id));
    assert!(!view["endpoints"].to_string().contains(":51999"), "{view}");
    let status = n.check(n.host.status()).unwrap();
    assert_eq!(status["interface"], interface, "{status}");

    // Still pending, so a second SIGHUP names it again.
    n.sighup();
    let again = n.line(|l| l.contains("SIGHUP: config reloaded"));
    assert!(again.contains("wireguard (after a restart)"), "{again}");
}
