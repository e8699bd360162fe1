//! The namespaces, veths, bridges and routers of a NAT topology (the picture is in `crate::nat`).

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail, ensure};

use super::rules::{NatMode, ruleset};
use crate::netns::{exec, ip};

/// The public segment's prefix (TEST-NET-3): the servers and the routers' WAN sides.
pub const PUBLIC_PREFIX: [u8; 3] = [203, 0, 113];
/// The public namespace's own address on the segment (the gateway of every router).
pub const PUBLIC_GATEWAY: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// Server aliases on the public segment start here (.10, .11, ...).
const FIRST_SERVER_HOST: u8 = 10;
/// Routers' WAN addresses start here (.100, .101, ...).
const FIRST_ROUTER_HOST: u8 = 100;
/// Node addresses on a router's LAN start here (.10, .11, ...).
const FIRST_NODE_HOST: u8 = 10;
/// At most this many routers and server aliases per topology (the addresses above must not
/// overlap: .10-.99 for servers, .100-.199 for routers).
pub const MAX_ROUTERS: usize = 90;
pub const MAX_SERVERS: usize = 90;
/// At most this many nodes behind one router (.10-.249 of its LAN).
pub const MAX_NODES_PER_ROUTER: usize = 240;

static NEXT: AtomicU32 = AtomicU32::new(0);

struct Router {
    ns: String,
    mode: NatMode,
    nodes: Vec<String>,
    /// Taps for guests on the LAN (they take node addresses after the namespaces').
    taps: usize,
}

/// A public segment, its routers and their nodes.
pub struct Topology {
    tag: String,
    public: String,
    servers: usize,
    routers: Vec<Router>,
}

impl Topology {
    /// Creates the public namespace with its bridge and gateway address.
    pub fn new() -> Result<Self> {
        ensure!(
            nix::unistd::geteuid().is_root(),
            "the NAT topologies need root (network namespaces, nftables)"
        );
        for (tool, package) in [("nft", "nftables"), ("conntrack", "conntrack")] {
            ensure!(
                Command::new(tool).arg("--version").output().is_ok(),
                "`{tool}` is not installed: apt-get install {package} (scripts/deps.sh does)"
            );
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{}x{}", std::process::id(), n % 100);
        let topo = Self {
            public: format!("pxnpub{tag}"),
            tag,
            servers: 0,
            routers: Vec::new(),
        };
        ip(&["netns", "add", &topo.public])?;
        let p = topo.public.as_str();
        ip(&["-n", p, "link", "set", "lo", "up"])?;
        ip(&["-n", p, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", p, "link", "set", "br0", "up"])?;
        ip(&[
            "-n",
            p,
            "addr",
            "add",
            &format!("{PUBLIC_GATEWAY}/24"),
            "dev",
            "br0",
        ])?;
        sysctl(p, "net.ipv4.ip_forward", "1")?;
        Ok(topo)
    }

    /// The public namespace (control plane, relays, echo servers run here).
    pub fn public_ns(&self) -> &str {
        &self.public
    }

    /// A new address on the public segment for one more server; returns it.
    pub fn add_public_addr(&mut self) -> Result<Ipv4Addr> {
        ensure!(
            self.servers < MAX_SERVERS,
            "at most {MAX_SERVERS} public servers"
        );
        let host = FIRST_SERVER_HOST + u8::try_from(self.servers)?;
        let addr = public(host);
        ip(&[
            "-n",
            &self.public,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            "br0",
        ])?;
        self.servers += 1;
        Ok(addr)
    }

    /// Adds a router in `mode`; returns its index.
    pub fn add_router(&mut self, mode: NatMode) -> Result<usize> {
        let i = self.routers.len();
        ensure!(i < MAX_ROUTERS, "at most {MAX_ROUTERS} routers");
        let ns = format!("pxnr{}r{i}", self.tag);
        ip(&["netns", "add", &ns])?;
        self.routers.push(Router {
            ns: ns.clone(),
            mode,
            nodes: Vec::new(),
            taps: 0,
        });
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        let leg = format!("r{i}");
        ip(&[
            "-n",
            &self.public,
            "link",
            "add",
            &leg,
            "type",
            "veth",
            "peer",
            "name",
            "wan",
            "netns",
            &ns,
        ])?;
        ip(&[
            "-n",
            &self.public,
            "link",
            "set",
            &leg,
            "master",
            "br0",
            "up",
        ])?;
        let wan = format!("{}/24", self.router_wan(i));
        ip(&["-n", &ns, "addr", "add", &wan, "dev", "wan"])?;
        ip(&["-n", &ns, "link", "set", "wan", "up"])?;
        ip(&[
            "-n",
            &ns,
            "route",
            "add",
            "default",
            "via",
            &PUBLIC_GATEWAY.to_string(),
        ])?;
        sysctl(&ns, "net.ipv4.ip_forward", "1")?;
        self.set_mode(i, mode)?;
        Ok(i)
    }

    /// Adds a node namespace behind router `r`; returns its name. Its address is
    /// [`Topology::node_addr`] of its slot on the LAN.
    pub fn add_node(&mut self, r: usize) -> Result<String> {
        let (rns, k) = self.lan_slot(r)?;
        let ns = format!("pxnn{}r{r}n{k}", self.tag);
        ip(&["netns", "add", &ns])?;
        if let Some(router) = self.routers.get_mut(r) {
            router.nodes.push(ns.clone());
        }
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        let leg = format!("n{k}");
        ip(&[
            "-n", &rns, "link", "add", &leg, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        ip(&["-n", &rns, "link", "set", &leg, "master", "lan", "up"])?;
        let addr = format!("{}/24", self.node_addr(r, k));
        ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        ip(&[
            "-n",
            &ns,
            "route",
            "add",
            "default",
            "via",
            &lan(r, 1).to_string(),
        ])?;
        Ok(ns)
    }

    /// Adds a tap on router `r`'s LAN for a guest (qemu runs in the router's namespace and
    /// attaches to it); returns the tap's name and the address the guest should take.
    pub fn add_tap(&mut self, r: usize) -> Result<(String, Ipv4Addr)> {
        let (rns, k) = self.lan_slot(r)?;
        let tap = format!("t{k}");
        ip(&["-n", &rns, "tuntap", "add", "dev", &tap, "mode", "tap"])?;
        ip(&["-n", &rns, "link", "set", &tap, "master", "lan", "up"])?;
        if let Some(router) = self.routers.get_mut(r) {
            router.taps += 1;
        }
        Ok((tap, self.node_addr(r, k)))
    }

    /// Router `r`'s namespace and the next free slot on its LAN (the LAN bridge is created
    /// with the first).
    fn lan_slot(&self, r: usize) -> Result<(String, usize)> {
        let router = self.routers.get(r).context("no such router")?;
        let k = router.nodes.len() + router.taps;
        ensure!(
            k < MAX_NODES_PER_ROUTER,
            "at most {MAX_NODES_PER_ROUTER} nodes per router"
        );
        let rns = router.ns.clone();
        if k == 0 {
            ip(&["-n", &rns, "link", "add", "lan", "type", "bridge"])?;
            ip(&[
                "-n",
                &rns,
                "addr",
                "add",
                &format!("{}/24", lan(r, 1)),
                "dev",
                "lan",
            ])?;
            ip(&["-n", &rns, "link", "set", "lan", "up"])?;
        }
        Ok((rns, k))
    }

    /// Router `r`'s LAN gateway (what its nodes and guests route through).
    pub fn lan_gateway(&self, r: usize) -> Ipv4Addr {
        lan(r, 1)
    }

    /// Replaces router `r`'s ruleset with `mode`'s and flushes its conntrack table, so every
    /// flow is translated afresh under the new rules.
    pub fn set_mode(&mut self, r: usize, mode: NatMode) -> Result<()> {
        let ns = self.router_ns(r)?.to_owned();
        let rules = ruleset(mode);
        let mut child = crate::netns::in_netns(&ns, Command::new("nft").args(["-f", "-"]))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("running nft")?;
        if let Some(mut stdin) = child.stdin.take() {
            std::io::Write::write_all(&mut stdin, rules.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "nft -f in {ns} failed: {}\n{rules}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        // Routing only: the public segment routes the LAN to the router; NAT: it does not.
        let route = format!("10.200.{r}.0/24");
        let via = self.router_wan(r).to_string();
        let _ = exec(&self.public, "ip", &["route", "del", &route]);
        if mode == NatMode::None {
            ip(&["-n", &self.public, "route", "add", &route, "via", &via])?;
        }
        let out = exec(&ns, "conntrack", &["-F"])?;
        ensure!(
            out.status.success(),
            "conntrack -F in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        if let Some(router) = self.routers.get_mut(r) {
            router.mode = mode;
        }
        Ok(())
    }

    pub fn mode(&self, r: usize) -> Option<NatMode> {
        self.routers.get(r).map(|x| x.mode)
    }

    pub fn router_ns(&self, r: usize) -> Result<&str> {
        self.routers
            .get(r)
            .map(|x| x.ns.as_str())
            .context("no such router")
    }

    /// The UDP conntrack entries router `r` holds for datagrams that came to its own WAN address
    /// from another router's (an input that accepts keeps them, [`NatMode::EimInputAccept`]),
    /// as `conntrack -L` prints them. Every entry of a node's own traffic starts at its LAN
    /// address, so these are the datagrams that arrived before the node sent to their source.
    pub fn routers_own_udp_entries(&self, r: usize) -> Result<Vec<String>> {
        let ns = self.router_ns(r)?;
        let out = exec(ns, "conntrack", &["-L", "-p", "udp"])?;
        ensure!(
            out.status.success(),
            "conntrack -L in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let wan = self.router_wan(r).to_string();
        let others: Vec<String> = (0..self.routers.len())
            .filter(|&o| o != r)
            .map(|o| self.router_wan(o).to_string())
            .collect();
        let first = |line: &str, key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .map(str::to_owned)
        };
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|line| {
                first(line, "dst=").as_deref() == Some(wan.as_str())
                    && first(line, "src=").is_some_and(|src| others.contains(&src))
            })
            .map(str::to_owned)
            .collect())
    }

    /// Router `r`'s address on the public segment (what its nodes' traffic comes from).
    pub fn router_wan(&self, r: usize) -> Ipv4Addr {
        public(FIRST_ROUTER_HOST + u8::try_from(r).unwrap_or(0))
    }

    /// The address of node `k` behind router `r`.
    pub fn node_addr(&self, r: usize, k: usize) -> Ipv4Addr {
        lan(r, FIRST_NODE_HOST + u8::try_from(k).unwrap_or(0))
    }

    /// A WireGuard interface name unique on this machine for node `k` behind router `r`
    /// (UAPI sockets in /var/run/wireguard are shared by every namespace; at most 15 bytes).
    pub fn wg_iface(&self, r: usize, k: usize) -> String {
        let pid = std::process::id() % 100_000;
        let n = self.tag.rsplit('x').next().unwrap_or("0");
        format!("pxq{pid}{n}r{r}{k}")
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for r in 0..self.routers.len() {
            for k in 0..self.routers[r].nodes.len() {
                let sock = format!("/var/run/wireguard/{}.sock", self.wg_iface(r, k));
                let _ = std::fs::remove_file(sock);
            }
        }
        let names = self
            .routers
            .iter()
            .flat_map(|r| r.nodes.iter().chain(std::iter::once(&r.ns)))
            .chain(std::iter::once(&self.public));
        for ns in names {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

fn public(host: u8) -> Ipv4Addr {
    let [a, b, c] = PUBLIC_PREFIX;
    Ipv4Addr::new(a, b, c, host)
}

fn lan(r: usize, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, u8::try_from(r).unwrap_or(255), host)
}

/// Sets a sysctl inside namespace `ns`.
fn sysctl(ns: &str, key: &str, value: &str) -> Result<()> {
    let out = exec(ns, "sysctl", &["-qw", &format!("{key}={value}")])?;
    ensure!(
        out.status.success(),
        "sysctl {key}={value} in {ns}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}
