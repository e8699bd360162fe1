//! The mesh end to end (root): the real control plane on the host and plexd nodes, each in
//! its own network namespace on a bridge, with the embedded userspace data plane. Every pair
//! pings and carries a TCP transfer over the mesh IPs; a node enrolled later is reachable after
//! one event; a restarted node keeps its identity and comes back; a node that leaves becomes
//! unreachable and disappears from the others' `wg show`. And the kernel backend on a host
//! without the module: a clear error, and `auto` falls back to userspace saying why.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use plexsphere_e2e::netns::{self, Lab};
use plexsphere_e2e::{ControlPlane, Host, Proc, wait_until};

const BOUND: Duration = Duration::from_secs(60);

struct Node {
    ns: String,
    host: Host,
    iface: String,
    proc: Option<Proc>,
}

fn config_extra(backend: &str, iface: &str) -> String {
    format!(
        "wireguard:\n  backend: {backend}\n  interface: {iface}\ndaemon:\n  backoff_initial_ms: 200\n  backoff_cap_secs: 2\n  intervals:\n    heartbeat_secs: 1\n    endpoint_report_secs: 1\n    state_poll_secs: 2\n    ingest_secs: 1\n"
    )
}

/// A node namespace with a fresh token and a config for `backend`.
fn node(lab: &mut Lab, cp: &ControlPlane, root: &std::path::Path, backend: &str) -> Node {
    let (ns, host, iface) =
        netns::prepare_node(lab, cp, root, "node", |iface| config_extra(backend, iface)).unwrap();
    Node {
        ns,
        host,
        iface,
        proc: None,
    }
}

impl Node {
    /// Starts `plexd run` and waits until it is enrolled with its event stream connected.
    fn start(&mut self) -> serde_json::Value {
        let proc = netns::start_daemon(&self.ns, &self.host).unwrap();
        let status = wait_until(BOUND, "the daemon's event stream connects", || {
            Ok(self
                .host
                .status()?
                .filter(|s| s["event_stream_connected"] == true && !s["state_version"].is_null()))
        })
        .unwrap_or_else(|e| panic!("{e}\n--- plexd output:\n{}", proc.output()));
        assert_eq!(status["backend"], "userspace", "{status}");
        self.proc = Some(proc);
        status
    }

    fn mesh_ip(&self) -> String {
        self.host.identity().unwrap().1
    }

    fn output(&self) -> String {
        self.proc.as_ref().map(Proc::output).unwrap_or_default()
    }

    fn wg(&self, args: &[&str]) -> String {
        let mut a = vec!["show", self.iface.as_str()];
        a.extend_from_slice(args);
        let out = netns::exec(&self.ns, "wg", &a).unwrap();
        assert!(
            out.status.success(),
            "wg show {}: {}",
            self.iface,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn ping(from: &Node, ip: &str) -> bool {
    let out = netns::exec(&from.ns, "ping", &["-c", "1", "-W", "1", ip]).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("exec of"),
        "ping is not installed: apt-get install iputils-ping ({err})"
    );
    out.status.success()
}

fn wait_ping(from: &Node, to: &Node) {
    let ip = to.mesh_ip();
    wait_until(BOUND, &format!("{} pings {ip}", from.ns), || {
        Ok(ping(from, &ip).then_some(()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n--- wg show on {}:\n{}\n--- plexd {}:\n{}\n--- plexd {}:\n{}",
            from.ns,
            from.wg(&[]),
            from.ns,
            from.output(),
            to.ns,
            to.output()
        )
    });
}

/// 4 MiB from `client` to a TCP sink on `server`'s mesh IP; returns the bytes it read.
fn tcp_transfer(client: &Node, server: &Node) -> u64 {
    let ip = server.mesh_ip().parse().unwrap();
    netns::tcp_transfer(&server.ns, ip, &client.ns, 4 << 20, BOUND)
        .unwrap_or_else(|e| panic!("TCP {} -> {ip}: {e:#}", client.ns))
}

#[test]
fn three_nodes_mesh_a_fourth_joins_a_restart_keeps_identity_and_a_leave_disappears() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lab = Lab::new().unwrap();
    let cp = netns::start_control_plane(&tmp.path().join("cp"), lab.host_addr(), &[]).unwrap();
    let mut nodes: Vec<Node> = (0..3)
        .map(|_| node(&mut lab, &cp, tmp.path(), "userspace"))
        .collect();
    for n in &mut nodes {
        n.start();
    }

    // Every pair pings over the mesh IPs, in both directions.
    for a in &nodes {
        for b in &nodes {
            if a.ns != b.ns {
                wait_ping(a, b);
            }
        }
    }
    // Each pair carries a TCP transfer.
    for (c, s) in [(0, 1), (1, 2), (2, 0)] {
        let got = tcp_transfer(&nodes[c], &nodes[s]);
        assert!(
            got >= 4 << 20,
            "{} -> {}: {got} bytes",
            nodes[c].ns,
            nodes[s].ns
        );
    }
    // plexd status reads the handshakes and byte counters from the interface.
    let status = nodes[0].host.status().unwrap().unwrap();
    let peers = status["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 2, "{status}");
    for p in peers {
        assert!(p["last_handshake_age_secs"].is_u64(), "{p}");
        assert!(p["rx_bytes"].as_u64().unwrap() > 0, "{p}");
        assert!(p["tx_bytes"].as_u64().unwrap() > 0, "{p}");
    }
    // wg show works for operators and lists the two peers with a handshake.
    let dump = nodes[0].wg(&["latest-handshakes"]);
    assert_eq!(dump.lines().count(), 2, "{dump}");
    assert!(dump.lines().all(|l| !l.ends_with("\t0")), "{dump}");

    // The control plane keeps what nodes observe: `plexctl node observations` lists node 0's
    // handshake with each of its peers (the daemon flushes ingest every second here).
    let id0 = nodes[0].host.identity().unwrap().0;
    for peer in &nodes[1..] {
        let peer_id = peer.host.identity().unwrap().0;
        wait_until(
            BOUND,
            &format!("plexctl lists a handshake of {id0} with {peer_id}"),
            || {
                let out = cp.plexctl_ok(&[
                    "node",
                    "observations",
                    &id0,
                    "--kind",
                    "handshake",
                    "--output",
                    "json",
                ])?;
                let list: serde_json::Value = serde_json::from_str(&out)?;
                let seen = list["items"].as_array().is_some_and(|items| {
                    items
                        .iter()
                        .any(|o| o["type"] == "handshake" && o["peer_node_id"] == peer_id.as_str())
                });
                Ok(seen.then_some(()))
            },
        )
        .unwrap();
    }

    // A fourth node: reachable by all after its peer event, nobody restarted.
    let mut d = node(&mut lab, &cp, tmp.path(), "userspace");
    d.start();
    for n in &nodes {
        wait_ping(n, &d);
        wait_ping(&d, n);
    }
    for n in &mut nodes {
        let p = n.proc.as_mut().unwrap();
        assert!(p.try_exit().unwrap().is_none(), "{} kept running", n.ns);
    }
    nodes.push(d);

    // A restart (SIGTERM, start again) keeps the identity and comes back.
    let before = nodes[1].host.identity().unwrap();
    let status = nodes[1].proc.as_mut().unwrap().terminate(BOUND).unwrap();
    assert!(status.success(), "plexd exits 0 on SIGTERM: {status}");
    let status = nodes[1].start();
    assert_eq!(nodes[1].host.identity().unwrap(), before);
    assert_eq!(status["node_id"], before.0.as_str());
    assert_eq!(status["mesh_ip"], before.1.as_str());
    assert!(
        !nodes[1].output().contains("registered as node"),
        "no second registration:\n{}",
        nodes[1].output()
    );
    wait_ping(&nodes[0], &nodes[1]);
    wait_ping(&nodes[1], &nodes[2]);

    // A node that leaves: its interface goes, the others drop it, it is unreachable.
    let leaving = &nodes[2];
    let key = leaving.wg(&["public-key"]).trim().to_owned();
    assert!(nodes[0].wg(&["peers"]).contains(&key));
    let gone_ip = leaving.mesh_ip();
    let out = netns::plexd(&leaving.ns, &leaving.host, &["leave"]).unwrap();
    assert!(
        out.status.success(),
        "leave: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut leaving_proc = nodes[2].proc.take().unwrap();
    wait_until(BOUND, "the leaving daemon exits", || {
        leaving_proc.try_exit()
    })
    .unwrap();
    let link = netns::exec(&nodes[2].ns, "ip", &["link", "show", &nodes[2].iface]).unwrap();
    assert!(!link.status.success(), "the interface was removed on leave");
    for i in [0, 1, 3] {
        let n = &nodes[i];
        wait_until(BOUND, &format!("{} drops the peer", n.ns), || {
            Ok((!n.wg(&["peers"]).contains(&key)).then_some(()))
        })
        .unwrap();
        assert!(!ping(n, &gone_ip), "{} still reaches {gone_ip}", n.ns);
    }
}

#[test]
fn kernel_backend_without_the_module_is_a_clear_error_and_auto_falls_back() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lab = Lab::new().unwrap();
    let cp = netns::start_control_plane(&tmp.path().join("cp"), lab.host_addr(), &[]).unwrap();
    let n = node(&mut lab, &cp, tmp.path(), "kernel");
    let mut proc = netns::start_daemon(&n.ns, &n.host).unwrap();
    // Either the host has the module (the daemon runs on it) or plexd stops with exit 78.
    let outcome = wait_until(BOUND, "plexd exits or reports its backend", || {
        if let Some(st) = proc.try_exit()? {
            return Ok(Some(Err(st)));
        }
        Ok(n.host.status()?.map(|s| Ok(s["backend"].clone())))
    })
    .unwrap();
    let module_present = match outcome {
        Ok(backend) => {
            assert_eq!(backend, "kernel");
            proc.terminate(BOUND).unwrap();
            true
        }
        Err(status) => {
            assert_eq!(status.code(), Some(78), "{}", proc.output());
            let out = proc.output();
            assert!(
                out.contains("the wireguard kernel module is missing")
                    && out.contains("RTM_NEWLINK kind wireguard")
                    && out.contains("wireguard.backend: auto"),
                "{out}"
            );
            false
        }
    };

    // auto: the kernel when it can, else userspace, saying why.
    let cfg = std::fs::read_to_string(n.host.config()).unwrap();
    std::fs::write(
        n.host.config(),
        cfg.replace("backend: kernel", "backend: auto"),
    )
    .unwrap();
    let proc = netns::start_daemon(&n.ns, &n.host).unwrap();
    let status = wait_until(BOUND, "the daemon answers", || n.host.status())
        .unwrap_or_else(|e| panic!("{e}\n{}", proc.output()));
    if module_present {
        assert_eq!(status["backend"], "kernel");
    } else {
        assert_eq!(status["backend"], "userspace", "{status}");
        let out = proc.output();
        assert!(
            out.contains("the wireguard kernel module is missing")
                && out.contains("using the userspace data plane"),
            "{out}"
        );
        let link = netns::exec(&n.ns, "ip", &["-d", "link", "show", &n.iface]).unwrap();
        let text = String::from_utf8_lossy(&link.stdout);
        assert!(text.contains("mtu 1420") && text.contains("tun"), "{text}");
    }
}
