//! The UDP side: one blocking thread a core, each with its own socket on the relay's one UDP
//! address ([`bind`]: `SO_REUSEPORT`; the kernel hashes each node's address and port to one of
//! them, so one node's datagrams stay in order on one thread, and replies leave from the
//! address the node sent to). Each thread owns its receive loop (no per-datagram task
//! wake-up), and answers STUN, registers and forwards. It takes up to [`BATCH`] datagrams per
//! `recvmmsg`, handles the whole batch under one lock of the core (taking the core's outputs
//! after each datagram, [`Core::poll_transmit`]), and sends the forwards of a
//! batch together: runs to one node with one length as one UDP GSO send (the node's GRO, where
//! it has it on, takes them as one), the rest with one `sendmmsg` (mmsg.rs). A `send` to a UDP node is rewritten in place into the `recv`
//! (same length: the type byte and the key change), so forwarding copies nothing.

use std::io::{self, ErrorKind};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use plexsphere_wire::reach::relay::{Frame, MAX_PAYLOAD};
use plexsphere_wire::reach::{Kind, MAX_DATAGRAM, classify};

use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrStorage, setsockopt, sockopt};

use crate::core::{Core, Now, Peer, To, Transmit};
use crate::limits::MAX_UDP_THREADS;
use crate::shared::{Shared, deliver, push_tcp, transmit};

/// How often an idle loop looks at the stop flag (and thread 0 at the core's sweep deadline,
/// [`Core::poll_timeout`]): the receive timeout.
const POLL: Duration = Duration::from_millis(200);
/// Type byte of `send` and `recv` (wire/src/reach/relay.rs).
const SEND: u8 = 5;
const RECV: u8 = 6;
pub(crate) use crate::mmsg::HEAD;
/// Datagrams per `recvmmsg` / `sendmmsg`.
pub(crate) const BATCH: usize = 32;

/// UDP threads (and sockets) to run: `wanted`, or with 0 one a core; at most
/// [`MAX_UDP_THREADS`].
pub(crate) fn threads(wanted: usize) -> usize {
    let n = match wanted {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    n.clamp(1, MAX_UDP_THREADS)
}

/// `n` UDP sockets on `addr` (port 0: one free port for all), each with `SO_REUSEPORT`.
///
/// The address is first bound once without `SO_REUSEPORT` and let go: a port that anything
/// holds already, `SO_REUSEPORT` or not, is refused here (`EADDRINUSE`), rather than shared with
/// another relay of the same user.
pub(crate) fn bind(addr: SocketAddr, n: usize) -> io::Result<Vec<Arc<UdpSocket>>> {
    let addr = UdpSocket::bind(addr)?.local_addr()?;
    (0..n.max(1))
        .map(|_| reuse_port(addr).map(Arc::new))
        .collect()
}

fn reuse_port(addr: SocketAddr) -> io::Result<UdpSocket> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = nix::sys::socket::socket(family, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&fd, sockopt::ReusePort, &true)?;
    nix::sys::socket::bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    Ok(UdpSocket::from(fd))
}

/// Starts UDP thread `index` (`relay-udp-<index>`) on `socket`; thread 0 also sweeps ended
/// leases when the core's [`Core::poll_timeout`] is due (at most [`POLL`] late).
pub(crate) fn spawn(
    index: usize,
    socket: Arc<UdpSocket>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
) -> io::Result<std::thread::JoinHandle<()>> {
    socket.set_read_timeout(Some(POLL))?;
    std::thread::Builder::new()
        .name(format!("relay-udp-{index}"))
        .spawn(move || run(index == 0, &socket, &shared, &stop))
}

fn run(sweeps: bool, socket: &UdpSocket, shared: &Shared, stop: &AtomicBool) {
    let mut slots = vec![vec![0u8; MAX_DATAGRAM]; BATCH];
    let mut received: Vec<(usize, SocketAddr)> = Vec::with_capacity(BATCH);
    let mut forwards: Vec<(usize, usize, SocketAddr)> = Vec::with_capacity(BATCH);
    let mut sender = crate::mmsg::Sender::new();
    let mut sweep_at = shared.core().poll_timeout();
    while !stop.load(Ordering::Relaxed) {
        received.clear();
        forwards.clear();
        match crate::mmsg::recv(socket, &mut slots, &mut received) {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => {
                tracing::debug!(error = %e, "udp receive failed");
            }
        }
        if !received.is_empty() {
            // One lock and one reading of the clocks for the whole batch.
            let now = Now::system();
            let mut core = shared.core();
            for (i, &(len, from)) in received.iter().enumerate() {
                let buf = &mut slots[i][..len];
                if let Some(to) = datagram(&mut core, socket, shared, buf, from, now) {
                    forwards.push((i, len, to));
                }
            }
        }
        if !forwards.is_empty() {
            let sent = sender.send(socket, &slots, &forwards);
            shared.counters.forwarded_frames.add(sent.frames);
            shared.counters.forwarded_bytes.add(sent.payload);
        }
        if sweeps && sweep_at.is_some_and(|at| Instant::now() >= at) {
            let mut core = shared.core();
            core.handle_timeout(Instant::now());
            // A sweep answers nothing today; whatever it would, is taken here.
            while let Some(out) = core.poll_transmit() {
                transmit(shared, out);
            }
            sweep_at = core.poll_timeout();
        }
    }
}

/// Handles one datagram; answers where to send it on when it became a `recv` in place.
fn datagram(
    core: &mut Core,
    socket: &UdpSocket,
    shared: &Shared,
    buf: &mut [u8],
    from: SocketAddr,
    now: Now,
) -> Option<SocketAddr> {
    match classify(buf) {
        Kind::Stun => match crate::stun::answer(buf, from) {
            // Charged to the sender's /24 or /48 unless it is a registered node.
            Some(answer) => {
                if core.may_answer(Peer::Udp(from), now.at) {
                    shared.counters.stun_answered.inc();
                    let _ = socket.send_to(&answer, from);
                }
            }
            None => shared.counters.dropped_unknown.inc(),
        },
        Kind::Relay if buf.len() >= HEAD && buf[4] == SEND => {
            return send(core, shared, buf, from, now);
        }
        Kind::Relay => match Frame::from_datagram(buf) {
            Ok(frame) => {
                core.handle_frame(frame, Peer::Udp(from), now);
                while let Some(out) = core.poll_transmit() {
                    transmit(shared, out);
                }
            }
            Err(_) => shared.counters.dropped_unknown.inc(),
        },
        Kind::WireGuard | Kind::Disco | Kind::Unknown => shared.counters.dropped_unknown.inc(),
    }
    None
}

/// The fast path: `send{dst, payload}` becomes `recv{src, payload}` without decoding; answers
/// the UDP address to send the rewritten datagram to.
fn send(
    core: &mut Core,
    shared: &Shared,
    buf: &mut [u8],
    from: SocketAddr,
    now: Now,
) -> Option<SocketAddr> {
    let len = buf.len() - HEAD;
    if len > MAX_PAYLOAD {
        shared.counters.dropped_unknown.inc();
        return None;
    }
    let mut dst = [0u8; 8];
    dst.copy_from_slice(&buf[5..HEAD]);
    core.handle_send(&dst, len, Peer::Udp(from), now);
    // One output at most: where the datagram goes on, or the answer to its sender.
    let mut on_to = None;
    while let Some(out) = core.poll_transmit() {
        match out {
            Transmit::Forward { to, src } => {
                buf[4] = RECV;
                buf[5..HEAD].copy_from_slice(&plexsphere_wire::reach::relay::prefix(&src));
                match to {
                    To::Udp(addr) => on_to = Some(addr),
                    To::Tcp(tx) => {
                        // The stream frame has no magic and a length in front.
                        let frame = &buf[4..];
                        let mut out = Vec::with_capacity(2 + frame.len());
                        out.extend_from_slice(&(frame.len() as u16).to_be_bytes());
                        out.extend_from_slice(frame);
                        push_tcp(shared, &tx, out, len);
                    }
                }
            }
            Transmit::Frame(out) => deliver(shared, out),
        }
    }
    on_to
}
