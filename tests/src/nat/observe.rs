//! What the reach tests observe of a [`ReachLab`]: the path `plexd status --output json`
//! reports per peer, pings and TCP transfers over the mesh IPs, and a long-lived TCP stream
//! that must survive a path change.
//!
//! The status fields are the reach runtime's (`peers[].path.kind` "direct" | "relay" | "none",
//! `path.endpoint`, `path.relay`, `path.transport` "udp" | "tcp", `peers[].rtt_ms`); peers are
//! found by `mesh_ip` (every node namespace shares the host's hostname).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use super::mesh::ReachLab;
use crate::netns::{exec, on_thread_in};
use crate::wait_until;

/// One peer's path as `plexd status --output json` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPath {
    /// "direct", "relay" or "none".
    pub kind: String,
    pub endpoint: Option<SocketAddr>,
    pub relay: Option<String>,
    /// "udp" or "tcp" (relayed paths).
    pub transport: Option<String>,
    pub rtt_ms: Option<u64>,
    /// The data plane's endpoint for the peer (`peers[].endpoint`): a loopback forwarder's
    /// `127.0.0.1:port`, a relay endpoint in `100::/64` (userspace, relayed over UDP), or the
    /// peer's address.
    pub wg_endpoint: Option<SocketAddr>,
}

impl PeerPath {
    /// The path of one `peers[]` entry; `None` when the entry has no `path` object.
    pub fn of_peer(peer: &serde_json::Value) -> Option<Self> {
        let path = peer.get("path")?.as_object()?;
        let text = |k: &str| path.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        Some(Self {
            kind: text("kind")?,
            endpoint: text("endpoint").and_then(|e| e.parse().ok()),
            relay: text("relay"),
            transport: text("transport"),
            rtt_ms: peer.get("rtt_ms").and_then(serde_json::Value::as_u64),
            wg_endpoint: peer
                .get("endpoint")
                .and_then(|v| v.as_str())
                .and_then(|e| e.parse().ok()),
        })
    }

    pub fn is_direct(&self) -> bool {
        self.kind == "direct"
    }

    /// The data plane carries the peer through a relay itself (a relay endpoint in
    /// `100::/64`, `plexd_dataplane::relay`), not through a loopback forwarder.
    pub fn is_relayed_in_data_plane(&self) -> bool {
        matches!(self.wg_endpoint, Some(SocketAddr::V6(v6)) if v6.ip().segments()[..4] == [0x100, 0, 0, 0])
    }

    /// Relayed over `transport` ("udp" or "tcp").
    pub fn is_relayed_over(&self, transport: &str) -> bool {
        self.kind == "relay" && self.transport.as_deref() == Some(transport)
    }
}

/// The `peers[]` entry with mesh IP `ip` in a status JSON.
pub fn peer_entry(status: &serde_json::Value, ip: Ipv4Addr) -> Option<&serde_json::Value> {
    let ip = ip.to_string();
    status["peers"]
        .as_array()?
        .iter()
        .find(|p| p["mesh_ip"].as_str() == Some(ip.as_str()))
}

impl ReachLab {
    /// The path node `from` reports towards node `to`.
    pub fn path(&self, from: usize, to: usize) -> Result<Option<PeerPath>> {
        let ip = self.mesh_ip(to)?;
        let n = self.nodes.get(from).context("no such node")?;
        let Some(status) = n.host.status()? else {
            return Ok(None);
        };
        Ok(peer_entry(&status, ip).and_then(PeerPath::of_peer))
    }

    /// Waits until node `from`'s path to `to` satisfies `want` (described by `what`).
    pub fn wait_path(
        &self,
        from: usize,
        to: usize,
        what: &str,
        bound: Duration,
        want: impl Fn(&PeerPath) -> bool,
    ) -> Result<PeerPath> {
        let mut last = None;
        wait_until(
            bound,
            &format!("node {from}'s path to node {to} is {what}"),
            || {
                let p = self.path(from, to)?;
                last.clone_from(&p);
                Ok(p.filter(|p| want(p)))
            },
        )
        .with_context(|| format!("last path: {last:?}\n{}", self.dump()))
    }

    /// One ping from node `from` to node `to`'s mesh IP.
    pub fn ping(&self, from: usize, to: usize) -> Result<bool> {
        let ip = self.mesh_ip(to)?.to_string();
        let n = self.nodes.get(from).context("no such node")?;
        let out = exec(&n.ns, "ping", &["-c", "1", "-W", "1", &ip])?;
        Ok(out.status.success())
    }

    /// Node `from` pings node `to` with full-size packets (1420 bytes, the tunnel MTU, with
    /// DF) and no packet of the path is fragmented by node `from`'s host: its IPv4
    /// `FragCreates` counter stays where it was. Answers how many of `count` pings came back.
    pub fn full_size_pings_unfragmented(&self, from: usize, to: usize, count: u32) -> Result<u32> {
        let ip = self.mesh_ip(to)?.to_string();
        let n = self.nodes.get(from).context("no such node")?;
        let frags = |ns: &str| -> Result<u64> {
            let out = exec(ns, "cat", &["/proc/net/snmp"])?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let mut lines = text.lines().filter(|l| l.starts_with("Ip:"));
            let (names, values) = (
                lines.next().context("no Ip: header")?,
                lines.next().context("no Ip: values")?,
            );
            let i = names
                .split_whitespace()
                .position(|w| w == "FragCreates")
                .context("no FragCreates")?;
            values
                .split_whitespace()
                .nth(i)
                .context("no FragCreates value")?
                .parse()
                .context("FragCreates is not a number")
        };
        let before = frags(&n.ns)?;
        let mut answered = 0;
        for _ in 0..count {
            // 1392 bytes of data + 8 (ICMP) + 20 (IPv4) = 1420.
            let out = exec(
                &n.ns,
                "ping",
                &["-c", "1", "-W", "2", "-M", "do", "-s", "1392", &ip],
            )?;
            answered += u32::from(out.status.success());
        }
        let after = frags(&n.ns)?;
        ensure!(
            after == before,
            "node {from}'s host fragmented {} datagrams while it sent full-size pings",
            after - before
        );
        Ok(answered)
    }

    /// Waits until node `from` pings node `to` over the mesh.
    pub fn wait_ping(&self, from: usize, to: usize, bound: Duration) -> Result<()> {
        wait_until(bound, &format!("node {from} pings node {to}"), || {
            Ok(self.ping(from, to)?.then_some(()))
        })
        .with_context(|| self.dump())
    }

    /// `bytes` over TCP from node `from` to a sink on node `to`'s mesh IP; the bytes it read.
    pub fn transfer(&self, from: usize, to: usize, bytes: u64, bound: Duration) -> Result<u64> {
        let ip = self.mesh_ip(to)?;
        let (c, s) = (
            self.nodes.get(from).context("no such node")?,
            self.nodes.get(to).context("no such node")?,
        );
        crate::netns::tcp_transfer(&s.ns, ip, &c.ns, bytes, bound)
            .with_context(|| format!("TCP node {from} -> {ip}\n{}", self.dump()))
    }

    /// A long-lived TCP stream from node `from` to node `to`'s mesh IP.
    pub fn long_stream(&self, from: usize, to: usize) -> Result<LongStream> {
        let ip = self.mesh_ip(to)?;
        let (c, s) = (
            self.nodes.get(from).context("no such node")?,
            self.nodes.get(to).context("no such node")?,
        );
        LongStream::start(&s.ns, ip, &c.ns)
    }
}

/// How much the long stream's client writes at a time, and how often.
const STREAM_CHUNK: usize = 16 << 10;
const STREAM_PACE: Duration = Duration::from_millis(50);
/// How long one write or read of the long stream may block: longer than a path change takes,
/// so only a dropped connection (a reset) ends the stream, not a pause.
const STREAM_STALL: Duration = Duration::from_secs(45);

/// A TCP connection over the mesh with data flowing all the time; it must not drop.
pub struct LongStream {
    received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    client: Option<JoinHandle<Result<u64>>>,
    sink: Option<JoinHandle<Result<u64>>>,
}

impl LongStream {
    fn start(server_ns: &str, ip: Ipv4Addr, client_ns: &str) -> Result<Self> {
        let received = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let count = Arc::clone(&received);
        let sink = on_thread_in(server_ns, move || {
            let listener = TcpListener::bind(SocketAddr::from((ip, 0)))?;
            tx.send(listener.local_addr()?.port())?;
            let (mut s, _) = listener.accept()?;
            s.set_read_timeout(Some(STREAM_STALL))?;
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = s.read(&mut buf).context("the long stream's sink read")?;
                if n == 0 {
                    return Ok(count.load(Ordering::Relaxed));
                }
                count.fetch_add(n as u64, Ordering::Relaxed);
            }
        });
        let port: u16 = rx
            .recv_timeout(Duration::from_secs(10))
            .context("the long stream's sink did not listen")?;
        let flag = Arc::clone(&stop);
        let client = on_thread_in(client_ns, move || {
            let addr = SocketAddr::from((ip, port));
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                .with_context(|| format!("connecting to {addr}"))?;
            s.set_write_timeout(Some(STREAM_STALL))?;
            let chunk = vec![0xa5u8; STREAM_CHUNK];
            let mut sent = 0u64;
            while !flag.load(Ordering::Relaxed) {
                s.write_all(&chunk).context("the long stream's write")?;
                sent += chunk.len() as u64;
                std::thread::sleep(STREAM_PACE);
            }
            s.shutdown(std::net::Shutdown::Write)?;
            Ok(sent)
        });
        Ok(Self {
            received,
            stop,
            client: Some(client),
            sink: Some(sink),
        })
    }

    /// Bytes the sink has read so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Waits until at least `more` bytes beyond `since` arrived (data is flowing).
    pub fn wait_flowing(&self, since: u64, more: u64, bound: Duration) -> Result<u64> {
        wait_until(bound, "data flows on the long TCP stream", || {
            if self.client.as_ref().is_some_and(JoinHandle::is_finished) {
                bail!("the long stream's client ended (the connection dropped)");
            }
            let now = self.received();
            Ok((now >= since + more).then_some(now))
        })
    }

    /// Stops writing, closes, and checks both ends: every byte sent was read, no side failed.
    pub fn finish(mut self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        let sent = join(self.client.take(), "client")?;
        let read = join(self.sink.take(), "sink")?;
        if sent != read {
            bail!("the long stream sent {sent} bytes but the sink read {read}");
        }
        Ok(read)
    }
}

fn join(h: Option<JoinHandle<Result<u64>>>, what: &str) -> Result<u64> {
    h.context("already joined")?
        .join()
        .map_err(|_| anyhow::anyhow!("the long stream's {what} panicked"))?
}

impl Drop for LongStream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
