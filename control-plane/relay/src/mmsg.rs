//! Batched UDP system calls through nix's safe wrappers (no unsafe here): `recvmmsg` into the
//! UDP thread's slots, `sendmmsg` of the forwards of a batch.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd as _;

use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};

/// Magic, type, key: the head of a relay `send` or `recv` datagram.
pub(crate) const HEAD: usize = plexsphere_wire::reach::relay::UDP_DATA_HEAD;

fn to_socket_addr(s: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = s.as_sockaddr_in() {
        return Some(SocketAddr::from(std::net::SocketAddrV4::from(*v4)));
    }
    s.as_sockaddr_in6()
        .map(|v6| SocketAddr::from(std::net::SocketAddrV6::from(*v6)))
}

/// Waits (up to the socket's read timeout) for at least one datagram, then takes what is
/// waiting, up to one per slot; `received[i]` is slot i's length and source.
pub(crate) fn recv(
    socket: &UdpSocket,
    slots: &mut [Vec<u8>],
    received: &mut Vec<(usize, SocketAddr)>,
) -> io::Result<()> {
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(slots.len(), None);
    let mut iovs: Vec<[IoSliceMut<'_>; 1]> = slots
        .iter_mut()
        .map(|s| [IoSliceMut::new(s.as_mut_slice())])
        .collect();
    let results = recvmmsg(
        socket.as_raw_fd(),
        &mut headers,
        iovs.iter_mut(),
        MsgFlags::MSG_WAITFORONE,
        None,
    )
    .map_err(io::Error::from)?;
    for r in results {
        // A source that is not IP (never on an IP socket) keeps the slot order as empty.
        let from = r
            .address
            .as_ref()
            .and_then(to_socket_addr)
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let len = if from.port() == 0 { 0 } else { r.bytes };
        received.push((len, from));
    }
    Ok(())
}

/// What one `sendmmsg` took.
pub(crate) struct Sent {
    pub frames: u64,
    pub payload: u64,
}

/// Sends `forwards` (slot, length, destination) in as few calls as the kernel takes them.
pub(crate) fn send(
    socket: &UdpSocket,
    slots: &[Vec<u8>],
    forwards: &[(usize, usize, SocketAddr)],
) -> Sent {
    let mut sent = Sent {
        frames: 0,
        payload: 0,
    };
    let mut start = 0;
    while start < forwards.len() {
        let rest = &forwards[start..];
        let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(rest.len(), None);
        let iovs: Vec<[IoSlice<'_>; 1]> = rest
            .iter()
            .map(|&(i, len, _)| [IoSlice::new(&slots[i][..len])])
            .collect();
        let addrs: Vec<Option<SockaddrStorage>> = rest
            .iter()
            .map(|&(_, _, to)| Some(SockaddrStorage::from(to)))
            .collect();
        let taken = match sendmmsg(
            socket.as_raw_fd(),
            &mut headers,
            iovs.iter(),
            &addrs,
            [],
            MsgFlags::empty(),
        ) {
            Ok(results) => results.count(),
            Err(e) => {
                // The first datagram was refused (an unreachable address): skip it, go on.
                tracing::debug!(error = %e, to = %rest[0].2, "udp send failed");
                start += 1;
                continue;
            }
        };
        for &(_, len, _) in &rest[..taken.min(rest.len())] {
            sent.frames += 1;
            sent.payload += (len - HEAD) as u64;
        }
        start += taken.max(1);
    }
    sent
}
