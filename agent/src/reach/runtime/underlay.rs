//! The kernel backend's underlay socket: plexd's own UDP socket on the WireGuard port's
//! side, read on its own thread. WireGuard from a peer with a direct path goes to that peer's
//! forwarder (by its source address); everything else is offered to the loop's queue like
//! the data plane's side channel.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use plexsphere_wire::reach::{Kind, MAX_DATAGRAM, classify};

use super::shared::{Shared, offer};

/// The kernel backend's underlay socket: see `Runtime::serve_underlay`.
pub(crate) fn serve_underlay(shared: &Shared, socket: &UdpSocket) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    while !shared.stop.load(Ordering::Relaxed) {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) => {
                tracing::debug!("underlay read failed: {e}");
                continue;
            }
        };
        let d = &buf[..n];
        let from = unmap(from);
        if classify(d) == Kind::WireGuard {
            let f = shared
                .by_direct
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&from)
                .cloned();
            match f {
                Some(f) => {
                    let _ = f.deliver(d);
                }
                None => {
                    shared.unknown_src.fetch_add(1, Ordering::Relaxed);
                }
            }
        } else {
            offer(shared, d, from);
        }
    }
}

/// ::ffff:a.b.c.d as a.b.c.d, the way peers' endpoints are written.
fn unmap(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        a => a,
    }
}
