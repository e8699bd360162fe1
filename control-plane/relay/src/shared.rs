//! What the UDP threads and the TCP tasks share: the core behind its lock, the counters, a
//! UDP socket, and how an answer of the core is delivered on either transport. Whoever hands
//! the core an input takes its outputs ([`Core::poll_transmit`](crate::core::Core::poll_transmit))
//! before letting go of the lock.

use std::net::UdpSocket;
use std::sync::{Arc, Mutex, MutexGuard};

use plexsphere_wire::reach::RELAY_MAGIC;
use plexsphere_wire::reach::relay::Frame;

use crate::core::{Core, Out, To, Transmit};
use crate::limits::MAX_STREAM_FRAME;
use crate::stats::Counters;

/// What the UDP threads and the TCP tasks share.
pub(crate) struct Shared {
    pub(crate) core: Mutex<Core>,
    pub(crate) counters: Arc<Counters>,
    /// The first UDP thread's socket (they share one address): what TCP-side answers to UDP
    /// nodes leave from.
    pub(crate) udp: Option<Arc<UdpSocket>>,
}

impl Shared {
    pub(crate) fn core(&self) -> MutexGuard<'_, Core> {
        // A panic while holding the lock leaves plain maps behind; carry on with them.
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Puts a stream frame (length prefix included) on a TCP connection's queue, or counts why not.
pub(crate) fn push_tcp(
    shared: &Shared,
    tx: &tokio::sync::mpsc::Sender<Vec<u8>>,
    frame: Vec<u8>,
    payload: usize,
) {
    if frame.len() - 2 > MAX_STREAM_FRAME {
        shared.counters.dropped_too_long.inc();
        return;
    }
    match tx.try_send(frame) {
        Ok(()) => {
            shared.counters.forwarded_frames.inc();
            shared.counters.forwarded_bytes.add(payload as u64);
        }
        Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {
            shared.counters.dropped_queue_full.inc()
        }
        Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => {}
    }
}

/// Sends an output of [`Core::handle_frame`](crate::core::Core::handle_frame) or
/// [`Core::handle_timeout`](crate::core::Core::handle_timeout). Those make a decoded `send`'s
/// `recv` themselves, so they queue no [`Transmit::Forward`]: only the caller of
/// [`Core::handle_send`](crate::core::Core::handle_send) holds a forward's bytes, and takes it.
pub(crate) fn transmit(shared: &Shared, t: Transmit) {
    match t {
        Transmit::Frame(out) => deliver(shared, out),
        Transmit::Forward { .. } => {}
    }
}

/// Sends one frame the core answered, over UDP or onto a TCP queue.
pub(crate) fn deliver(shared: &Shared, out: Out) {
    let payload = match &out.frame {
        Frame::Recv { payload, .. } => payload.len(),
        _ => 0,
    };
    match out.to {
        To::Udp(addr) => {
            let Some(socket) = &shared.udp else { return };
            let mut bytes = Vec::with_capacity(64 + payload);
            bytes.extend_from_slice(&RELAY_MAGIC);
            out.frame.encode_into(&mut bytes);
            if socket.send_to(&bytes, addr).is_ok() && payload > 0 {
                shared.counters.forwarded_frames.inc();
                shared.counters.forwarded_bytes.add(payload as u64);
            }
        }
        To::Tcp(tx) => {
            let bytes = out.frame.to_stream();
            if payload > 0 {
                push_tcp(shared, &tx, bytes, payload);
            } else if tx.try_send(bytes).is_err() {
                shared.counters.dropped_queue_full.inc();
            }
        }
    }
}
