//! The two kinds of I/O the data plane does, as small batch-oriented traits.
//!
//! The runner only ever talks to a `Tun` and a `Udp`; Linux devices (`crate::linux`) and the
//! in-memory ones (`crate::memory`) implement them, so the same packet path runs in unit tests,
//! criterion benches and production. Every call moves up to a batch of packets through
//! caller-owned buffers.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::batch::PacketBatch;

/// The device side of a TUN interface: IP packets the host routed to us, and packets we hand
/// back to the host.
pub trait Tun: Send + Sync {
    /// Clears `batch`, then fills up to `batch.max()` packets; waits at most `timeout` for the
    /// first one. Answers how many it read (0 on timeout).
    fn recv(&self, batch: &mut PacketBatch, timeout: Duration) -> io::Result<usize>;

    /// Writes every packet of `batch`. A packet the host refuses is skipped, not an error;
    /// answers how many were written.
    fn send(&self, batch: &PacketBatch) -> io::Result<usize>;
}

/// One UDP socket: WireGuard messages from and to peers' endpoints.
pub trait Udp: Send + Sync {
    /// Clears `batch`, then fills up to `batch.max()` datagrams, each with its source
    /// address; waits at most `timeout` for the first one. Answers how many (0 on timeout).
    fn recv(&self, batch: &mut PacketBatch, timeout: Duration) -> io::Result<usize>;

    /// Sends every datagram of `batch` to its address. A datagram the network refuses (no
    /// route, unreachable) is skipped, not an error; answers how many were sent.
    fn send(&self, batch: &PacketBatch) -> io::Result<usize>;

    fn local_addr(&self) -> io::Result<SocketAddr>;
}

/// Opens the UDP socket for a listen port; the runner calls it again when the port changes.
pub trait UdpBind: Send + Sync {
    type Socket: Udp + 'static;

    /// Binds `port` (0: any free port).
    fn bind(&self, port: u16) -> io::Result<Self::Socket>;
}
