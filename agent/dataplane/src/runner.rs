//! The thin loop around the core: a TUN, a UDP socket and a clock feeding one `Device`.
//!
//! Three threads, so both cores work without reordering a flow: one reads the TUN and
//! encrypts to the network, one reads the network and decrypts to the TUN (the one packet loop
//! of each direction, `crate::loops`: a queue in front of the cipher so small packets go first
//! and standing queues are dropped from, `RunConfig::queue`, and the crypto inline or on the
//! ordered pool, `RunConfig::crypto_workers`), one drives timers every `tick`. A fourth serves
//! the UAPI socket when one is configured. Each direction keeps its own batches, so nothing is
//! allocated per packet. `run` returns when `shutdown` fires or a device fails (the TUN
//! interface removed, say), after stopping every thread.

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use plexsphere_wire::clock::Now;

use crate::batch::{DEFAULT_BATCH, PacketBatch};
use crate::config::DeviceUpdate;
use crate::device::{Crypto, Device};
use crate::io::{Tun, Udp, UdpBind};
pub use crate::loops::QueueConfig;
use crate::loops::{self, Loop, LoopError, LoopFn};
use crate::machine::Protocol;
use crate::pool::CryptoPool;
use crate::relay::send_framed;
use crate::relay_link::{LinkDeliver, LinkDoor, LinkInbox, LinkQueue};
pub use crate::shutdown::Shutdown;
use crate::side::{RawSender, SideSink};
use crate::uapi::{self, EADDRINUSE, EINVAL, Request};

/// The slot size of the timer thread's output (any handshake or keepalive message fits).
const TIMER_SLOT: usize = 256;

/// How the runner runs.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Where to serve the UAPI socket (`/var/run/wireguard/<iface>.sock`), if anywhere.
    pub uapi_socket: Option<PathBuf>,
    /// Packets per system call batch.
    pub batch: usize,
    /// How often timers run; boringtun needs at least every 250 ms.
    pub tick: Duration,
    /// How long a read waits before the thread looks at `shutdown` again.
    pub poll: Duration,
    /// Where datagrams that are not WireGuard go (STUN, disco, relay frames); see
    /// [`crate::side`]. Without one they are dropped and counted as malformed.
    pub side: Option<SideSink>,
    /// Filled with the current UDP socket (on bind and every rebind), so others can send from
    /// it; see [`crate::side`].
    pub raw: Option<RawSender>,
    /// The queues in front of the cipher: priority for small packets, CoDel, byte bounds.
    pub queue: QueueConfig,
    /// The packet and timer threads' nice value (Linux; a negative one needs CAP_SYS_NICE,
    /// and a refusal is logged, not fatal); `None` leaves them at the process's. See
    /// `crate::linux::sched`.
    pub nice: Option<i32>,
    /// Threads that seal and open packets beside the two packet threads (the ordered crypto
    /// pool, `crate::pool`); 0: each packet thread does its own direction's crypto. A pool
    /// switches the device to plexd's own protocol implementation, whose keys can leave the
    /// peer's lock (`crate::machine::Protocol::Plexd`).
    pub crypto_workers: usize,
    /// Set to this runner when it starts, so relay links' readers hand it what they read for
    /// relayed peers (`crate::relay_link`).
    pub links: Option<LinkDoor>,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            uapi_socket: None,
            batch: DEFAULT_BATCH,
            tick: Duration::from_millis(100),
            poll: Duration::from_millis(100),
            side: None,
            raw: None,
            queue: QueueConfig::default(),
            nice: None,
            crypto_workers: 0,
            links: None,
        }
    }
}

/// Why the runner stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(
        "cannot bind the WireGuard UDP port {port} ({source}); free the port or configure another listen_port"
    )]
    Bind { port: u16, source: io::Error },
    #[error("the TUN device failed ({0}); was the interface deleted?")]
    Tun(io::Error),
    #[error("the UDP socket failed ({0})")]
    Udp(io::Error),
    #[error(transparent)]
    Uapi(#[from] crate::uapi_server::UapiServerError),
    #[error("a data-plane thread could not start or panicked ({0})")]
    Thread(String),
}

/// What the threads share.
pub(crate) struct Shared<T, B: UdpBind> {
    pub device: Arc<Device>,
    tun: T,
    binder: B,
    udp: RwLock<Arc<B::Socket>>,
    pool: Option<Arc<CryptoPool>>,
    config: RunConfig,
    shutdown: Shutdown,
}

impl<T: Tun, B: UdpBind> Shared<T, B> {
    fn udp(&self) -> Arc<B::Socket> {
        self.udp
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Runs a packet loop over this runner's devices.
    fn packets(&self, job: LoopFn<T, B::Socket>) -> Result<(), RunError> {
        let udp = || self.udp();
        let l = Loop {
            device: &self.device,
            tun: &self.tun,
            udp: &udp,
            side: self.config.side.as_ref(),
            batch: self.config.batch,
            poll: self.config.poll,
            queue: self.config.queue,
            shutdown: &self.shutdown,
            pool: self.pool.as_ref(),
        };
        job(&l).map_err(|e| match e {
            LoopError::Tun(e) => RunError::Tun(e),
            LoopError::Udp(e) => RunError::Udp(e),
        })
    }

    /// Answers one UAPI request; a listen-port change rebinds before anything is applied.
    pub(crate) fn handle_uapi(&self, request: Request) -> String {
        match request {
            Request::Get => {
                uapi::format_get(&self.device.snapshot(Instant::now(), SystemTime::now()))
            }
            Request::Set(update) => match self.reconfigure(update) {
                Ok(()) => uapi::errno_answer(0),
                Err(errno) => uapi::errno_answer(-errno),
            },
        }
    }

    fn reconfigure(&self, mut update: DeviceUpdate) -> Result<(), i32> {
        if let Some(port) = update.listen_port.take()
            && (port != self.device.listen_port() || port == 0)
        {
            let socket = self.binder.bind(port).map_err(|e| {
                tracing::warn!(port, error = %e, "cannot bind the new listen port; keeping the old one");
                EADDRINUSE
            })?;
            let bound = socket.local_addr().map(|a| a.port()).unwrap_or(port);
            let socket = Arc::new(socket);
            if let Some(raw) = &self.config.raw {
                raw.set(socket.clone());
            }
            *self.udp.write().unwrap_or_else(PoisonError::into_inner) = socket;
            self.device.set_listen_port(bound);
            tracing::info!(port = bound, "listening on UDP port {bound}");
        }
        self.device.apply(update).map_err(|e| {
            tracing::warn!(error = %e, "configuration refused");
            EINVAL
        })
    }
}

impl<T: Tun, B: UdpBind> LinkDeliver for Shared<T, B> {
    fn slot(&self, link: &LinkQueue) -> Option<u16> {
        self.device.relays().link_slot(link)
    }

    fn deliver(&self, inbox: &mut LinkInbox) {
        if self.shutdown.is_triggered() {
            return;
        }
        let LinkInbox {
            datagrams,
            to_network,
            to_tun,
        } = inbox;
        to_network.clear();
        to_tun.clear();
        self.device.handle_udp(
            Instant::now(),
            datagrams.iter().map(|(d, from)| (d, from, None)),
            to_network,
            Crypto::Inline(to_tun),
        );
        // The packet threads notice a failing device and stop the runner; a relay link's
        // reader only drops what it could not hand over.
        if !to_tun.is_empty()
            && let Err(e) = self.tun.send(to_tun)
        {
            tracing::debug!(error = %e, "cannot write relayed packets to the TUN");
        }
        if !to_network.is_empty()
            && let Err(e) = send_framed(self.device.relays(), &*self.udp(), to_network)
        {
            tracing::debug!(error = %e, "cannot send the answers to relayed datagrams");
        }
    }
}

/// Runs the data plane until `shutdown` fires or a device fails; see the module docs.
pub fn run<T, B>(
    device: Arc<Device>,
    tun: T,
    binder: B,
    config: RunConfig,
    shutdown: Shutdown,
) -> Result<(), RunError>
where
    T: Tun + 'static,
    B: UdpBind + 'static,
{
    let port = device.listen_port();
    let socket = binder
        .bind(port)
        .map_err(|source| RunError::Bind { port, source })?;
    if let Ok(addr) = socket.local_addr() {
        device.set_listen_port(addr.port());
        tracing::info!(port = addr.port(), "listening on UDP port {}", addr.port());
    }
    let uapi_listener = match &config.uapi_socket {
        Some(path) => Some(crate::uapi_server::UapiListener::bind(path)?),
        None => None,
    };
    let socket = Arc::new(socket);
    if let Some(raw) = &config.raw {
        raw.set(socket.clone());
    }
    let pool = match config.crypto_workers {
        0 => None,
        n => {
            if device.protocol() != Protocol::Plexd {
                tracing::info!(
                    "the crypto pool needs plexd's own WireGuard protocol implementation; switching to it"
                );
                device.set_protocol(Protocol::Plexd);
            }
            let nice = config.nice;
            let pool = CryptoPool::new(n, move || {
                if let Some(nice) = nice {
                    set_nice(nice);
                }
            })
            .map_err(|e| RunError::Thread(e.to_string()))?;
            tracing::info!(workers = pool.workers(), "ordered crypto pool started");
            Some(Arc::new(pool))
        }
    };
    let shared = Arc::new(Shared {
        device,
        tun,
        binder,
        udp: RwLock::new(socket),
        pool,
        config,
        shutdown: shutdown.clone(),
    });

    if let Some(door) = &shared.config.links {
        let plane: Arc<dyn LinkDeliver> = shared.clone();
        door.set(Arc::downgrade(&plane));
    }

    type Job<T, B> = fn(&Shared<T, B>) -> Result<(), RunError>;
    let jobs: [(&str, Job<T, B>); 3] = [
        ("wg-tun-rx", |s| s.packets(loops::tun_to_network)),
        ("wg-udp-rx", |s| s.packets(loops::network_to_tun)),
        ("wg-timers", timers),
    ];
    let mut handles = Vec::new();
    for (name, job) in jobs {
        let s = shared.clone();
        let h = thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if let Some(nice) = s.config.nice {
                    set_nice(nice);
                }
                let result = job(&s);
                // One direction failing stops them all.
                s.shutdown.trigger();
                result
            })
            .map_err(|e| RunError::Thread(e.to_string()))?;
        handles.push(h);
    }
    let uapi_result = match uapi_listener {
        Some(listener) => {
            let s = shared.clone();
            listener.serve(&shutdown, move |req| s.handle_uapi(req))
        }
        None => {
            while !shutdown.wait_timeout(Duration::from_secs(3600)) {}
            Ok(())
        }
    };
    shutdown.trigger();
    let mut first_error = uapi_result.err().map(RunError::from);
    for h in handles {
        let result = h
            .join()
            .unwrap_or_else(|_| Err(RunError::Thread("a data-plane thread panicked".into())));
        if let Err(e) = result {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(target_os = "linux")]
fn set_nice(nice: i32) {
    if let Err(e) = crate::linux::sched::set_thread_nice(nice) {
        tracing::warn!(nice, error = %e, "cannot set the packet threads' priority (CAP_SYS_NICE?); they run at the process's");
    }
}

#[cfg(not(target_os = "linux"))]
fn set_nice(nice: i32) {
    tracing::warn!(nice, "thread priorities are only set on Linux");
}

fn timers<T: Tun, B: UdpBind>(s: &Shared<T, B>) -> Result<(), RunError> {
    // Timers only send handshake initiations (148 B) and keepalives (32 B): small slots keep
    // a tick that touches 10k peers from touching 10k x 64 KiB.
    let mut out = PacketBatch::new(TIMER_SLOT, s.config.batch);
    while !s.shutdown.wait_timeout(s.config.tick) {
        out.clear();
        s.device.handle_timer(Now::system(), &mut out);
        if !out.is_empty() {
            send_framed(s.device.relays(), &*s.udp(), &mut out).map_err(RunError::Udp)?;
        }
    }
    Ok(())
}
