//! Plexd nodes for the route tests and benchmark (tests/tests/routes.rs,
//! tests/examples/routes_bench.rs): a node of a [`crate::netns::Lab`] with the userspace data
//! plane whose `routes:` section can be rewritten and reloaded, and the probes the tests use
//! (ping, a TCP echo, `plexctl route list`, ping's output).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use crate::netns::{self, Lab};
use crate::{ControlPlane, Host, Proc, wait_until};

pub const BOUND: Duration = Duration::from_secs(60);

pub struct Node {
    pub name: String,
    pub ns: String,
    pub host: Host,
    base_config: String,
    pub proc: Option<Proc>,
}

pub fn config_extra(iface: &str) -> String {
    format!(
        "wireguard:\n  backend: userspace\n  interface: {iface}\ndaemon:\n  backoff_initial_ms: 200\n  backoff_cap_secs: 2\n  intervals:\n    heartbeat_secs: 1\n    endpoint_report_secs: 1\n    state_poll_secs: 2\n    ingest_secs: 1\n"
    )
}

impl Node {
    pub fn new(lab: &mut Lab, cp: &ControlPlane, root: &std::path::Path, name: &str) -> Self {
        let (ns, host, _iface) = netns::prepare_node(lab, cp, root, name, config_extra).unwrap();
        let base_config = std::fs::read_to_string(host.config()).unwrap();
        Node {
            name: name.to_owned(),
            ns,
            host,
            base_config,
            proc: None,
        }
    }

    /// Replaces the `routes:` section (and signals a running daemon to reload).
    pub fn set_routes(&self, routes_yaml: &str) {
        std::fs::write(
            self.host.config(),
            format!("{}{routes_yaml}", self.base_config),
        )
        .unwrap();
        if let Some(p) = &self.proc {
            p.signal("HUP").unwrap();
        }
    }

    pub fn start(&mut self) {
        let proc = netns::start_daemon(&self.ns, &self.host).unwrap();
        wait_until(
            BOUND,
            &format!("{} connects its event stream", self.name),
            || {
                Ok(self.host.status()?.filter(|s| {
                    s["event_stream_connected"] == true && !s["state_version"].is_null()
                }))
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n--- plexd {}:\n{}", self.name, proc.output()));
        self.proc = Some(proc);
    }

    pub fn id(&self) -> String {
        self.host.identity().unwrap().0
    }

    pub fn ip(&self) -> Ipv4Addr {
        self.host.identity().unwrap().1.parse().unwrap()
    }

    pub fn output(&self) -> String {
        self.proc.as_ref().map(Proc::output).unwrap_or_default()
    }

    pub fn status(&self) -> serde_json::Value {
        self.host
            .status()
            .unwrap()
            .unwrap_or_else(|| panic!("{} does not answer:\n{}", self.name, self.output()))
    }

    /// Waits until `plexd status` says what `pred` wants of its `routes`.
    pub fn wait_routes(&self, what: &str, pred: impl Fn(&serde_json::Value) -> bool) {
        wait_until(BOUND, &format!("{}: {what}", self.name), || {
            Ok(self
                .host
                .status()?
                .filter(|s| pred(&s["routes"]))
                .map(|_| ()))
        })
        .unwrap_or_else(|e| panic!("{e}\n--- plexd {}:\n{}", self.name, self.output()));
    }

    pub fn via_mesh(&self, cidr: &str) {
        let want = cidr.to_owned();
        self.wait_routes(&format!("{cidr} routed via the mesh"), move |r| {
            r["via_mesh"]
                .as_array()
                .is_some_and(|a| a.iter().any(|p| p.as_str() == Some(want.as_str())))
        });
    }
}

pub fn plexctl(cp: &ControlPlane, args: &[&str]) -> String {
    cp.plexctl_ok(args)
        .unwrap_or_else(|e| panic!("plexctl {args:?}: {e:#}"))
}

pub fn ping(ns: &str, ip: Ipv4Addr) -> bool {
    let out = netns::exec(ns, "ping", &["-c", "1", "-W", "1", &ip.to_string()]).unwrap();
    out.status.success()
}

pub fn wait_ping(ns: &str, ip: Ipv4Addr, what: &str) {
    wait_until(BOUND, what, || Ok(ping(ns, ip).then_some(()))).unwrap();
}

/// An echo server on `ip:port` inside `ns` (a thread per connection, until the test ends).
pub fn echo_server(ns: &str, ip: Ipv4Addr, port: u16) {
    let (tx, rx) = std::sync::mpsc::channel();
    netns::on_thread_in(ns, move || {
        let listener = TcpListener::bind(SocketAddr::from((ip, port)))?;
        tx.send(())?;
        for conn in listener.incoming() {
            let Ok(mut s) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(())
    });
    rx.recv_timeout(BOUND).expect("the echo server listens");
}

pub fn tcp_echoes(ns: &str, ip: Ipv4Addr, port: u16, within: Duration) -> bool {
    netns::on_thread_in(ns, move || {
        let Ok(mut s) = TcpStream::connect_timeout(&SocketAddr::from((ip, port)), within) else {
            return Ok(false);
        };
        s.set_read_timeout(Some(within))?;
        s.write_all(b"hello")?;
        let mut got = [0u8; 5];
        Ok(s.read_exact(&mut got).is_ok() && &got == b"hello")
    })
    .join()
    .unwrap()
    .unwrap()
}

pub fn routes_yaml(cidr: &str, probe: Option<Ipv4Addr>) -> String {
    let probe = probe.map_or(String::new(), |p| format!("      probe: {p}\n"));
    format!("routes:\n  advertise:\n    - cidr: {cidr}\n{probe}")
}

/// The route's routers as `plexctl route list --output json` shows them: (name, role, reason).
pub fn routers(cp: &ControlPlane, cidr: &str) -> Vec<(String, String, String)> {
    let out = plexctl(cp, &["route", "list", "--output", "json"]);
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cidr"] == cidr)
        .flat_map(|e| e["routers"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (s("name"), s("role"), s("reason"))
        })
        .collect()
}

pub fn primary(cp: &ControlPlane, cidr: &str) -> Option<String> {
    routers(cp, cidr)
        .into_iter()
        .find(|(_, role, _)| role == "primary")
        .map(|(name, _, _)| name)
}

/// The DNS name the control plane gave `node` (the NAME of `plexctl node list`).
pub fn name_of(cp: &ControlPlane, node: &Node) -> String {
    let v = cp.node(&node.id()).unwrap();
    v["name"]
        .as_str()
        .or_else(|| v["dns_name"].as_str())
        .unwrap_or_else(|| panic!("no name in {v}"))
        .to_owned()
}

/// The sequence number of a reply line of ping's.
pub fn reply_seq(line: &str) -> Option<u64> {
    if !line.contains("bytes from") {
        return None;
    }
    let rest = line.split("icmp_seq=").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

pub fn last_seq(out: &str) -> u64 {
    out.lines().filter_map(reply_seq).max().unwrap_or(0)
}

/// Requests without a reply between the first and the last reply.
pub fn lost_pings(out: &str) -> u64 {
    let seqs: std::collections::BTreeSet<u64> = out.lines().filter_map(reply_seq).collect();
    match (seqs.first(), seqs.last()) {
        (Some(first), Some(last)) => (last - first + 1) - seqs.len() as u64,
        _ => u64::MAX,
    }
}
