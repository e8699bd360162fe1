//! The UDP side: one blocking thread owns the receive loop (no per-datagram task wake-up), and
//! answers STUN, registers and forwards. It takes up to [`BATCH`] datagrams per `recvmmsg`, and
//! sends the forwards of a batch with one `sendmmsg`. A `send` to a UDP node is rewritten in
//! place into the `recv` (same length: the type byte and the key change), so forwarding copies
//! nothing.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use plexsphere_wire::reach::relay::{Frame, MAX_PAYLOAD};
use plexsphere_wire::reach::{Kind, MAX_DATAGRAM, classify};

use crate::core::{Forward, Now, Peer, To};
use crate::shared::{Shared, deliver, push_tcp};

/// How often the loop looks at the stop flag and sweeps ended leases when idle.
const POLL: Duration = Duration::from_millis(200);
/// Type byte of `send` and `recv` (wire/src/reach/relay.rs).
const SEND: u8 = 5;
const RECV: u8 = 6;
pub(crate) use crate::mmsg::HEAD;
/// Datagrams per `recvmmsg` / `sendmmsg`.
pub(crate) const BATCH: usize = 32;

pub(crate) fn spawn(
    socket: Arc<UdpSocket>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    socket.set_read_timeout(Some(POLL))?;
    std::thread::Builder::new()
        .name("relay-udp".into())
        .spawn(move || run(&socket, &shared, &stop))
}

fn run(socket: &UdpSocket, shared: &Shared, stop: &AtomicBool) {
    let mut slots = vec![vec![0u8; MAX_DATAGRAM]; BATCH];
    let mut received: Vec<(usize, SocketAddr)> = Vec::with_capacity(BATCH);
    let mut forwards: Vec<(usize, usize, SocketAddr)> = Vec::with_capacity(BATCH);
    let mut last_sweep = Instant::now();
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
        for (i, &(len, from)) in received.iter().enumerate() {
            if let Some(to) = datagram(socket, shared, &mut slots[i][..len], from) {
                forwards.push((i, len, to));
            }
        }
        if !forwards.is_empty() {
            let sent = crate::mmsg::send(socket, &slots, &forwards);
            shared.counters.forwarded_frames.add(sent.frames);
            shared.counters.forwarded_bytes.add(sent.payload);
        }
        if last_sweep.elapsed() >= POLL {
            last_sweep = Instant::now();
            shared.core().handle_timeout(last_sweep);
        }
    }
}

/// Handles one datagram; answers where to send it on when it became a `recv` in place.
fn datagram(
    socket: &UdpSocket,
    shared: &Shared,
    buf: &mut [u8],
    from: SocketAddr,
) -> Option<SocketAddr> {
    match classify(buf) {
        Kind::Stun => match crate::stun::answer(buf, from) {
            // Charged to the sender's /24 or /48 unless it is a registered node.
            Some(answer) => {
                if shared.core().may_answer(Peer::Udp(from), Instant::now()) {
                    shared.counters.stun_answered.inc();
                    let _ = socket.send_to(&answer, from);
                }
            }
            None => shared.counters.dropped_unknown.inc(),
        },
        Kind::Relay if buf.len() >= HEAD && buf[4] == SEND => return send(shared, buf, from),
        Kind::Relay => match Frame::from_datagram(buf) {
            Ok(frame) => {
                let out = shared
                    .core()
                    .handle_frame(frame, Peer::Udp(from), Now::system());
                if let Some(out) = out {
                    deliver(shared, out);
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
fn send(shared: &Shared, buf: &mut [u8], from: SocketAddr) -> Option<SocketAddr> {
    let len = buf.len() - HEAD;
    if len > MAX_PAYLOAD {
        shared.counters.dropped_unknown.inc();
        return None;
    }
    let mut dst = [0u8; 8];
    dst.copy_from_slice(&buf[5..HEAD]);
    let verdict = shared
        .core()
        .handle_send(&dst, len, Peer::Udp(from), Now::system());
    match verdict {
        Forward::Deliver { to, src } => {
            buf[4] = RECV;
            buf[5..HEAD].copy_from_slice(&plexsphere_wire::reach::relay::prefix(&src));
            match to {
                To::Udp(addr) => return Some(addr),
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
        Forward::Answer(out) => deliver(shared, out),
        Forward::Drop => {}
    }
    None
}
