//! Network namespaces for the mesh tests: a "hub" namespace holding a bridge, one namespace
//! per node with a veth (`eth0`) on that bridge, and a veth from the host into the bridge so a
//! control plane on the host (bound to the host side's address) is reachable from every node.
//! Names carry the pid and a counter, so concurrent test processes do not collide; everything
//! is removed on drop (deleting a namespace deletes its veths).
//!
//! The bridge lives in the hub namespace rather than on the host so the host's bridge
//! netfilter settings never see the test traffic. Needs root and `ip` from iproute2.

use std::net::Ipv4Addr;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::{Context, Result, bail};

use crate::{Host, Proc};

static NEXT: AtomicU8 = AtomicU8::new(0);

/// Runs `ip <args>` and insists it succeeded.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A bridge in a hub namespace, the host's leg into it, and the node namespaces.
pub struct Lab {
    tag: String,
    hub: String,
    subnet: u8,
    host_leg: String,
    nodes: Vec<String>,
}

impl Lab {
    /// Creates the hub, its bridge and the host's leg (address `.1` of a /24 of 10.123/16).
    pub fn new() -> Result<Self> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        // The host leg adds a /24 route on the host: spread test processes over the range.
        let subnet = u8::try_from((pid + u32::from(n) * 37) % 250 + 1).unwrap_or(1);
        let tag = format!("{}{}", pid % 100_000, n);
        let lab = Self {
            hub: format!("pxhub{tag}"),
            host_leg: format!("pxh{tag}"),
            tag,
            subnet,
            nodes: Vec::new(),
        };
        ip(&["netns", "add", &lab.hub])?;
        lab.in_hub(&["link", "set", "lo", "up"])?;
        lab.in_hub(&["link", "add", "br0", "type", "bridge"])?;
        lab.in_hub(&["link", "set", "br0", "up"])?;
        ip(&[
            "link",
            "add",
            &lab.host_leg,
            "type",
            "veth",
            "peer",
            "name",
            "host",
            "netns",
            &lab.hub,
        ])?;
        lab.in_hub(&["link", "set", "host", "master", "br0", "up"])?;
        let host_addr = format!("{}/24", lab.host_addr());
        ip(&["addr", "add", &host_addr, "dev", &lab.host_leg])?;
        ip(&["link", "set", &lab.host_leg, "up"])?;
        Ok(lab)
    }

    fn in_hub(&self, args: &[&str]) -> Result<()> {
        let mut a = vec!["-n", self.hub.as_str()];
        a.extend_from_slice(args);
        ip(&a)
    }

    /// The host's address on the bridge: bind the control plane here.
    pub fn host_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 123, self.subnet, 1)
    }

    /// Adds a node namespace with `eth0` on the bridge; returns its name. Its address is
    /// [`Lab::node_addr`] of its index.
    pub fn add_node(&mut self) -> Result<String> {
        let i = self.nodes.len();
        let ns = format!("pxn{}x{i}", self.tag);
        let hub_leg = format!("n{i}");
        ip(&["netns", "add", &ns])?;
        self.nodes.push(ns.clone());
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        self.in_hub(&[
            "link", "add", &hub_leg, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        self.in_hub(&["link", "set", &hub_leg, "master", "br0", "up"])?;
        let addr = format!("{}/24", self.node_addr(i));
        ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        Ok(ns)
    }

    /// How many node namespaces exist.
    pub fn nodes_len(&self) -> usize {
        self.nodes.len()
    }

    pub fn node_addr(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 123, self.subnet, 10 + u8::try_from(i).unwrap_or(200))
    }

    /// A unique interface name for node `i`'s WireGuard interface (UAPI sockets in
    /// /var/run/wireguard are shared by every namespace, so names must differ).
    pub fn wg_iface(&self, i: usize) -> String {
        format!("pxw{}x{i}", self.tag)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Daemons killed by the tests leave their UAPI sockets behind.
        for i in 0..self.nodes.len() {
            let sock = format!("/var/run/wireguard/{}.sock", self.wg_iface(i));
            let _ = std::fs::remove_file(sock);
        }
        for ns in self.nodes.iter().chain(std::iter::once(&self.hub)) {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        // Deleting the hub deleted the host leg's peer, and with it the host leg.
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_leg])
            .output();
    }
}

/// `cmd` run inside namespace `ns` (through `ip netns exec`), keeping its environment.
pub fn in_netns(ns: &str, cmd: &Command) -> Command {
    let mut out = Command::new("ip");
    out.args(["netns", "exec", ns]).arg(cmd.get_program());
    out.args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => out.env(k, v),
            None => out.env_remove(k),
        };
    }
    out
}

/// A program run to completion inside `ns`.
pub fn exec(ns: &str, program: &str, args: &[&str]) -> Result<Output> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    in_netns(ns, &cmd)
        .output()
        .with_context(|| format!("running {program} in {ns}"))
}

/// `plexd <args>` of `host`, inside `ns`, to completion.
pub fn plexd(ns: &str, host: &Host, args: &[&str]) -> Result<Output> {
    let mut cmd = host.command()?;
    cmd.args(args);
    in_netns(ns, &cmd).output().context("running plexd")
}

/// `plexd run` of `host` inside `ns`, in the background.
pub fn start_daemon(ns: &str, host: &Host) -> Result<Proc> {
    let mut cmd = host.command()?;
    cmd.arg("run");
    Proc::spawn(in_netns(ns, &cmd))
}

/// A node of `lab` made ready for `plexd run` against `cp`: a new namespace, and host files
/// under `root/node<i>` with a config (hostname `<hostname_prefix><i>`, the YAML that
/// `config_extra` makes for the node's WireGuard interface) and a fresh bootstrap token of the
/// lab's node project. plexd is not started. Answers the namespace, the host and the
/// interface.
pub fn prepare_node(
    lab: &mut Lab,
    cp: &crate::ControlPlane,
    root: &std::path::Path,
    hostname_prefix: &str,
    config_extra: impl FnOnce(&str) -> String,
) -> Result<(String, Host, String)> {
    let i = lab.nodes_len();
    let ns = lab.add_node()?;
    let iface = lab.wg_iface(i);
    let host = Host::new(&root.join(format!("node{i}")))?;
    host.write_config(
        &cp.url,
        &cp.ca_file(),
        crate::LAB_NODES_PROJECT,
        &format!("{hostname_prefix}{i}"),
        &config_extra(&iface),
    )?;
    host.write_token(&cp.issue_token(crate::LAB_NODES_PROJECT)?)?;
    Ok((ns, host, iface))
}

/// `plexsphere dev` on the host, bound to `addr` and with it in its certificate.
pub fn start_control_plane(
    data_dir: &std::path::Path,
    addr: Ipv4Addr,
    extra: &[&str],
) -> Result<crate::ControlPlane> {
    let san = addr.to_string();
    let mut args = vec!["--san", san.as_str()];
    args.extend_from_slice(extra);
    crate::ControlPlane::start_dev_on(data_dir, &format!("{addr}:0"), &args)
}

/// Runs `f` on a thread that has entered network namespace `ns` (setns acts on the calling
/// thread only).
pub fn on_thread_in<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> std::thread::JoinHandle<Result<T>> {
    let path = std::path::Path::new("/run/netns").join(ns);
    std::thread::spawn(move || {
        let file =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .with_context(|| format!("entering {}", path.display()))?;
        f()
    })
}

/// Sends `bytes` over TCP from a thread in `client_ns` to a sink on `server_ip` in
/// `server_ns`; the sink answers how many bytes it read before EOF, which is returned. Every
/// step is bounded by `bound`.
pub fn tcp_transfer(
    server_ns: &str,
    server_ip: Ipv4Addr,
    client_ns: &str,
    bytes: u64,
    bound: std::time::Duration,
) -> Result<u64> {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};

    let (tx, rx) = std::sync::mpsc::channel();
    let sink = on_thread_in(server_ns, move || {
        let listener = TcpListener::bind(SocketAddr::from((server_ip, 0)))?;
        tx.send(listener.local_addr()?.port())?;
        // The client connects right after it learns the port; accept cannot hang past that
        // unless the client failed, and then the client's error ends the test first.
        let (mut s, _) = listener.accept()?;
        s.set_read_timeout(Some(bound))?;
        let mut buf = vec![0u8; 64 << 10];
        let mut total = 0u64;
        loop {
            let n = s.read(&mut buf).context("the sink's read")?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        s.write_all(&total.to_be_bytes())?;
        Ok(total)
    });
    let port: u16 = rx
        .recv_timeout(bound)
        .context("the sink did not start listening")?;
    let client = on_thread_in(client_ns, move || {
        let addr = SocketAddr::from((server_ip, port));
        let mut s = TcpStream::connect_timeout(&addr, bound)
            .with_context(|| format!("connecting to {addr}"))?;
        s.set_write_timeout(Some(bound))?;
        s.set_read_timeout(Some(bound))?;
        let chunk = vec![0x5au8; 64 << 10];
        let mut left = bytes;
        while left > 0 {
            let n = usize::try_from(left.min(chunk.len() as u64)).unwrap_or(chunk.len());
            s.write_all(&chunk[..n]).context("the client's write")?;
            left -= n as u64;
        }
        s.shutdown(std::net::Shutdown::Write)?;
        let mut answer = [0u8; 8];
        s.read_exact(&mut answer)
            .context("reading the sink's byte count")?;
        Ok(u64::from_be_bytes(answer))
    });
    let counted = client
        .join()
        .map_err(|_| anyhow::anyhow!("the client thread panicked"))??;
    let received = sink
        .join()
        .map_err(|_| anyhow::anyhow!("the sink thread panicked"))??;
    if counted != received {
        bail!("the sink read {received} bytes but answered {counted}");
    }
    Ok(received)
}
