//! The loopback forwarders: one UDP socket on 127.0.0.1 per relayed peer whose data plane cannot
//! frame for the relay itself (with the kernel backend, every relayed peer; with the userspace
//! one, only a peer past the data plane's 64 relay slots). The
//! peer's WireGuard endpoint is the forwarder's address:
//!
//! - what the data plane sends there (from its socket on 127.0.0.1, the only source a
//!   forwarder takes) goes on along the forwarder's [`Route`]: wrapped in a relay `send` to the
//!   peer's key and sent to the relay (from the WireGuard socket or the kernel's shared port),
//!   or onto the relay's TCP connection;
//! - [`Forwarder::deliver`] hands a datagram that came from the peer (a relay `recv`) to the
//!   data plane from the forwarder's socket, so the data plane authenticates it and keeps (or
//!   roams to) the forwarder as the endpoint.
//!
//! Nothing queues: a datagram without a route is dropped and counted, like a lost packet.
//!
//! All forwarders run in one [`ForwardLoop`]: one thread waits on every forwarder's socket
//! with epoll and carries what is ready, so a thousand peers cost one thread, not a thousand.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

use plexsphere_wire::key::PublicKey;
use plexsphere_wire::reach::MAX_DATAGRAM;
use plexsphere_wire::reach::relay::Frame;

/// How long the loop's wait lasts before it looks at its stop flag.
pub(crate) const POLL: Duration = Duration::from_millis(200);
/// How many datagrams the loop takes from one ready forwarder before it turns to the next
/// (the wait is level-triggered: what is left wakes it again at once).
const DRAIN: usize = 64;
/// How many ready forwarders one wait answers.
const EVENTS: usize = 64;

/// The socket the reach runtime sends from: the WireGuard socket through the data plane's
/// side channel (userspace), or the shared port (kernel, `mesh::shared_port`).
pub trait Underlay: Send + Sync + 'static {
    fn send(&self, datagram: &[u8], to: SocketAddr) -> io::Result<()>;
}

impl Underlay for plexd_dataplane::RawSender {
    fn send(&self, datagram: &[u8], to: SocketAddr) -> io::Result<()> {
        plexd_dataplane::RawSender::send(self, datagram, to)
    }
}

/// A plain socket as the underlay: the tests' stand-in for the WireGuard socket or the shared
/// port (no backend sends from a socket of its own any more).
#[cfg(test)]
impl Underlay for UdpSocket {
    fn send(&self, datagram: &[u8], to: SocketAddr) -> io::Result<()> {
        self.send_to(datagram, to).map(|_| ())
    }
}

/// Where a forwarder sends what the data plane gives it.
#[derive(Debug, Clone)]
pub enum Route {
    /// Nowhere yet (no path): dropped and counted.
    Hold,
    /// Through the relay at this UDP address, to the peer's key.
    Relay { relay: SocketAddr, dst: PublicKey },
    /// Through a relay's TCP connection (stream-framed `send`s into its queue; full = dropped).
    RelayTcp {
        link: Arc<plexd_dataplane::LinkQueue>,
        dst: PublicKey,
    },
}

/// What a forwarder counted.
#[derive(Debug, Default)]
pub struct ForwardCounters {
    /// Datagrams from the data plane sent on along the route.
    pub out: AtomicU64,
    /// Datagrams from the peer handed to the data plane.
    pub delivered: AtomicU64,
    /// Datagrams from the data plane while the route was [`Route::Hold`], or that the
    /// underlay refused.
    pub dropped: AtomicU64,
    /// Datagrams from any other source than the data plane's socket.
    pub foreign: AtomicU64,
}

/// One peer's loopback forwarder; see the module docs.
pub struct Forwarder {
    socket: UdpSocket,
    addr: SocketAddr,
    /// The data plane's WireGuard socket as seen from loopback.
    wg: SocketAddr,
    route: RwLock<Route>,
    pub counters: ForwardCounters,
}

impl Forwarder {
    /// Binds 127.0.0.1:ephemeral for a data plane listening on `wg_port`.
    pub fn open(wg_port: u16) -> io::Result<Arc<Self>> {
        let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = socket.local_addr()?;
        Ok(Arc::new(Self {
            socket,
            addr,
            wg: SocketAddr::from((Ipv4Addr::LOCALHOST, wg_port)),
            route: RwLock::new(Route::Hold),
            counters: ForwardCounters::default(),
        }))
    }

    /// The address the peer's WireGuard endpoint is set to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn route(&self) -> Route {
        self.route
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn set_route(&self, route: Route) {
        *self.route.write().unwrap_or_else(PoisonError::into_inner) = route;
    }

    /// Hands a datagram from the peer to the data plane.
    pub fn deliver(&self, datagram: &[u8]) -> io::Result<()> {
        self.socket.send_to(datagram, self.wg)?;
        self.counters.delivered.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Takes up to [`DRAIN`] datagrams waiting on the (non-blocking) socket and carries them.
    fn drain(&self, underlay: &dyn Underlay, buf: &mut [u8], frame: &mut Vec<u8>) {
        for _ in 0..DRAIN {
            match self.socket.recv_from(buf) {
                Ok((n, from)) => self.carry(&buf[..n], from, underlay, frame),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::debug!(forwarder = %self.addr, error = %e, "forwarder read failed");
                    return;
                }
            }
        }
    }

    /// Carries one datagram from `from` along the route (see the module docs).
    fn carry(
        &self,
        datagram: &[u8],
        from: SocketAddr,
        underlay: &dyn Underlay,
        frame: &mut Vec<u8>,
    ) {
        if !same_socket(from, self.wg) {
            self.counters.foreign.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let sent = match self.route() {
            Route::Hold => Err(io::Error::other("no path")),
            Route::Relay { relay, dst } => {
                frame.clear();
                frame.extend_from_slice(&plexsphere_wire::reach::RELAY_MAGIC);
                Frame::Send {
                    dst: plexsphere_wire::reach::relay::prefix(&dst),
                    payload: datagram.to_vec(),
                }
                .encode_into(frame);
                underlay.send(frame, relay)
            }
            Route::RelayTcp { link, dst } => {
                if link.push_send(&plexsphere_wire::reach::relay::prefix(&dst), datagram) {
                    Ok(())
                } else {
                    Err(io::Error::other("the relay connection's queue is full"))
                }
            }
        };
        let c = match sent {
            Ok(()) => &self.counters.out,
            Err(_) => &self.counters.dropped,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Every forwarder of a runtime on one thread; see the module docs. Dropping it stops the
/// thread (within [`POLL`]).
pub struct ForwardLoop {
    inner: Arc<LoopInner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct LoopInner {
    epoll: Epoll,
    /// By the token the epoll registration carries.
    forwarders: RwLock<HashMap<u64, Arc<Forwarder>>>,
    next_token: AtomicU64,
    stop: AtomicBool,
}

impl ForwardLoop {
    /// Starts the loop's thread; it sends along routes through `underlay`.
    pub fn start(underlay: Arc<dyn Underlay>) -> io::Result<Self> {
        let inner = Arc::new(LoopInner {
            epoll: Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(io::Error::from)?,
            forwarders: RwLock::new(HashMap::new()),
            next_token: AtomicU64::new(1),
            stop: AtomicBool::new(false),
        });
        let me = inner.clone();
        let thread = thread::Builder::new()
            .name("reach-forward".into())
            .spawn(move || me.run(&*underlay))?;
        Ok(Self {
            inner,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Carries `f`'s datagrams from now on, until [`Self::remove`] with the token it answers.
    pub fn add(&self, f: &Arc<Forwarder>) -> io::Result<u64> {
        f.socket.set_nonblocking(true)?;
        let token = self.inner.next_token.fetch_add(1, Ordering::Relaxed);
        self.inner
            .forwarders
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(token, f.clone());
        let event = EpollEvent::new(EpollFlags::EPOLLIN, token);
        if let Err(e) = self.inner.epoll.add(f.socket.as_fd(), event) {
            self.forget(token);
            return Err(io::Error::from(e));
        }
        Ok(token)
    }

    /// Stops carrying the datagrams of the forwarder [`Self::add`] answered `token` for (its
    /// socket closes when its last holder drops it).
    pub fn remove(&self, token: u64) {
        let f = self
            .inner
            .forwarders
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&token);
        if let Some(f) = f {
            let _ = self.inner.epoll.delete(f.socket.as_fd());
        }
    }

    /// How many forwarders the loop carries.
    pub fn len(&self) -> usize {
        self.inner
            .forwarders
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn forget(&self, token: u64) {
        self.inner
            .forwarders
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&token);
    }

    /// Stops the thread and waits for it.
    pub fn stop(&self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for ForwardLoop {
    fn drop(&mut self) {
        self.stop();
    }
}

impl LoopInner {
    fn run(&self, underlay: &dyn Underlay) {
        let mut events = vec![EpollEvent::empty(); EVENTS];
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let mut frame = Vec::with_capacity(MAX_DATAGRAM);
        let wait = EpollTimeout::from(POLL.as_millis() as u16);
        while !self.stop.load(Ordering::Relaxed) {
            let n = match self.epoll.wait(&mut events, wait) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "the forwarders' wait failed");
                    thread::sleep(POLL);
                    continue;
                }
            };
            for event in &events[..n] {
                let f = self
                    .forwarders
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&event.data())
                    .cloned();
                if let Some(f) = f {
                    f.drain(underlay, &mut buf, &mut frame);
                }
            }
        }
    }
}

/// The data plane's socket may answer from 127.0.0.1 or ::ffff:127.0.0.1.
fn same_socket(from: SocketAddr, wg: SocketAddr) -> bool {
    let ip = match from {
        SocketAddr::V6(v6) => v6
            .ip()
            .to_ipv4_mapped()
            .map_or(std::net::IpAddr::V6(*v6.ip()), std::net::IpAddr::V4),
        SocketAddr::V4(v4) => std::net::IpAddr::V4(*v4.ip()),
    };
    ip == wg.ip() && from.port() == wg.port()
}
