//! Key and credential rotation end to end (root): the real control plane and two plexd nodes
//! with the userspace data plane, each in its own network namespace. A ping at 10 per second
//! runs from B to A over the mesh while A rotates its WireGuard key with `plexd rotate-key`
//! and again after `plexctl node rotate-key` (the second one meets the control plane's rate
//! limit first and goes through after its `Retry-After`); and A rotates its credential.
//!
//! A runs the ordered crypto pool (`wireguard.crypto_workers: 2`, plexd's own WireGuard protocol
//! implementation), B the default (boringtun's state machine).
//!
//! What is checked: traffic resumes after each rotation and few packets are lost, B's
//! interface and A's own hold the new key (and B no longer the old), the key file is the new
//! key with no pending key left, `plexctl node get` shows `key_rotated_at`, the old credential
//! is refused (401) once its grace is over while the new one works.
//!
//! The loss bound: when B's first handshake with A's new key crosses A's switch (B already
//! has the new key, A not yet), A drops it and B tries again after WireGuard's REKEY_TIMEOUT
//! (5 s); every other order costs one round trip. At 10 pings a second that is at most
//! [`MAX_LOST`] = (5 s + 2 s of event and apply latency) x 10.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::process::Command;
use std::time::Duration;

use plexsphere_e2e::netns::{self, Lab};
use plexsphere_e2e::{ControlPlane, Host, Proc, wait_until};

const BOUND: Duration = Duration::from_secs(90);
/// Pings lost per rotation at most (see the module docs).
const MAX_LOST: u64 = 70;

struct Node {
    ns: String,
    host: Host,
    iface: String,
    proc: Option<Proc>,
}

/// `crypto_workers`: the node's `wireguard.crypto_workers` (0: the default state machine).
fn node(lab: &mut Lab, cp: &ControlPlane, root: &std::path::Path, crypto_workers: u8) -> Node {
    // Reach off: the rotation of the paths is covered by the reach tests; here the two nodes
    // see each other directly and only the key changes.
    let extra = |iface: &str| {
        format!(
            "wireguard:\n  backend: userspace\n  interface: {iface}\n  crypto_workers: {crypto_workers}\n  reach:\n    enabled: false\ndaemon:\n  backoff_initial_ms: 200\n  backoff_cap_secs: 2\n  intervals:\n    heartbeat_secs: 1\n    endpoint_report_secs: 1\n    state_poll_secs: 2\n    ingest_secs: 1\n"
        )
    };
    let (ns, host, iface) = netns::prepare_node(lab, cp, root, "node", extra).unwrap();
    Node {
        ns,
        host,
        iface,
        proc: None,
    }
}

impl Node {
    fn start(&mut self) {
        let proc = netns::start_daemon(&self.ns, &self.host).unwrap();
        wait_until(BOUND, "the daemon's event stream connects", || {
            Ok(self
                .host
                .status()?
                .filter(|s| s["event_stream_connected"] == true && !s["state_version"].is_null()))
        })
        .unwrap_or_else(|e| panic!("{e}\n--- plexd output:\n{}", proc.output()));
        self.proc = Some(proc);
    }

    fn output(&self) -> String {
        self.proc.as_ref().map(Proc::output).unwrap_or_default()
    }

    fn id(&self) -> String {
        self.host.identity().unwrap().0
    }

    fn mesh_ip(&self) -> String {
        self.host.identity().unwrap().1
    }

    fn wg(&self, what: &str) -> String {
        let out = netns::exec(&self.ns, "wg", &["show", &self.iface, what]).unwrap();
        assert!(out.status.success(), "wg show: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn credential(&self) -> String {
        let text = std::fs::read_to_string(self.host.state_dir().join("identity.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["node_credential"].as_str().unwrap().to_owned()
    }

    fn plexd(&self, args: &[&str]) -> std::process::Output {
        netns::plexd(&self.ns, &self.host, args).unwrap()
    }
}

/// A ping at 10/s from `from` to `ip` until it is interrupted.
fn start_ping(from: &Node, ip: &str) -> Proc {
    let mut cmd = Command::new("ping");
    cmd.args(["-i", "0.1", "-W", "1", ip]);
    Proc::spawn(netns::in_netns(&from.ns, &cmd)).unwrap()
}

/// Interrupts the ping; answers (transmitted, received) from its summary.
fn stop_ping(mut p: Proc) -> (u64, u64) {
    p.signal("INT").unwrap();
    wait_until(BOUND, "ping prints its summary", || p.try_exit()).unwrap();
    let out = p.output();
    let line = out
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary in:\n{out}"));
    let num = |before: &str| -> u64 {
        let head = line.split(before).next().unwrap_or("");
        head.rsplit(|c: char| !c.is_ascii_digit())
            .find(|s| !s.is_empty())
            .unwrap()
            .parse()
            .unwrap()
    };
    (num(" packets transmitted"), num(" received"))
}

/// Waits until `ping` has answered at least `n` more pings than it had at the call.
fn wait_replies(p: &Proc, n: usize) {
    let count = |p: &Proc| {
        p.output()
            .lines()
            .filter(|l| l.contains("bytes from"))
            .count()
    };
    let start = count(p);
    wait_until(BOUND, "pings are answered", || {
        Ok((count(p) >= start + n).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- ping:\n{}", p.output()));
}

/// `GET /state` as node `a` would send it (its credential given, its `Plexd-Host`, computed from
/// its machine id as plexd does: the state dir does not hold it): the status code.
fn state_status(cp: &ControlPlane, a: &Node, id: &str, credential: &str) -> u16 {
    let host = a.host.sent_fingerprint(id).unwrap();
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(cp.ca_file())
        .arg("-H")
        .arg(format!("Authorization: Bearer {credential}"))
        .arg("-H")
        .arg(format!("Plexd-Host: {host}"))
        .arg(format!(
            "{}/v1/nodes/{id}/state",
            cp.url.trim_end_matches('/')
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// Waits until B's interface and A's own hold `key` for A; checks B dropped `old`.
fn wait_switched(a: &Node, b: &Node, old: &str, key: &str) {
    wait_until(BOUND, "both interfaces hold A's new key", || {
        Ok((a.wg("public-key") == key && b.wg("peers").lines().any(|l| l == key)).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- A:\n{}\n--- B:\n{}", a.output(), b.output()));
    assert!(
        !b.wg("peers").lines().any(|l| l == old),
        "B still has A's old key: {}",
        b.wg("peers")
    );
}

#[test]
fn keys_rotate_on_demand_and_by_operator_with_traffic_running_and_credentials_rotate() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lab = Lab::new().unwrap();
    let cp = netns::start_control_plane(&tmp.path().join("cp"), lab.host_addr(), &[]).unwrap();
    // A runs the ordered crypto pool (so plexd's own protocol implementation), B the default
    // (boringtun's): every rotation's handshakes also cross the two implementations.
    let mut a = node(&mut lab, &cp, tmp.path(), 2);
    let mut b = node(&mut lab, &cp, tmp.path(), 0);
    a.start();
    b.start();
    assert!(
        a.output().contains("ordered crypto pool started"),
        "A's plexd runs the crypto pool:\n{}",
        a.output()
    );
    let (a_id, a_ip) = (a.id(), a.mesh_ip());
    let key0 = a.wg("public-key");
    assert_eq!(
        cp.node(&a_id).unwrap()["wireguard_public_key"],
        key0.as_str()
    );
    assert!(cp.node(&a_id).unwrap()["key_rotated_at"].is_null());

    // Traffic first.
    let ping = start_ping(&b, &a_ip);
    wait_replies(&ping, 5);

    // 1. plexd rotate-key, answered when the interface has the new key.
    let out = a.plexd(&["rotate-key"]);
    assert!(
        out.status.success(),
        "plexd rotate-key: {}\n--- plexd:\n{}",
        String::from_utf8_lossy(&out.stderr),
        a.output()
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("rotated the WireGuard key"), "{said}");
    let key1 = a.wg("public-key");
    assert_ne!(key1, key0);
    assert!(said.contains(&key1), "{said}");
    wait_switched(&a, &b, &key0, &key1);
    wait_replies(&ping, 10);
    let (sent, got) = stop_ping(ping);
    assert!(
        sent - got <= MAX_LOST,
        "{} of {sent} pings lost over the first rotation",
        sent - got
    );
    let node_view = cp.node(&a_id).unwrap();
    assert_eq!(node_view["wireguard_public_key"], key1.as_str());
    assert!(node_view["key_rotated_at"].is_string(), "{node_view}");
    // The key file is the new key; no pending key is left.
    let state = a.host.state_dir();
    assert!(!state.join("wireguard.key.pending").exists());
    let status = b.host.status().unwrap().unwrap();
    assert!(status.to_string().contains(&key1), "{status}");

    // 2. The credential: the new one is saved and used; the old one stops after its grace.
    let cred0 = a.credential();
    let out = a.plexd(&["rotate-credential"]);
    assert!(
        out.status.success(),
        "plexd rotate-credential: {}\n--- plexd:\n{}",
        String::from_utf8_lossy(&out.stderr),
        a.output()
    );
    let cred1 = a.credential();
    assert_ne!(cred0, cred1);

    // 3. plexctl node rotate-key: the node rotates at a heartbeat; the first try meets the
    // rate limit (30 s since the last rotation) and goes through after its Retry-After.
    let ping = start_ping(&b, &a_ip);
    wait_replies(&ping, 5);
    cp.plexctl_ok(&["node", "rotate-key", &a_id]).unwrap();
    let key2 = wait_until(BOUND, "the control plane has A's third key", || {
        let k = cp.node(&a_id)?["wireguard_public_key"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        Ok((k != key1).then_some(k))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- A:\n{}", a.output()));
    wait_switched(&a, &b, &key1, &key2);
    wait_replies(&ping, 10);
    let (sent, got) = stop_ping(ping);
    assert!(
        sent - got <= MAX_LOST,
        "{} of {sent} pings lost over the operator's rotation",
        sent - got
    );
    assert!(
        a.output().contains("rate_limited") || a.output().contains("retry after"),
        "the second rotation within 30 s was not limited:\n{}",
        a.output()
    );

    // The old credential is refused by now (its grace is 30 s); the new one works.
    wait_until(BOUND, "the old credential is refused", || {
        Ok((state_status(&cp, &a, &a_id, &cred0) == 401).then_some(()))
    })
    .unwrap();
    assert_eq!(state_status(&cp, &a, &a_id, &cred1), 200);
    assert!(cp.node(&a_id).unwrap()["credential_rotated_at"].is_string());

    // A restart comes back with the rotated key and credential.
    a.proc.take().unwrap().terminate(BOUND).unwrap();
    a.start();
    assert_eq!(a.wg("public-key"), key2);
    let ping = start_ping(&b, &a_ip);
    wait_replies(&ping, 5);
    stop_ping(ping);
    let _ = b.output();
}
