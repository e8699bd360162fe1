//! A reach lab: a [`Topology`] with the control plane (`plexsphere dev`) and relays
//! (`plexsphere relay`) on its public segment, and one `plexd run` node behind each router.
//! Every flag of the pieces the reach work adds is spelled in [`super::flags`] only.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use super::flags;
use super::rules::NatMode;
use super::topology::Topology;
use crate::netns::{in_netns, on_thread_in};
use crate::process::{STARTUP_BOUND, bin};
use crate::{ControlPlane, Host, LAB_NODES_PROJECT, Proc, wait_until};

/// How long a relay may take to bind its sockets.
const RELAY_BOUND: Duration = Duration::from_secs(30);

/// A relay on the public segment.
pub struct RelayInfo {
    pub name: String,
    pub addr: Ipv4Addr,
    pub public_key: String,
    pub key_file: PathBuf,
    pub proc: Option<Proc>,
}

impl RelayInfo {
    pub fn udp(&self) -> SocketAddr {
        SocketAddr::from((self.addr, flags::RELAY_UDP_PORT))
    }
    pub fn tls(&self) -> SocketAddr {
        SocketAddr::from((self.addr, flags::RELAY_TLS_PORT))
    }
}

/// A node of the lab: which router it sits behind, and what config it runs with.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub router: usize,
    /// `wireguard.backend`.
    pub backend: &'static str,
}

/// One `plexd` node in its namespace.
pub struct LabNode {
    pub ns: String,
    /// The router it sits behind.
    pub router: usize,
    pub host: Host,
    pub iface: String,
    pub proc: Option<Proc>,
}

/// The control plane, the relays and the nodes on a [`Topology`].
pub struct ReachLab {
    // Field order is drop order: processes go before their namespaces.
    pub nodes: Vec<LabNode>,
    pub relays: Vec<RelayInfo>,
    pub cp: ControlPlane,
    pub topo: Topology,
    pub dir: tempfile::TempDir,
}

/// The fast daemon timings of the reach tests (as in the mesh tests).
pub fn node_config(backend: &str, iface: &str) -> String {
    format!(
        "wireguard:\n  backend: {backend}\n  interface: {iface}\ndaemon:\n  backoff_initial_ms: 200\n  backoff_cap_secs: 2\n  intervals:\n    heartbeat_secs: 1\n    endpoint_report_secs: 1\n    state_poll_secs: 2\n    ingest_secs: 1\n"
    )
}

impl ReachLab {
    /// One router per entry of `modes`, the control plane and `relays` relays on the public
    /// segment; no node yet ([`ReachLab::add_node`]).
    pub fn start(modes: &[NatMode], relays: usize) -> Result<Self> {
        Self::start_with(modes, relays, &[])
    }

    /// [`ReachLab::start`] with `cp_args` added to the control plane's command line (an
    /// operator's knob, e.g. `--register-burst` for a fleet enrolling from one address).
    pub fn start_with(modes: &[NatMode], relays: usize, cp_args: &[&str]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut topo = Topology::new()?;
        for m in modes {
            topo.add_router(*m)?;
        }
        let cp_addr = topo.add_public_addr()?;
        let mut infos = Vec::new();
        for i in 0..relays {
            let name = format!("r{}", i + 1);
            let key_file = dir.path().join(format!("{name}.key"));
            let out = plexsphere_in(topo.public_ns(), &flags::relay_keygen(&key_file))?;
            ensure!(
                out.status.success(),
                "plexsphere relay keygen: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            let public_key = String::from_utf8(out.stdout)?.trim().to_owned();
            infos.push(RelayInfo {
                name,
                addr: topo.add_public_addr()?,
                public_key,
                key_file,
                proc: None,
            });
        }
        let cp = start_control_plane(&topo, &dir.path().join("cp"), cp_addr, &infos, cp_args)?;
        let mut lab = Self {
            nodes: Vec::new(),
            relays: infos,
            cp,
            topo,
            dir,
        };
        let domain_key = lab.domain_key()?;
        for i in 0..lab.relays.len() {
            lab.start_relay(i, &domain_key)?;
        }
        Ok(lab)
    }

    /// Starts relay `i` and waits until its UDP and TLS ports are bound.
    fn start_relay(&mut self, i: usize, domain_key: &str) -> Result<()> {
        let tls = self.cp.data_dir.join("tls");
        let (cert, key) = (tls.join("server.crt"), tls.join("server.key"));
        let r = self.relays.get(i).context("no such relay")?;
        let args = flags::relay_run(&flags::RelayRun {
            name: &r.name,
            key_file: &r.key_file,
            udp: r.udp(),
            tls: r.tls(),
            tls_cert: &cert,
            tls_key: &key,
            domain_key,
        });
        let mut cmd = Command::new(bin("plexsphere")?);
        cmd.args(&args);
        let proc = Proc::spawn(in_netns(self.topo.public_ns(), &cmd))?;
        let (ns, udp, tcp) = (self.topo.public_ns().to_owned(), r.udp(), r.tls());
        wait_until(
            RELAY_BOUND,
            &format!("relay {} binds {udp} and {tcp}", r.name),
            || Ok((udp_bound(&ns, udp)? && tcp_accepts(&ns, tcp)?).then_some(())),
        )
        .with_context(|| format!("--- relay output:\n{}", proc.output()))?;
        if let Some(r) = self.relays.get_mut(i) {
            r.proc = Some(proc);
        }
        Ok(())
    }

    /// Kills relay `name`: a relay of its own gets SIGKILL (no goodbye to its clients); the
    /// relay `plexsphere dev` embeds lives in the control plane's process, so its ports are
    /// rejected instead (TCP reset, ICMP port unreachable: what a killed process leaves).
    pub fn kill_relay(&mut self, name: &str) -> Result<()> {
        if name == flags::DEV_RELAY_NAME {
            return self.reject_dev_relay();
        }
        let r = self
            .relays
            .iter_mut()
            .find(|r| r.name == name)
            .with_context(|| format!("no relay named {name}"))?;
        ensure!(r.proc.take().is_some(), "relay {name} is not running");
        Ok(())
    }

    fn reject_dev_relay(&self) -> Result<()> {
        let addr = self.cp.addr()?.ip();
        let rules = format!(
            "table inet pxdevrelay {{\n  chain input {{\n    type filter hook input priority filter; policy accept;\n    ip daddr {addr} udp dport {} reject\n    ip daddr {addr} tcp dport {} reject with tcp reset\n  }}\n}}\n",
            flags::DEV_RELAY_UDP_PORT,
            flags::DEV_RELAY_TLS_PORT,
        );
        let mut child = in_netns(self.topo.public_ns(), Command::new("nft").args(["-f", "-"]))
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("running nft")?;
        if let Some(mut stdin) = child.stdin.take() {
            std::io::Write::write_all(&mut stdin, rules.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        ensure!(
            out.status.success(),
            "nft in the public namespace: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        // Established TCP connections to it get the reset on their next segment.
        let _ = crate::netns::exec(self.topo.public_ns(), "conntrack", &["-F"]);
        Ok(())
    }

    /// The Domain's Ed25519 public key (base64), which relays verify relay tokens with.
    pub fn domain_key(&self) -> Result<String> {
        let out = self.plexctl_ok(&["domain", "list", "--output", "json"])?;
        let v: serde_json::Value = serde_json::from_str(&out)?;
        // A JSON array of Domains (the lab seed has one).
        let first = if v.is_array() { &v[0] } else { &v["items"][0] };
        first["signing_public_key"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("no signing_public_key in {out}"))
    }

    /// `plexctl <args>` run on the public segment (where the control plane's URL is).
    pub fn plexctl_ok(&self, args: &[&str]) -> Result<String> {
        let mut cmd = Command::new(bin("plexctl")?);
        cmd.env("PLEXCTL_CONFIG", self.cp.plexctl_config())
            .env_remove("PLEXCTL_SERVER")
            .env_remove("PLEXCTL_TOKEN")
            .args(args);
        let out = in_netns(self.topo.public_ns(), &cmd).output()?;
        if !out.status.success() {
            bail!(
                "plexctl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }

    /// A node behind router `spec.router`, enrolled with a fresh token, not started.
    pub fn add_node(&mut self, spec: &NodeSpec) -> Result<usize> {
        let i = self.nodes.len();
        let k = self.nodes_behind(spec.router);
        let ns = self.topo.add_node(spec.router)?;
        let iface = self.topo.wg_iface(spec.router, k);
        let host = self.new_host(&format!("node{i}"), spec.backend, &iface)?;
        self.nodes.push(LabNode {
            ns,
            router: spec.router,
            host,
            iface,
            proc: None,
        });
        Ok(i)
    }

    /// A plexd host root in the lab's directory with its config (`backend`, interface `iface`,
    /// the fast timings) and a fresh token, for a node that runs elsewhere (a guest).
    pub fn new_host(&self, name: &str, backend: &str, iface: &str) -> Result<Host> {
        let host = Host::new(&self.dir.path().join(name))?;
        host.write_config(
            &self.cp.url,
            &self.cp.ca_file(),
            LAB_NODES_PROJECT,
            name,
            &node_config(backend, iface),
        )?;
        host.write_token(&self.issue_token()?)?;
        Ok(host)
    }

    fn nodes_behind(&self, router: usize) -> usize {
        self.nodes.iter().filter(|n| n.router == router).count()
    }

    /// A fresh node token of the lab-nodes Project.
    pub fn issue_token(&self) -> Result<String> {
        crate::control_plane::token_of(
            &self.plexctl_ok(&crate::control_plane::issue_token_args(LAB_NODES_PROJECT))?,
        )
    }

    /// Starts node `i`'s `plexd run` and waits until its event stream is connected.
    pub fn start_node(&mut self, i: usize) -> Result<()> {
        let n = self.nodes.get_mut(i).context("no such node")?;
        let proc = crate::netns::start_daemon(&n.ns, &n.host)?;
        let host = &n.host;
        wait_until(STARTUP_BOUND, "the daemon's event stream connects", || {
            Ok(host
                .status()?
                .filter(|s| s["event_stream_connected"] == true && !s["state_version"].is_null()))
        })
        .with_context(|| format!("--- plexd output:\n{}", proc.output()))?;
        n.proc = Some(proc);
        Ok(())
    }

    pub fn mesh_ip(&self, i: usize) -> Result<Ipv4Addr> {
        let n = self.nodes.get(i).context("no such node")?;
        Ok(n.host.identity()?.1.parse()?)
    }

    /// Replaces router `r`'s NAT (and flushes its conntrack table).
    pub fn set_mode(&mut self, r: usize, mode: NatMode) -> Result<()> {
        self.topo.set_mode(r, mode)
    }

    /// Everything a failure message needs: every process's output and every node's status.
    pub fn dump(&self) -> String {
        let mut out = format!(
            "--- control plane:\n{}\n",
            crate::tail(&self.cp.proc.output(), TAIL_LINES)
        );
        for r in &self.relays {
            let text = r
                .proc
                .as_ref()
                .map(Proc::output)
                .unwrap_or_else(|| "(stopped)".into());
            out += &format!(
                "--- relay {} ({}):\n{}\n",
                r.name,
                r.addr,
                crate::tail(&text, TAIL_LINES)
            );
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let status = n.host.status().ok().flatten().unwrap_or_default();
            let text = n.proc.as_ref().map(Proc::output).unwrap_or_default();
            out += &format!(
                "--- node {i} ({}) status: {status}\n{}\n",
                n.ns,
                crate::tail(&text, TAIL_LINES)
            );
        }
        out
    }
}

/// How many lines of each process's output a failure shows.
const TAIL_LINES: usize = 60;

/// `plexsphere dev` inside the public namespace, on `addr`, with the relays and their STUN.
fn start_control_plane(
    topo: &Topology,
    data_dir: &Path,
    addr: Ipv4Addr,
    relays: &[RelayInfo],
    extra: &[&str],
) -> Result<ControlPlane> {
    let mut cmd = Command::new(bin("plexsphere")?);
    cmd.env("PLEXSPHERE_NO_LOCAL_MACHINES", "1")
        .arg("dev")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", &format!("{addr}:{}", flags::CP_PORT)])
        .args(["--san", &addr.to_string(), "--san", flags::RELAY_SNI])
        .args(["--sse-keepalive-secs", "1", "--heartbeat-secs", "1"]);
    for r in relays {
        // Relays answer STUN on their UDP port and dev's own STUN responder is listed too, so
        // nodes have three STUN servers on three addresses without --stun-advertise.
        cmd.args(flags::cp_relay(&r.name, &r.public_key, r.udp(), r.tls()));
    }
    cmd.args(extra);
    let proc = Proc::spawn(in_netns(topo.public_ns(), &cmd))?;
    let line = proc.wait_for_line(STARTUP_BOUND, |l| l.contains("listening on https://"))?;
    let url = line
        .split("listening on ")
        .nth(1)
        .map(|s| s.trim().to_owned())
        .context("parsing the listening line")?;
    Ok(ControlPlane {
        proc,
        url,
        data_dir: data_dir.to_path_buf(),
    })
}

/// `plexsphere <args>` to completion inside `ns`.
fn plexsphere_in(ns: &str, args: &[String]) -> Result<Output> {
    let mut cmd = Command::new(bin("plexsphere")?);
    cmd.args(args);
    in_netns(ns, &cmd).output().context("running plexsphere")
}

/// Whether a UDP socket is bound to `addr` in `ns` (/proc/thread-self/net/udp).
fn udp_bound(ns: &str, addr: SocketAddr) -> Result<bool> {
    let want = format!(":{:04X}", addr.port());
    on_thread_in(ns, move || {
        let table = std::fs::read_to_string("/proc/thread-self/net/udp")?;
        Ok(table
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().nth(1))
            .any(|local| local.ends_with(&want)))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the probe thread panicked"))?
}

/// Whether a TCP connection to `addr` from `ns` is accepted.
fn tcp_accepts(ns: &str, addr: SocketAddr) -> Result<bool> {
    on_thread_in(ns, move || {
        Ok(std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the probe thread panicked"))?
}
