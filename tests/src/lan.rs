//! A network behind mesh nodes, for the route tests: a namespace holding a bridge with its
//! own address (the host `H`, with no plexd), and veths from node namespaces into it, so
//! several routers can sit on one LAN and each can lose its link. Names carry the pid and a
//! counter; the namespace is removed on drop (and the veths with it). Needs root and `ip`.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::Result;

use crate::netns::ip;

static NEXT: AtomicU8 = AtomicU8::new(0);

/// A LAN namespace: a bridge `br0` whose address is the LAN's host.
pub struct Lan {
    pub ns: String,
    /// The LAN's first three octets (`a.b.c.0/24`).
    net: [u8; 3],
    legs: u8,
}

impl Lan {
    /// A LAN `a.b.c.0/24` whose host `H` is `.5` (the bridge's own address).
    pub fn new(tag: &str, net: [u8; 3]) -> Result<Self> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let ns = format!("pxl{tag}{}x{n}", std::process::id() % 100_000);
        ip(&["netns", "add", &ns])?;
        let lan = Self { ns, net, legs: 0 };
        lan.here(&["link", "set", "lo", "up"])?;
        lan.here(&["link", "add", "br0", "type", "bridge"])?;
        let host = format!("{}/24", lan.host());
        lan.here(&["addr", "add", &host, "dev", "br0"])?;
        lan.here(&["link", "set", "br0", "up"])?;
        Ok(lan)
    }

    fn here(&self, args: &[&str]) -> Result<()> {
        let mut a = vec!["-n", self.ns.as_str()];
        a.extend_from_slice(args);
        ip(&a)
    }

    /// The host `H` on the LAN (no plexd): `a.b.c.5`.
    pub fn host(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.net[0], self.net[1], self.net[2], 5)
    }

    /// The LAN's prefix, `a.b.c.0/24`.
    pub fn cidr(&self) -> String {
        format!("{}.{}.{}.0/24", self.net[0], self.net[1], self.net[2])
    }

    /// Puts node namespace `node_ns` on the LAN with interface `iface` and the next address
    /// (`.10`, `.11`, ...); answers the address.
    pub fn attach(&mut self, node_ns: &str, iface: &str) -> Result<Ipv4Addr> {
        let leg = format!("l{}", self.legs);
        let addr = Ipv4Addr::new(self.net[0], self.net[1], self.net[2], 10 + self.legs);
        self.legs += 1;
        self.here(&[
            "link", "add", &leg, "type", "veth", "peer", "name", iface, "netns", node_ns,
        ])?;
        self.here(&["link", "set", &leg, "master", "br0", "up"])?;
        ip(&[
            "-n",
            node_ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            iface,
        ])?;
        ip(&["-n", node_ns, "link", "set", iface, "up"])?;
        Ok(addr)
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.ns])
            .output();
    }
}
