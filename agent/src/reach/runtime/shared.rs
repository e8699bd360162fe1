//! What the reach runtime's handle (`mod.rs`) and its loop (`event_loop.rs`, `relays.rs`,
//! `peers.rs`, `underlay.rs`) share: the setup, the queue's events, the state the daemon's
//! calls leave and the views the loop publishes. Its own module so neither of the two imports
//! the other's internals.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::SystemTime;

use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::signed::SignedEnvelope;

use crate::reach::forward::Underlay;
use crate::reach::io::{Effect, OwnCandidates, PeerPathView, PeerReach};
use crate::reach::relay_client::tcp::TcpEvent;
use plexd_dataplane::{LinkDoor, LinkQueue};
use plexsphere_wire::key::PublicKey;

/// Datagrams (and wake-ups) waiting for the loop; more are dropped and counted.
pub const EVENT_QUEUE: usize = 1024;
/// A relay connection other than the home relay's closes after this long unused (decided in
/// the relay set, `reach::node::relays`).
pub use crate::reach::node::relays::RELAY_IDLE;
/// How often STUN runs, the host's addresses and the data plane's handshakes are read (decided
/// in the schedule, `reach::node::schedule`).
pub use crate::reach::node::schedule::{ADDRS_EVERY, HANDSHAKES_EVERY, STUN_EVERY};

/// What the runtime needs of the data plane: write one peer's endpoint (nothing else of the
/// peer), read the handshake times. A direct path is always the peer's endpoint itself (the
/// data plane's or the kernel's); what differs between the backends is only whether the data
/// plane frames for relays itself ([`Self::relay_endpoint`], [`Self::set_relays`]: the
/// userspace one does, the kernel's answers the defaults and its relayed peers get forwarders).
pub trait PathControl: Send + 'static {
    fn set_endpoint(&self, peer: PublicKey, endpoint: SocketAddr) -> io::Result<()>;
    fn handshakes(&self) -> io::Result<Vec<(PublicKey, Option<SystemTime>)>>;

    /// The data plane's own endpoint "through the relay at `relay` (its UDP address) to
    /// `peer`", when the data plane frames for relays itself (the userspace one:
    /// `plexd_dataplane::relay`); `None`: a loopback forwarder carries the peer (kernel).
    fn relay_endpoint(&self, relay: SocketAddr, peer: PublicKey) -> io::Result<Option<SocketAddr>> {
        let _ = (relay, peer);
        Ok(None)
    }

    /// The relays whose `recv` frames the data plane unwraps itself: the ones the runtime has
    /// a connection with over UDP. Frames from any other address stay with the runtime.
    fn set_relays(&self, relays: &[SocketAddr]) -> io::Result<()> {
        let _ = relays;
        Ok(())
    }

    /// The data plane's own endpoint "on the relay link `link` (TCP/TLS) to `peer`", when the
    /// data plane carries peers on links itself (the userspace one:
    /// `plexd_dataplane::relay_link`); `None`: a loopback forwarder carries the peer (kernel).
    fn link_endpoint(
        &self,
        link: &Arc<LinkQueue>,
        peer: PublicKey,
    ) -> io::Result<Option<SocketAddr>> {
        let _ = (link, peer);
        Ok(None)
    }

    /// Where relay links' readers hand the data plane the WireGuard `recv`s for the peers it
    /// carries on links (`None`: every frame goes to the runtime).
    fn link_door(&self) -> Option<LinkDoor> {
        None
    }
}

/// The host's addresses worth offering as candidates (already filtered).
pub type LocalAddrs = Box<dyn Fn() -> Vec<IpAddr> + Send>;
/// A port read when needed (the data plane's may change with a rebind).
pub type PortFn = Box<dyn Fn() -> u16 + Send>;

/// Everything [`Runtime::start`] needs.
pub struct RuntimeSetup {
    /// The node's WireGuard private key (disco keys, relay proofs).
    pub secret: [u8; 32],
    /// The Domain's mesh range (never a disco candidate).
    pub mesh: ipnet::IpNet,
    /// Where reach's datagrams go out (the WireGuard socket, or the kernel's shared port).
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
    /// What a relay's TCP connection read (its end comes through `Shared::closed`).
    Tcp { relay: String, event: TcpEvent },
    /// The daemon stored something new.
    Wake,
}

/// What the daemon's calls left for the loop.
#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) peers: Option<Vec<PeerReach>>,
    pub(crate) relays: Option<(Vec<RelaySpec>, Vec<SocketAddr>)>,
    pub(crate) token: Option<SignedEnvelope>,
    pub(crate) effects: Vec<Effect>,
    /// A rotated WireGuard private key.
    pub(crate) secret: Option<[u8; 32]>,
}

/// What the loop publishes.
#[derive(Default)]
pub(crate) struct View {
    pub(crate) paths: Vec<PeerPathView>,
    pub(crate) own: OwnCandidates,
}

pub(crate) struct Shared {
    pub(crate) pending: Mutex<Pending>,
    pub(crate) view: Mutex<View>,
    /// Per peer whose endpoint is reach's: where reach carries it now.
    pub(crate) owners: RwLock<HashMap<PublicKey, Option<SocketAddr>>>,
    pub(crate) events: SyncSender<Event>,
    pub(crate) stop: AtomicBool,
    /// Relay TCP connections that ended (relay, why), for the loop's next turn: beside the
    /// queue, so a full queue cannot drop one (the loop would keep the relay up until it
    /// fell silent). At most one entry per connection, and connections are few (one per relay).
    pub(crate) closed: Mutex<Vec<(String, String)>>,
    /// Events the full queue dropped.
    pub(crate) dropped: AtomicU64,
    /// Relayed or underlay WireGuard datagrams from a peer no forwarder is for.
    pub(crate) unknown_src: AtomicU64,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn offer(shared: &Shared, datagram: &[u8], from: SocketAddr) -> bool {
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

/// Where a relay's TCP connection reports to the loop: a frame goes on the queue (dropped and
/// counted when it is full, as a datagram would be); the end of the connection goes on
/// `closed`, never dropped, with a wake-up.
pub(crate) fn tcp_sink(shared: Arc<Shared>, relay: String) -> impl Fn(TcpEvent) + Send + 'static {
    move |event| match event {
        TcpEvent::Closed(why) => {
            lock(&shared.closed).push((relay.clone(), why));
            // A full queue wakes the loop anyway.
            let _ = shared.events.try_send(Event::Wake);
        }
        frame @ TcpEvent::Frame(_) => {
            let sent = shared.events.try_send(Event::Tcp {
                relay: relay.clone(),
                event: frame,
            });
            if sent.is_err() {
                shared.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Shared {
    pub(crate) fn new(events: SyncSender<Event>) -> Self {
        Self {
            pending: Mutex::default(),
            view: Mutex::default(),
            owners: RwLock::default(),
            events,
            closed: Mutex::default(),
            stop: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            unknown_src: AtomicU64::new(0),
        }
    }
}
