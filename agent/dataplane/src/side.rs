//! The WireGuard socket's side channel: what else shares the UDP socket (STUN, disco, relay
//! frames) goes to plexd's reach runtime, and the runtime sends its own datagrams from the same
//! socket, so the reflexive address STUN learns is the WireGuard socket's.
//!
//! - Inbound: the receive thread classifies every datagram once ([`is_wireguard`]); anything
//!   else goes to the [`SideSink`] given in `RunConfig::side`. The sink must not block: it
//!   answers `false` when its queue is full, and the datagram is dropped and counted
//!   (`Counters::side_dropped`). Without a sink such datagrams are counted as malformed, as
//!   before.
//! - Outbound: a [`RawSender`] given in `RunConfig::raw` holds the runner's current socket
//!   (the runner puts it there on bind and on every listen-port rebind) and sends one datagram
//!   from it.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};

use crate::batch::PacketBatch;
use crate::io::Udp;

/// Where non-WireGuard datagrams go: a function that answers `false` when it dropped the
/// datagram (its queue is full). It runs on the receive thread: it must never block.
#[derive(Clone)]
pub struct SideSink(Arc<SinkFn>);

type SinkFn = dyn Fn(&[u8], SocketAddr) -> bool + Send + Sync;

impl SideSink {
    pub fn new(f: impl Fn(&[u8], SocketAddr) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Hands one datagram over; `false` when the sink dropped it.
    pub fn offer(&self, datagram: &[u8], from: SocketAddr) -> bool {
        (self.0)(datagram, from)
    }
}

impl fmt::Debug for SideSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SideSink")
    }
}

/// Whether a datagram is a WireGuard message: type 1..=4, then three zero bytes (the same rule
/// as `plexsphere_wire::reach::classify`; kept here so the data plane needs no wire types).
#[inline]
pub(crate) fn is_wireguard(datagram: &[u8]) -> bool {
    datagram.len() >= 4 && (1..=4).contains(&datagram[0]) && datagram[1..4] == [0, 0, 0]
}

/// Sends raw datagrams from the data plane's current UDP socket; see the module docs.
#[derive(Clone, Default)]
pub struct RawSender {
    socket: Arc<RwLock<Option<Arc<dyn Udp>>>>,
}

impl fmt::Debug for RawSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bound = self
            .socket
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(|s| s.local_addr().ok());
        write!(f, "RawSender({bound:?})")
    }
}

impl RawSender {
    pub fn new() -> Self {
        Self::default()
    }

    /// The runner's socket from now on.
    pub(crate) fn set(&self, socket: Arc<dyn Udp>) {
        *self.socket.write().unwrap_or_else(PoisonError::into_inner) = Some(socket);
    }

    /// The socket's local address, once the runner bound it.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.current().and_then(|s| s.local_addr().ok())
    }

    fn current(&self) -> Option<Arc<dyn Udp>> {
        self.socket
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sends a batch from the WireGuard socket as the packet threads do (runs of equal
    /// datagrams to one address go as one GSO send when the socket has it on); answers how
    /// many datagrams the network took.
    pub(crate) fn send_batch(&self, batch: &PacketBatch) -> io::Result<usize> {
        let Some(socket) = self.current() else {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the data plane has not bound its UDP socket yet",
            ));
        };
        socket.send(batch)
    }

    /// Sends one datagram from the WireGuard socket. Fails when the runner has not bound a
    /// socket yet, or the network refused the datagram.
    pub fn send(&self, datagram: &[u8], to: SocketAddr) -> io::Result<()> {
        let Some(socket) = self.current() else {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the data plane has not bound its UDP socket yet",
            ));
        };
        let mut batch = PacketBatch::new(datagram.len().max(1), 1);
        batch.push(datagram, to);
        match socket.send(&batch)? {
            1 => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::HostUnreachable,
                format!("the network refused the datagram to {to}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_wireguard_message_types_count_as_wireguard() {
        assert!(is_wireguard(&[1, 0, 0, 0, 9]));
        assert!(is_wireguard(&[4, 0, 0, 0]));
        assert!(!is_wireguard(&[0, 0, 0, 0]));
        assert!(!is_wireguard(&[5, 0, 0, 0]));
        assert!(!is_wireguard(&[1, 0, 0]));
        assert!(!is_wireguard(b"pxd\x01rest"));
        // A STUN binding request starts 0x00 0x01.
        assert!(!is_wireguard(&[0, 1, 0, 0, 0x21, 0x12, 0xA4, 0x42]));
    }

    #[test]
    fn an_unbound_sender_says_so() {
        let s = RawSender::new();
        let e = s.send(b"x", "127.0.0.1:9".parse().unwrap()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotConnected);
        assert!(s.local_addr().is_none());
    }
}
