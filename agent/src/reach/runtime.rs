//! The reach runtime: the thread that owns reach's sockets, drives the sans-IO
//! [`Engine`](super::engine::Engine) and performs its effects. docs/reach.md has the picture.
//!
//! - Inbound: every datagram of the WireGuard socket that is not WireGuard (the data plane's
//!   side channel, or plexd's own underlay socket with the kernel backend) arrives as an
//!   [`Event`] on one bounded queue ([`EVENT_QUEUE`]; full = dropped and counted). STUN answers
//!   go to the running [`StunProbe`](super::stun::StunProbe), disco to the engine, relay frames
//!   to their [`RelayConn`](super::relay_client::RelayConn).
//! - Outbound: everything goes out of the same socket ([`Underlay`]), so the reflexive address
//!   STUN learns is the one peers reach.
//! - The daemon's calls ([`ReachHandle`]) only store what they bring and wake the loop; the
//!   views (`paths`, `own_candidates`) are copies the loop refreshes after each step.
//! - The mesh diff asks [`Runtime`] (as [`EndpointOwners`]) whose a peer's endpoint is: a
//!   peer reach has a path for (every peer, with the kernel backend) is reach's.
//!
//! The loop runs at least every [`TICK`]: the engine's tick, the STUN schedule
//! ([`STUN_EVERY`], and at once on a network change), the host address poll
//! ([`ADDRS_EVERY`]), the handshake read ([`HANDSHAKES_EVERY`]) and the relay connections.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime};

use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::signed::SignedEnvelope;

use super::forward::{Forwarder, Underlay};
use super::io::{Effect, OwnCandidates, PeerPathView, PeerReach, ReachHandle, TICK};
use crate::mesh::diff::{EndpointOwners, Owner};
use crate::mesh::key::PeerKey;

#[path = "runtime_loop.rs"]
mod run_loop;

/// Datagrams (and wake-ups) waiting for the loop; more are dropped and counted.
pub const EVENT_QUEUE: usize = 1024;
/// STUN runs again this often (and on every network change).
pub const STUN_EVERY: Duration = Duration::from_secs(60);
/// The host's addresses are read this often (a change is a network change).
pub const ADDRS_EVERY: Duration = Duration::from_secs(5);
/// The data plane's handshake times are read this often.
pub const HANDSHAKES_EVERY: Duration = Duration::from_secs(2);
/// A relay connection other than the home relay's closes after this long unused.
pub const RELAY_IDLE: Duration = Duration::from_secs(60);

/// How the data plane is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The embedded data plane: direct paths are the peer's endpoint itself; only relayed
    /// peers get a forwarder.
    Userspace,
    /// Kernel WireGuard on another port: every peer's endpoint is its forwarder, and direct
    /// paths go out of plexd's underlay socket.
    Kernel,
}

/// What the runtime needs of the data plane: write one peer's endpoint (nothing else of the
/// peer), read the handshake times.
pub trait PathControl: Send + 'static {
    fn set_endpoint(&self, peer: PeerKey, endpoint: SocketAddr) -> io::Result<()>;
    fn handshakes(&self) -> io::Result<Vec<(PeerKey, Option<SystemTime>)>>;
}

/// The host's addresses worth offering as candidates (already filtered).
pub type LocalAddrs = Box<dyn Fn() -> Vec<IpAddr> + Send>;
/// A port read when needed (the data plane's may change with a rebind).
pub type PortFn = Box<dyn Fn() -> u16 + Send>;

/// Everything [`Runtime::start`] needs.
pub struct RuntimeSetup {
    /// The node's WireGuard private key (disco keys, relay proofs).
    pub secret: [u8; 32],
    pub mode: Mode,
    /// Where reach's datagrams go out (the WireGuard socket, or the underlay socket).
    pub underlay: Arc<dyn Underlay>,
    /// The port peers reach (the WireGuard listen port; the underlay's with the kernel).
    pub listen_port: PortFn,
    /// The data plane's port on 127.0.0.1, where forwarders deliver.
    pub wg_port: PortFn,
    pub control: Box<dyn PathControl>,
    pub local_addrs: LocalAddrs,
    /// The node's TLS trust for relays over TCP (`RelaySpec.tls`); without it relays are
    /// used over UDP only.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// What arrives on the loop's queue.
#[derive(Debug)]
pub enum Event {
    /// A datagram for reach on the WireGuard or underlay socket.
    Datagram { datagram: Vec<u8>, from: SocketAddr },
    /// What a relay's TCP connection read, or that it ended.
    Tcp {
        relay: String,
        event: super::relay_client_tcp::TcpEvent,
    },
    /// The daemon stored something new.
    Wake,
}

/// What the daemon's calls left for the loop.
#[derive(Default)]
struct Pending {
    peers: Option<Vec<PeerReach>>,
    relays: Option<(Vec<RelaySpec>, Vec<SocketAddr>)>,
    token: Option<SignedEnvelope>,
    effects: Vec<Effect>,
}

/// What the loop publishes.
#[derive(Default)]
struct View {
    paths: Vec<PeerPathView>,
    own: OwnCandidates,
}

pub(crate) struct Shared {
    pending: Mutex<Pending>,
    view: Mutex<View>,
    /// Per peer whose endpoint is reach's: where reach carries it now.
    owners: RwLock<HashMap<PeerKey, Option<SocketAddr>>>,
    /// With the kernel backend: the forwarder of the peer at each direct address, for what
    /// arrives on the underlay socket.
    by_direct: RwLock<HashMap<SocketAddr, Arc<Forwarder>>>,
    events: SyncSender<Event>,
    stop: AtomicBool,
    /// Events the full queue dropped.
    pub dropped: AtomicU64,
    /// Relayed or underlay WireGuard datagrams from a peer no forwarder is for.
    pub unknown_src: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The daemon's handle on the runtime; see the module docs.
pub struct Runtime {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Runtime {
    /// Starts the loop on its own thread.
    pub fn start(setup: RuntimeSetup) -> io::Result<Arc<Self>> {
        let (tx, rx): (SyncSender<Event>, Receiver<Event>) = mpsc::sync_channel(EVENT_QUEUE);
        let shared = Arc::new(Shared {
            pending: Mutex::default(),
            view: Mutex::default(),
            owners: RwLock::default(),
            by_direct: RwLock::default(),
            events: tx,
            stop: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            unknown_src: AtomicU64::new(0),
        });
        let s = shared.clone();
        let thread = thread::Builder::new()
            .name("plexd-reach".into())
            .spawn(move || run_loop::Loop::new(setup, s).run(&rx))?;
        Ok(Arc::new(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// Hands a datagram to the loop without blocking; `false` when the queue was full (the
    /// datagram is dropped and counted). The data plane's side channel calls this.
    pub fn offer(&self, datagram: &[u8], from: SocketAddr) -> bool {
        offer(&self.shared, datagram, from)
    }

    /// A sink for the data plane's side channel.
    pub fn side_sink(&self) -> plexd_dataplane::SideSink {
        let shared = self.shared.clone();
        plexd_dataplane::SideSink::new(move |d, from| offer(&shared, d, from))
    }

    /// Performs `effect` as if the engine had answered it (tests and tools: pin a path).
    pub fn perform(&self, effect: Effect) {
        lock(&self.shared.pending).effects.push(effect);
        self.wake();
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Receives on the kernel backend's underlay socket until the runtime stops: WireGuard
    /// from a peer's direct address goes to its forwarder, the rest to the loop.
    pub fn serve_underlay(
        self: &Arc<Self>,
        socket: Arc<std::net::UdpSocket>,
    ) -> io::Result<JoinHandle<()>> {
        let shared = self.shared.clone();
        socket.set_read_timeout(Some(TICK))?;
        thread::Builder::new()
            .name("reach-underlay".into())
            .spawn(move || run_loop::serve_underlay(&shared, &socket))
    }

    /// Stops the loop and its forwarders; waits for the loop thread.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.wake();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }

    fn wake(&self) {
        let _ = self.shared.events.try_send(Event::Wake);
    }
}

fn offer(shared: &Shared, datagram: &[u8], from: SocketAddr) -> bool {
    let ok = shared
        .events
        .try_send(Event::Datagram {
            datagram: datagram.to_vec(),
            from,
        })
        .is_ok();
    if !ok {
        shared.dropped.fetch_add(1, Ordering::Relaxed);
    }
    ok
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop();
    }
}

impl ReachHandle for Runtime {
    fn set_peers(&self, peers: Vec<PeerReach>) {
        lock(&self.shared.pending).peers = Some(peers);
        self.wake();
    }

    fn set_relays(&self, relays: Vec<RelaySpec>, stun: Vec<SocketAddr>) {
        lock(&self.shared.pending).relays = Some((relays, stun));
        self.wake();
    }

    fn set_relay_token(&self, token: SignedEnvelope) {
        lock(&self.shared.pending).token = Some(token);
        self.wake();
    }

    fn paths(&self) -> Vec<PeerPathView> {
        lock(&self.shared.view).paths.clone()
    }

    fn own_candidates(&self) -> OwnCandidates {
        lock(&self.shared.view).own.clone()
    }
}

impl EndpointOwners for Runtime {
    fn owner(&self, key: &PeerKey) -> Owner {
        match self
            .shared
            .owners
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
        {
            Some(endpoint) => Owner::Reach {
                endpoint: *endpoint,
            },
            None => Owner::Rotation,
        }
    }
}

#[cfg(test)]
#[path = "runtime_tests.rs"]
mod tests;
