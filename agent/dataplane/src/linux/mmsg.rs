//! `recvmmsg`/`sendmmsg`: a whole batch of datagrams per system call, straight between the
//! socket and the batch's slots (nix's safe wrappers; no copies, no unsafe here).

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};

use crate::batch::PacketBatch;

fn to_socket_addr(s: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = s.as_sockaddr_in() {
        return Some(SocketAddr::from(std::net::SocketAddrV4::from(*v4)));
    }
    s.as_sockaddr_in6()
        .map(|v6| SocketAddr::from(std::net::SocketAddrV6::from(*v6)))
}

/// Receives what is waiting (without blocking) into the empty `batch`; answers how many.
pub(super) fn recv(
    socket: &UdpSocket,
    batch: &mut PacketBatch,
    canonical: fn(SocketAddr) -> SocketAddr,
) -> io::Result<usize> {
    let n = batch.max();
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(n, None);
    let mut filled: Vec<(usize, Option<SocketAddr>)> = Vec::with_capacity(n);
    {
        let mut iovs: Vec<[IoSliceMut<'_>; 1]> =
            batch.free_slots(n).map(|s| [IoSliceMut::new(s)]).collect();
        let results = recvmmsg(
            socket.as_raw_fd(),
            &mut headers,
            iovs.iter_mut(),
            MsgFlags::MSG_DONTWAIT,
            None,
        )
        .map_err(io::Error::from)?;
        for r in results {
            filled.push((r.bytes, r.address.as_ref().and_then(to_socket_addr)));
        }
    }
    for (len, from) in filled {
        match from {
            Some(addr) => batch.commit(len, canonical(addr)),
            // Not an IP source: keep the slot order, with an empty datagram the core drops.
            None => batch.commit(0, crate::batch::NO_ADDR),
        }
    }
    Ok(batch.len())
}

/// Sends `batch[start..]` in one call; answers how many the kernel took (at least one unless
/// it failed).
pub(super) fn send(
    socket: &UdpSocket,
    batch: &PacketBatch,
    start: usize,
    outgoing: impl Fn(SocketAddr) -> SocketAddr,
) -> io::Result<usize> {
    let count = batch.len().saturating_sub(start);
    if count == 0 {
        return Ok(0);
    }
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(count, None);
    let iovs: Vec<[IoSlice<'_>; 1]> = (start..batch.len())
        .map(|i| [IoSlice::new(batch.get(i))])
        .collect();
    let addrs: Vec<Option<SockaddrStorage>> = (start..batch.len())
        .map(|i| Some(SockaddrStorage::from(outgoing(batch.addr(i)))))
        .collect();
    let results = sendmmsg(
        socket.as_raw_fd(),
        &mut headers,
        iovs.iter(),
        &addrs,
        [],
        MsgFlags::MSG_DONTWAIT,
    )
    .map_err(io::Error::from)?;
    Ok(results.count())
}
