//! DNS helpers of the end-to-end tests: a tiny authoritative server that stands for a host's
//! normal DNS (one name, everything else REFUSED), systemd-resolved's packages for the
//! machines (their image has no resolved), and a query client for the benchmark.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// A UDP server on `addr` that answers `name` with `ip` (TTL 5) and REFUSED for anything else;
/// it stops when dropped.
pub struct UpstreamDns {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UpstreamDns {
    pub fn start(addr: SocketAddr, name: &str, ip: std::net::Ipv4Addr) -> Result<Self> {
        let socket = UdpSocket::bind(addr).with_context(|| format!("binding {addr}"))?;
        socket.set_read_timeout(Some(Duration::from_millis(200)))?;
        let addr = socket.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let want = Name::from_ascii(name)?.to_lowercase();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !flag.load(Ordering::Relaxed) {
                let Ok((n, src)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                let Ok(q) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let mut r = Message::response(q.metadata.id, OpCode::Query);
                r.metadata.recursion_desired = q.metadata.recursion_desired;
                r.metadata.recursion_available = true;
                r.add_queries(q.queries.iter().cloned());
                match q.queries.first() {
                    Some(question) if question.name().to_lowercase() == want => {
                        if question.query_type() == RecordType::A {
                            r.add_answer(Record::from_rdata(
                                question.name().clone(),
                                5,
                                RData::A(A(ip)),
                            ));
                        }
                    }
                    _ => r.metadata.response_code = ResponseCode::Refused,
                }
                if let Ok(bytes) = r.to_vec() {
                    let _ = socket.send_to(&bytes, src);
                }
            }
        });
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for UpstreamDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The Debian packages of systemd-resolved (and its NSS module) for bookworm machines,
/// which scripts/deps.sh downloads with the host's apt into `/var/cache/plexsphere/debs` (the
/// image is built from the host's mirror, so the versions match its systemd).
pub fn resolved_debs() -> Result<Vec<PathBuf>> {
    let dir = PathBuf::from("/var/cache/plexsphere/debs");
    std::fs::create_dir_all(&dir)?;
    let mut out = Vec::new();
    for pkg in ["systemd-resolved", "libnss-resolve"] {
        let find = |dir: &PathBuf| -> Result<Option<PathBuf>> {
            Ok(std::fs::read_dir(dir)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&format!("{pkg}_")) && n.ends_with(".deb"))
                }))
        };
        if let Some(p) = find(&dir)? {
            out.push(p);
            continue;
        }
        bail!(
            "{pkg}'s .deb is not in {}: scripts/deps.sh downloads it (as root) before the tests",
            dir.display()
        );
    }
    Ok(out)
}

/// One A query for `name` to `server` over UDP: the addresses, or the response code's name.
pub fn query_a(socket: &UdpSocket, server: SocketAddr, name: &str, id: u16) -> Result<Vec<IpAddr>> {
    let mut q = Message::new(id, MessageType::Query, OpCode::Query);
    q.metadata.recursion_desired = true;
    q.add_query(Query::query(Name::from_ascii(name)?, RecordType::A));
    socket.send_to(&q.to_vec()?, server)?;
    let mut buf = [0u8; 1500];
    let n = socket.recv(&mut buf)?;
    let r = Message::from_vec(&buf[..n])?;
    if r.metadata.response_code != ResponseCode::NoError {
        bail!("{name}: {}", r.metadata.response_code);
    }
    Ok(r.answers
        .iter()
        .filter_map(|a| match &a.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            _ => None,
        })
        .collect())
}
