//! Batched UDP system calls through nix's safe wrappers (no unsafe here):
//! - `recvmmsg` straight into the batch's slots, reading UDP GRO's segment size when on;
//! - `sendmmsg` of a range of datagrams;
//! - UDP GSO: a run of equal-size datagrams to one address as one `sendmsg` with
//!   `UDP_SEGMENT`, so the kernel handles up to 64 KiB as one packet until the last moment.

use std::cell::RefCell;
use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::ops::Range;
use std::os::fd::AsRawFd;

use nix::sys::socket::{
    ControlMessage, ControlMessageOwned, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg,
    sendmmsg, sendmsg,
};

use super::pktinfo::{self, SendInfo};
use crate::batch::PacketBatch;
use crate::source::Source;

/// At most this many datagrams in one GSO send (the kernel's UDP_MAX_SEGMENTS is 64 or more).
pub(super) const GSO_MAX_SEGMENTS: usize = 64;
/// At most this many bytes in one GSO send (an IP packet's length field is 16 bits).
const GSO_MAX_BYTES: usize = 65_000;

/// At most about this many bytes in one receive with UDP GRO on (whole slots of 64 KiB).
const GRO_RECV_BYTES: usize = 256 << 10;

fn to_socket_addr(s: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = s.as_sockaddr_in() {
        return Some(SocketAddr::from(std::net::SocketAddrV4::from(*v4)));
    }
    s.as_sockaddr_in6()
        .map(|v6| SocketAddr::from(std::net::SocketAddrV6::from(*v6)))
}

/// Receives what is waiting (without blocking) into the empty `batch`; answers how many
/// slots it filled. With `gro`, a slot may hold several datagrams (see `commit_segmented`);
/// with `pktinfo`, each slot gets the local address it arrived at (`PacketBatch::src`).
pub(super) fn recv(
    socket: &UdpSocket,
    batch: &mut PacketBatch,
    (gro, pktinfo): (bool, bool),
    canonical: fn(SocketAddr) -> SocketAddr,
) -> io::Result<usize> {
    // With GRO each slot may hold up to 64 KiB: bound the bytes one call moves, not only the
    // slots, so one receive is never megabytes of work in front of a small datagram.
    let n = if gro {
        batch
            .max()
            .min((GRO_RECV_BYTES / batch.slot_size().max(1)).max(1))
    } else {
        batch.max()
    };
    let cmsg = (gro || pktinfo).then(pktinfo::recv_space);
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(n, cmsg);
    let mut filled: Vec<(usize, Option<SocketAddr>, usize, Option<Source>)> = Vec::with_capacity(n);
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
            let (mut segment, mut local) = (0, None);
            if let Ok(cmsgs) = r.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::UdpGroSegments(size) = c {
                        segment = usize::try_from(size).unwrap_or(0);
                    } else if let Some(src) = pktinfo::source(&c) {
                        local = Some(src);
                    }
                }
            }
            filled.push((
                r.bytes,
                r.address.as_ref().and_then(to_socket_addr),
                segment,
                local,
            ));
        }
    }
    for (len, from, segment, local) in filled {
        match from {
            Some(addr) => {
                batch.commit_segmented(len, canonical(addr), segment);
                batch.set_src(local);
            }
            // Not an IP source: keep the slot order, with an empty datagram the core skips.
            None => batch.commit(0, crate::batch::NO_ADDR),
        }
    }
    Ok(batch.len())
}

/// Sends `batch[range]` in one call, every datagram from `src` (none: the kernel chooses);
/// answers how many the kernel took.
pub(super) fn send(
    socket: &UdpSocket,
    batch: &PacketBatch,
    range: Range<usize>,
    src: Option<Source>,
    outgoing: impl Fn(SocketAddr) -> SocketAddr,
) -> io::Result<usize> {
    if range.is_empty() {
        return Ok(0);
    }
    let info = src.map(SendInfo::new);
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(
        range.len(),
        info.as_ref().map(SendInfo::space),
    );
    let cmsgs: Vec<ControlMessage<'_>> = info.iter().map(SendInfo::cmsg).collect();
    let iovs: Vec<[IoSlice<'_>; 1]> = range
        .clone()
        .map(|i| [IoSlice::new(batch.get(i))])
        .collect();
    let addrs: Vec<Option<SockaddrStorage>> = range
        .map(|i| Some(SockaddrStorage::from(outgoing(batch.addr(i)))))
        .collect();
    let results = sendmmsg(
        socket.as_raw_fd(),
        &mut headers,
        iovs.iter(),
        &addrs,
        &cmsgs,
        MsgFlags::MSG_DONTWAIT,
    )
    .map_err(io::Error::from)?;
    Ok(results.count())
}

/// How many datagrams from `start` one GSO send can carry: same address and source, same
/// size (the last may be shorter), within the kernel's limits.
pub(super) fn gso_run(batch: &PacketBatch, start: usize) -> usize {
    let (addr, src) = (batch.addr(start), batch.src(start));
    let size = batch.get(start).len();
    let mut n = 1;
    let mut bytes = size;
    while start + n < batch.len() && n < GSO_MAX_SEGMENTS {
        let len = batch.get(start + n).len();
        if batch.addr(start + n) != addr
            || batch.src(start + n) != src
            || len > size
            || len == 0
            || bytes + len > GSO_MAX_BYTES
        {
            break;
        }
        n += 1;
        bytes += len;
        if len < size {
            break;
        }
    }
    n
}

thread_local! {
    /// The contiguous buffer a GSO send needs; one per sending thread.
    static GSO_BUF: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(GSO_MAX_BYTES));
}

/// Sends `batch[range]` (a `gso_run`) as one UDP GSO message from `src`.
pub(super) fn send_gso(
    socket: &UdpSocket,
    batch: &PacketBatch,
    range: Range<usize>,
    (to, src): (SocketAddr, Option<Source>),
) -> io::Result<()> {
    let segment = u16::try_from(batch.get(range.start).len())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    GSO_BUF.with_borrow_mut(|buf| {
        buf.clear();
        for i in range {
            buf.extend_from_slice(batch.get(i));
        }
        let addr = SockaddrStorage::from(to);
        let info = src.map(SendInfo::new);
        let (plain, sourced);
        let cmsgs: &[ControlMessage<'_>] = match &info {
            Some(info) => {
                sourced = [ControlMessage::UdpGsoSegments(&segment), info.cmsg()];
                &sourced
            }
            None => {
                plain = [ControlMessage::UdpGsoSegments(&segment)];
                &plain
            }
        };
        sendmsg(
            socket.as_raw_fd(),
            &[IoSlice::new(buf)],
            cmsgs,
            MsgFlags::MSG_DONTWAIT,
            Some(&addr),
        )
        .map(|_| ())
        .map_err(io::Error::from)
    })
}
