//! The listeners: UDP and TCP on this node's mesh address, port [`DNS_PORT`], answering only
//! this host's own queries (a source that is one of its mesh addresses or loopback).
//!
//! The sockets are bound with `IP_FREEBIND`: the bind works before the interface has its
//! address, and the sockets keep receiving when the interface is removed and made again with
//! the same address (a restart of the data plane), so there is nothing to rebind. The mesh
//! address itself never changes while plexd runs (it is the node's identity).
//!
//! Limits (docs/dns.md "Limits"): [`MAX_QUERY_BYTES`], [`MAX_TCP_CONNECTIONS`], [`TCP_IDLE`],
//! [`MAX_QUERIES_PER_SEC`]; each drop is counted ([`Discard`]) and logged at most once per
//! [`LOG_EVERY`].

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::answer::{Transport, answer};
use super::limit::{Discard, Discards, RateLimit};
use super::zone::Zone;
use super::{LOG_EVERY, MAX_QUERIES_PER_SEC, MAX_QUERY_BYTES, MAX_TCP_CONNECTIONS, TCP_IDLE};

/// After a failed accept (out of file descriptors), the listener waits this long before the
/// next, so the error does not spin a core.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// What the listeners share with the daemon: the table (replaced on every change of the
/// names) and the counters.
pub struct Shared {
    zone: RwLock<Option<Arc<Zone>>>,
    own: Vec<IpAddr>,
    limits: Mutex<(RateLimit, Discards)>,
}

impl Shared {
    /// `own`: this node's mesh addresses (with loopback, the only sources answered).
    pub fn new(own: Vec<IpAddr>) -> Arc<Shared> {
        Arc::new(Shared {
            zone: RwLock::new(None),
            own,
            limits: Mutex::new((
                RateLimit::new(MAX_QUERIES_PER_SEC),
                Discards::new(LOG_EVERY),
            )),
        })
    }

    /// Replaces the table.
    pub(crate) fn set_zone(&self, zone: Option<Arc<Zone>>) {
        *self.zone.write().unwrap_or_else(|e| e.into_inner()) = zone;
    }

    pub fn zone(&self) -> Option<Arc<Zone>> {
        self.zone.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every drop of `kind` so far.
    pub fn dropped(&self, kind: Discard) -> u64 {
        self.limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .total(kind)
    }

    fn is_this_host(&self, src: IpAddr) -> bool {
        src.is_loopback() || self.own.contains(&src)
    }

    fn discard(&self, kind: Discard) {
        let now = Instant::now();
        let due = self
            .limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .count(kind, now);
        if let Some(n) = due {
            tracing::warn!(
                dropped = n,
                "DNS: dropped {n} {} (docs/dns.md \"Limits\")",
                kind.describe()
            );
        }
    }

    /// Whether a query from `src` of `len` bytes may be answered; counts it when not.
    fn admit(&self, src: IpAddr, len: usize) -> bool {
        if !self.is_this_host(src) {
            self.discard(Discard::Foreign);
            return false;
        }
        if len > MAX_QUERY_BYTES {
            self.discard(Discard::Size);
            return false;
        }
        let allowed = self
            .limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .allow(Instant::now());
        if !allowed {
            self.discard(Discard::Rate);
        }
        allowed
    }

    fn answer(&self, query: &[u8], transport: Transport) -> Option<Vec<u8>> {
        let zone = self.zone();
        let out = answer(zone.as_deref(), query, transport);
        if out.is_none() {
            self.discard(Discard::Unanswerable);
        }
        out
    }
}

fn socket(addr: SocketAddr, ty: Type, proto: Protocol) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), ty, Some(proto))?;
    match addr {
        SocketAddr::V4(_) => socket.set_freebind_v4(true)?,
        SocketAddr::V6(_) => {
            socket.set_only_v6(true)?;
            socket.set_freebind_v6(true)?;
        }
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// Binds the UDP socket and the TCP listener on `addr` (before the address exists is fine).
pub fn bind(addr: SocketAddr) -> io::Result<(UdpSocket, TcpListener)> {
    let udp = socket(addr, Type::DGRAM, Protocol::UDP)?;
    let udp = UdpSocket::from_std(udp.into())?;
    // Bind TCP on the UDP socket's port (an ephemeral port in tests picks it once).
    let tcp_addr = SocketAddr::new(addr.ip(), udp.local_addr()?.port());
    let tcp = socket(tcp_addr, Type::STREAM, Protocol::TCP)?;
    tcp.listen(128)?;
    let tcp = TcpListener::from_std(tcp.into())?;
    Ok((udp, tcp))
}

/// Serves both listeners until the returned tasks are aborted.
pub fn spawn(shared: Arc<Shared>, udp: UdpSocket, tcp: TcpListener) -> [JoinHandle<()>; 2] {
    [
        tokio::spawn(serve_udp(shared.clone(), udp)),
        tokio::spawn(serve_tcp(shared, tcp)),
    ]
}

async fn serve_udp(shared: Arc<Shared>, udp: UdpSocket) {
    let mut buf = vec![0u8; MAX_QUERY_BYTES + 1];
    loop {
        let (n, src) = match udp.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!("DNS: UDP receive: {e}");
                continue;
            }
        };
        if !shared.admit(src.ip(), n) {
            continue;
        }
        if let Some(out) = shared.answer(&buf[..n], Transport::Udp)
            && let Err(e) = udp.send_to(&out, src).await
        {
            tracing::debug!(%src, "DNS: UDP send: {e}");
        }
    }
}

async fn serve_tcp(shared: Arc<Shared>, tcp: TcpListener) {
    let slots = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS));
    loop {
        let (stream, src) = match tcp.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!("DNS: TCP accept: {e}");
                // An accept error (EMFILE) repeats at once: wait before the next try.
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        if !shared.is_this_host(src.ip()) {
            shared.discard(Discard::Foreign);
            continue;
        }
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            shared.discard(Discard::Connections);
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = serve_connection(&shared, stream, src.ip()).await {
                tracing::trace!(%src, "DNS: TCP connection ended: {e}");
            }
        });
    }
}

/// Queries on one TCP connection (RFC 7766: two-byte length, pipelined), until the asker
/// closes it or [`TCP_IDLE`] passes without a whole query.
async fn serve_connection(shared: &Shared, mut stream: TcpStream, src: IpAddr) -> io::Result<()> {
    let mut buf = vec![0u8; MAX_QUERY_BYTES];
    loop {
        let read = async {
            let len = usize::from(stream.read_u16().await?);
            if len > MAX_QUERY_BYTES {
                return Ok(None);
            }
            stream.read_exact(&mut buf[..len]).await?;
            Ok::<_, io::Error>(Some(len))
        };
        let len = match tokio::time::timeout(TCP_IDLE, read).await {
            Err(_) => return Ok(()),
            Ok(r) => r?,
        };
        let Some(len) = len else {
            shared.discard(Discard::Size);
            return Ok(());
        };
        if !shared.admit(src, len) {
            continue;
        }
        let Some(out) = shared.answer(&buf[..len], Transport::Tcp) else {
            continue;
        };
        let Ok(n) = u16::try_from(out.len()) else {
            continue;
        };
        let mut frame = Vec::with_capacity(out.len() + 2);
        frame.extend_from_slice(&n.to_be_bytes());
        frame.extend_from_slice(&out);
        stream.write_all(&frame).await?;
    }
}
