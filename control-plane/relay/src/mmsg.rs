//! Batched UDP system calls through nix's safe wrappers (no unsafe here): `recvmmsg` into the
//! UDP thread's slots, and the forwards of a batch out with as few calls as the kernel takes:
//! runs of consecutive datagrams to one destination with one length as one UDP GSO send
//! (`UDP_SEGMENT`, so the receiver's GRO sees them as a batch), the rest with `sendmmsg`.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd as _;

use nix::errno::Errno;
use nix::sys::socket::{
    ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg, sendmsg,
};

/// Magic, type, key: the head of a relay `send` or `recv` datagram.
pub(crate) const HEAD: usize = plexsphere_wire::reach::relay::UDP_DATA_HEAD;

/// Datagrams in one GSO send at most (the kernel's `UDP_MAX_SEGMENTS` is 64 or more).
const GSO_MAX_SEGMENTS: usize = 64;
/// Bytes in one GSO send at most: under the 65,507 a UDP datagram carries over IPv4.
const GSO_MAX_BYTES: usize = 65_000;

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

/// What the sends of one batch took.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Sent {
    pub frames: u64,
    pub payload: u64,
    /// GSO sends among them (each carried two datagrams or more).
    pub gso_sends: u64,
}

impl Sent {
    fn count(&mut self, forwards: &[(usize, usize, SocketAddr)]) {
        for &(_, len, _) in forwards {
            self.frames += 1;
            self.payload += len.saturating_sub(HEAD) as u64;
        }
    }
}

/// One UDP thread's sending side: whether UDP GSO is in use, and the contiguous buffer a GSO
/// send needs.
pub(crate) struct Sender {
    /// On until the kernel refuses a GSO send with `EIO` or `EINVAL` (no `UDP_SEGMENT` on this
    /// kernel or route); then off for good on this thread, and everything goes by `sendmmsg`.
    gso: bool,
    buf: Vec<u8>,
}

impl Sender {
    pub(crate) fn new() -> Self {
        Self::with_gso(true)
    }

    pub(crate) fn with_gso(gso: bool) -> Self {
        Self {
            gso,
            buf: Vec::with_capacity(if gso { GSO_MAX_BYTES } else { 0 }),
        }
    }

    /// Whether the next run of equal datagrams goes out as one GSO send.
    #[cfg(test)]
    pub(crate) fn gso(&self) -> bool {
        self.gso
    }

    /// Sends `forwards` (slot, length, destination) in order: each run of two or more to one
    /// destination with one length as one GSO send, what lies between with `sendmmsg`.
    pub(crate) fn send(
        &mut self,
        socket: &UdpSocket,
        slots: &[Vec<u8>],
        forwards: &[(usize, usize, SocketAddr)],
    ) -> Sent {
        let mut sent = Sent::default();
        let mut singles = 0;
        let mut i = 0;
        while i < forwards.len() {
            let run = if self.gso { gso_run(&forwards[i..]) } else { 1 };
            if run < 2 {
                i += 1;
                continue;
            }
            send_mmsg(socket, slots, &forwards[singles..i], &mut sent);
            let group = &forwards[i..i + run];
            if !self.send_gso(socket, slots, group, &mut sent) {
                send_mmsg(socket, slots, group, &mut sent);
            }
            i += run;
            singles = i;
        }
        send_mmsg(socket, slots, &forwards[singles..], &mut sent);
        sent
    }

    /// One GSO send of `run` (one destination, one length); false when the kernel refused it
    /// and the caller should send it another way.
    fn send_gso(
        &mut self,
        socket: &UdpSocket,
        slots: &[Vec<u8>],
        run: &[(usize, usize, SocketAddr)],
        sent: &mut Sent,
    ) -> bool {
        let Some(&(_, len, to)) = run.first() else {
            return true;
        };
        let Ok(segment) = u16::try_from(len) else {
            return false;
        };
        self.buf.clear();
        for &(slot, len, _) in run {
            self.buf.extend_from_slice(&slots[slot][..len]);
        }
        match sendmsg(
            socket.as_raw_fd(),
            &[IoSlice::new(&self.buf)],
            &[ControlMessage::UdpGsoSegments(&segment)],
            MsgFlags::empty(),
            Some(&SockaddrStorage::from(to)),
        ) {
            Ok(_) => {
                sent.count(run);
                sent.gso_sends += 1;
                true
            }
            Err(e @ (Errno::EIO | Errno::EINVAL)) => {
                tracing::info!(error = %e, "the kernel refuses UDP GSO here; the relay sends with sendmmsg from now on");
                self.gso = false;
                false
            }
            Err(e) => {
                tracing::debug!(error = %e, %to, "udp GSO send failed; sending one by one");
                false
            }
        }
    }
}

/// How many datagrams from the start of `forwards` go to its first destination with its first
/// length, within one GSO send's limits.
fn gso_run(forwards: &[(usize, usize, SocketAddr)]) -> usize {
    let Some(&(_, len, to)) = forwards.first() else {
        return 0;
    };
    let most = GSO_MAX_SEGMENTS.min(GSO_MAX_BYTES / len.max(1));
    forwards
        .iter()
        .take(most)
        .take_while(|&&(_, l, t)| l == len && t == to)
        .count()
}

/// Sends `forwards` (slot, length, destination) with `sendmmsg`, in as few calls as the kernel
/// takes them; a datagram the kernel refuses (an unreachable address) is skipped.
fn send_mmsg(
    socket: &UdpSocket,
    slots: &[Vec<u8>],
    forwards: &[(usize, usize, SocketAddr)],
    sent: &mut Sent,
) {
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
        sent.count(&rest[..taken.min(rest.len())]);
        start += taken.max(1);
    }
}

#[cfg(test)]
#[path = "mmsg_tests.rs"]
mod tests;
