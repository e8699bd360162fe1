//! The WireGuard UDP socket on Linux: one dual-stack socket (`[::]:port`, IPv4 as mapped
//! addresses), or an IPv4 one where the host has no IPv6. Non-blocking, with `poll` for waits
//! and large kernel buffers so bursts are not dropped.
//!
//! Sticky source: every received datagram carries the local address it arrived at
//! (`IPV6_RECVPKTINFO`, which covers IPv4 on the dual-stack socket, or `IP_PKTINFO`), and
//! every datagram with a source is sent from it (`IPV6_PKTINFO` / `IP_PKTINFO` on sendmmsg,
//! sendmsg and GSO sends), so a reply leaves from the address the peer sent to. When a source
//! is refused (the address was removed: ENETUNREACH over IPv4, EINVAL over IPv6; see
//! `pktinfo::source_refused`) the datagram goes again without it, as the kernel's WireGuard
//! does, and the address is left out of later sends until a datagram arrives at it again.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::ops::Range;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::libc;
use nix::poll::PollFlags;
use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, SockaddrIn, SockaddrIn6,
    SockaddrStorage, bind, getsockopt, recvmsg, sendmsg, setsockopt, socket, sockopt,
};

use super::pktinfo::{self, SendInfo};
use crate::batch::PacketBatch;
use crate::io::{Udp, UdpBind};
use crate::source::Source;

/// The socket buffer size asked for (wireguard-go asks for the same 7 MiB).
pub(super) const SOCKET_BUFFER: usize = 7 << 20;

/// At most this many refused source addresses are remembered (the oldest is forgotten
/// first; a forgotten one costs one failed send before it is refused again).
pub(super) const MAX_REFUSED_SOURCES: usize = 16;

/// A bound WireGuard UDP socket.
pub struct LinuxUdp {
    socket: UdpSocket,
    dual_stack: bool,
    /// The kernel reports each datagram's local address (sticky source).
    pktinfo: bool,
    /// Source addresses the kernel refused; see the module docs.
    refused: Refused,
    /// A batch per system call (recvmmsg/sendmmsg) instead of one datagram per call.
    mmsg: bool,
    /// UDP GSO on send; turned off for good if the kernel refuses it (EIO).
    gso: AtomicBool,
    /// UDP GRO on receive (the socket option took).
    gro: bool,
}

/// Binds `LinuxUdp` sockets for the runner; each technique can be switched off to measure it.
#[derive(Debug, Clone, Copy)]
pub struct LinuxUdpBinder {
    /// recvmmsg/sendmmsg instead of one datagram per system call.
    pub mmsg: bool,
    /// UDP GSO (`UDP_SEGMENT`): runs of equal datagrams to one peer as one send. Needs `mmsg`.
    pub gso: bool,
    /// UDP GRO (`UDP_GRO`): the kernel hands over runs of datagrams as one. Needs `mmsg`.
    pub gro: bool,
}

impl Default for LinuxUdpBinder {
    fn default() -> Self {
        Self {
            mmsg: true,
            gso: true,
            gro: true,
        }
    }
}

impl UdpBind for LinuxUdpBinder {
    type Socket = LinuxUdp;

    fn bind(&self, port: u16) -> io::Result<LinuxUdp> {
        let mut socket = LinuxUdp::bind(port)?;
        socket.mmsg = self.mmsg;
        socket.gso = AtomicBool::new(self.mmsg && self.gso);
        if self.mmsg && self.gro {
            let fd = socket.socket.as_fd();
            socket.gro = setsockopt(&fd, sockopt::UdpGroSegment, &true).is_ok();
        }
        Ok(socket)
    }
}

fn buffers(fd: &OwnedFd) {
    // The *Force options pass the system limit with CAP_NET_ADMIN; without it, ask politely.
    if setsockopt(fd, sockopt::RcvBufForce, &SOCKET_BUFFER).is_err() {
        let _ = setsockopt(fd, sockopt::RcvBuf, &SOCKET_BUFFER);
    }
    if setsockopt(fd, sockopt::SndBufForce, &SOCKET_BUFFER).is_err() {
        let _ = setsockopt(fd, sockopt::SndBuf, &SOCKET_BUFFER);
    }
}

impl LinuxUdp {
    /// Binds `port` on every address (0: a free port).
    pub fn bind(port: u16) -> io::Result<Self> {
        match Self::bind_v6(port) {
            Ok(s) => Ok(s),
            Err(e) if e == nix::Error::EAFNOSUPPORT || e == nix::Error::EADDRNOTAVAIL => {
                Self::bind_v4(port)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn bind_v6(port: u16) -> nix::Result<Self> {
        let fd = socket(
            AddressFamily::Inet6,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )?;
        setsockopt(&fd, sockopt::Ipv6V6Only, &false)?;
        buffers(&fd);
        let pktinfo = pktinfo::enable(&fd, true);
        let addr = SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, port, 0, 0);
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &SockaddrIn6::from(addr),
        )?;
        Ok(Self {
            socket: UdpSocket::from(fd),
            dual_stack: true,
            pktinfo,
            refused: Refused::default(),
            mmsg: true,
            gso: AtomicBool::new(false),
            gro: false,
        })
    }

    fn bind_v4(port: u16) -> io::Result<Self> {
        let fd = socket(
            AddressFamily::Inet,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )?;
        buffers(&fd);
        let pktinfo = pktinfo::enable(&fd, false);
        let addr = std::net::SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port);
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &SockaddrIn::from(addr),
        )?;
        Ok(Self {
            socket: UdpSocket::from(fd),
            dual_stack: false,
            pktinfo,
            refused: Refused::default(),
            mmsg: true,
            gso: AtomicBool::new(false),
            gro: false,
        })
    }

    fn wait(&self, flags: PollFlags, timeout: Duration) -> io::Result<bool> {
        super::poll::wait_fd(self.socket.as_fd(), flags, timeout)
    }

    /// Switches UDP GSO and GRO live (the operator's switch, `super::udp_switch`): GSO from
    /// the next send, GRO through the socket option, only where the socket was bound with it
    /// (its receive path splits what GRO merges). Answers what the socket does now: GSO as it
    /// sends, GRO as the kernel reports the option.
    pub(crate) fn set_offload(&self, gso: bool, gro: bool) -> (bool, bool) {
        self.gso.store(self.mmsg && gso, Ordering::Relaxed);
        let fd = self.socket.as_fd();
        if self.gro
            && let Err(e) = setsockopt(&fd, sockopt::UdpGroSegment, &gro)
        {
            tracing::warn!(error = %e, gro, "cannot change UDP_GRO on the WireGuard socket");
        }
        let gro_now = getsockopt(&fd, sockopt::UdpGroSegment).unwrap_or(false);
        (self.gso.load(Ordering::Relaxed), gro_now)
    }

    /// The address as this socket sends to it.
    fn outgoing(&self, addr: SocketAddr) -> SocketAddr {
        match addr {
            SocketAddr::V4(a) if self.dual_stack => {
                SocketAddr::new(IpAddr::V6(a.ip().to_ipv6_mapped()), a.port())
            }
            other => other,
        }
    }
}

impl LinuxUdp {
    fn recv_batched(&self, batch: &mut PacketBatch, timeout: Duration) -> io::Result<usize> {
        batch.clear();
        let mut waited = false;
        loop {
            match super::mmsg::recv(
                &self.socket,
                batch,
                (self.gro, self.pktinfo),
                plexsphere_wire::endpoint::canonical,
            ) {
                Ok(n) => {
                    self.refused.arrived(batch);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if waited || !self.wait(PollFlags::POLLIN, timeout)? {
                        return Ok(0);
                    }
                    waited = true;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // ICMP errors from earlier sends surface here; they are not fatal.
                Err(e) => {
                    tracing::trace!(error = %e, "UDP receive error");
                    if waited {
                        return Ok(0);
                    }
                }
            }
        }
    }

    fn send_batched(&self, batch: &PacketBatch) -> usize {
        let mut next = 0;
        let mut sent = 0;
        while next < batch.len() {
            let gso = self.gso.load(Ordering::Relaxed);
            let run = if gso {
                super::mmsg::gso_run(batch, next)
            } else {
                1
            };
            if run > 1 {
                let to = self.outgoing(batch.addr(next));
                let range = next..next + run;
                let mut src = self.refused.filter(batch.src(next));
                let mut result = self.with_retry(|| {
                    super::mmsg::send_gso(&self.socket, batch, range.clone(), (to, src))
                });
                if let (Err(e), Some(refused)) = (&result, src)
                    && pktinfo::source_refused(e)
                {
                    self.refused.add(refused);
                    src = None;
                    result = self.with_retry(|| {
                        super::mmsg::send_gso(&self.socket, batch, range.clone(), (to, src))
                    });
                }
                match result {
                    Ok(()) => sent += run,
                    Err(e) => {
                        if e.raw_os_error() == Some(libc::EIO) {
                            tracing::info!("the kernel refuses UDP GSO here; sending without it");
                            self.gso.store(false, Ordering::Relaxed);
                        }
                        sent += self.send_range(batch, range);
                    }
                }
                next += run;
                continue;
            }
            // Up to the next run GSO can carry (or the end), in sendmmsg calls.
            let mut end = next + 1;
            while end < batch.len() && !(gso && super::mmsg::gso_run(batch, end) > 1) {
                end += 1;
            }
            sent += self.send_range(batch, next..end);
            next = end;
        }
        sent
    }

    /// Calls `f` again once, after waiting for room, if the socket buffer was full.
    fn with_retry<T>(&self, f: impl Fn() -> io::Result<T>) -> io::Result<T> {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let _ = self.wait(PollFlags::POLLOUT, Duration::from_millis(50));
                f()
            }
            other => other,
        }
    }

    /// Sends `batch[range]` in sendmmsg calls, one per run of datagrams with the same source.
    fn send_range(&self, batch: &PacketBatch, range: Range<usize>) -> usize {
        let mut next = range.start;
        let mut sent = 0;
        while next < range.end {
            let src = self.refused.filter(batch.src(next));
            let mut end = next + 1;
            while end < range.end && self.refused.filter(batch.src(end)) == src {
                end += 1;
            }
            match self.with_retry(|| {
                super::mmsg::send(&self.socket, batch, next..end, src, |a| self.outgoing(a))
            }) {
                Ok(n) => {
                    next += n.max(1);
                    sent += n;
                }
                // Again without it (the filter leaves it out from now on).
                Err(e) if src.is_some() && pktinfo::source_refused(&e) => {
                    if let Some(refused) = src {
                        self.refused.add(refused);
                    }
                }
                Err(e) => {
                    // The first datagram of the rest was refused (no route, too big): skip it.
                    tracing::trace!(to = %batch.addr(next), error = %e, "UDP send failed; datagram dropped");
                    next += 1;
                }
            }
        }
        sent
    }

    fn recv_each(&self, batch: &mut PacketBatch, timeout: Duration) -> io::Result<usize> {
        super::poll::fill(
            batch,
            timeout,
            |batch| match self.recv_one(batch.next_slot()) {
                Ok((n, from, local)) => {
                    batch.commit(n, plexsphere_wire::endpoint::canonical(from));
                    batch.set_src(local);
                    self.refused.arrived(batch);
                    Ok(super::poll::Read::Done)
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) =>
                {
                    Err(e)
                }
                // ICMP errors from earlier sends surface here; they are not fatal.
                Err(e) => {
                    tracing::trace!(error = %e, "UDP receive error");
                    Ok(super::poll::Read::Skipped)
                }
            },
            |t| self.wait(PollFlags::POLLIN, t),
        )
    }

    fn send_each(&self, batch: &PacketBatch) -> io::Result<usize> {
        let mut sent = 0;
        for i in 0..batch.len() {
            let (datagram, to) = (batch.get(i), self.outgoing(batch.addr(i)));
            let mut src = self.refused.filter(batch.src(i));
            let mut result = self.send_one(datagram, to, src);
            if let (Err(e), Some(refused)) = (&result, src)
                && pktinfo::source_refused(e)
            {
                self.refused.add(refused);
                src = None;
                result = self.send_one(datagram, to, src);
            }
            if matches!(&result, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
                && self.wait(PollFlags::POLLOUT, Duration::from_millis(50))?
            {
                result = self.send_one(datagram, to, src);
            }
            match result {
                Ok(_) => sent += 1,
                Err(e) => tracing::trace!(%to, error = %e, "UDP send failed; datagram dropped"),
            }
        }
        Ok(sent)
    }
}

impl LinuxUdp {
    /// One datagram (recvmsg, for the local address): its length, source and local address.
    fn recv_one(&self, slot: &mut [u8]) -> io::Result<(usize, SocketAddr, Option<Source>)> {
        // recvmsg takes the buffer's length (cmsg_space! only reserves capacity).
        let mut space = self
            .pktinfo
            .then(|| vec![0u8; pktinfo::recv_space().capacity()]);
        let mut iov = [io::IoSliceMut::new(slot)];
        let msg = recvmsg::<SockaddrStorage>(
            std::os::fd::AsRawFd::as_raw_fd(&self.socket),
            &mut iov,
            space.as_deref_mut(),
            MsgFlags::MSG_DONTWAIT,
        )?;
        let local = msg
            .cmsgs()
            .ok()
            .and_then(|mut c| c.find_map(|c| pktinfo::source(&c)));
        let from = msg
            .address
            .as_ref()
            .and_then(|a| {
                a.as_sockaddr_in()
                    .map(|v4| SocketAddr::from(std::net::SocketAddrV4::from(*v4)))
                    .or_else(|| {
                        a.as_sockaddr_in6()
                            .map(|v6| SocketAddr::from(SocketAddrV6::from(*v6)))
                    })
            })
            .ok_or_else(|| io::Error::other("a datagram without an IP source address"))?;
        Ok((msg.bytes, from, local))
    }

    /// One datagram to `to`, from `src` when there is one.
    fn send_one(&self, datagram: &[u8], to: SocketAddr, src: Option<Source>) -> io::Result<()> {
        let info = src.map(SendInfo::new);
        let cmsg: Vec<ControlMessage<'_>> = info.iter().map(SendInfo::cmsg).collect();
        sendmsg(
            std::os::fd::AsRawFd::as_raw_fd(&self.socket),
            &[io::IoSlice::new(datagram)],
            &cmsg,
            MsgFlags::MSG_DONTWAIT,
            Some(&SockaddrStorage::from(to)),
        )?;
        Ok(())
    }
}

/// The source addresses the kernel refused; see the module docs.
#[derive(Default)]
struct Refused {
    /// Fast path: nothing refused (the usual case costs one atomic load per datagram).
    any: AtomicBool,
    ips: Mutex<Vec<IpAddr>>,
}

impl Refused {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<IpAddr>> {
        self.ips
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `src`, unless the kernel refused it.
    fn filter(&self, src: Option<Source>) -> Option<Source> {
        let src = src?;
        if self.any.load(Ordering::Relaxed) && self.lock().contains(&src.ip) {
            return None;
        }
        Some(src)
    }

    fn add(&self, src: Source) {
        let mut ips = self.lock();
        if !ips.contains(&src.ip) {
            if ips.len() >= MAX_REFUSED_SOURCES {
                ips.remove(0);
            }
            ips.push(src.ip);
            tracing::debug!(source = %src.ip, "the source address is gone; sending without it");
        }
        self.any.store(true, Ordering::Relaxed);
    }

    /// Datagrams arrived at these local addresses: they are back.
    fn arrived(&self, batch: &PacketBatch) {
        if !self.any.load(Ordering::Relaxed) {
            return;
        }
        let mut ips = self.lock();
        for i in 0..batch.len() {
            if let Some(src) = batch.src(i) {
                ips.retain(|ip| *ip != src.ip);
            }
        }
        self.any.store(!ips.is_empty(), Ordering::Relaxed);
    }
}

impl AsFd for LinuxUdp {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl Udp for LinuxUdp {
    fn recv(&self, batch: &mut PacketBatch, timeout: Duration) -> io::Result<usize> {
        if self.mmsg {
            self.recv_batched(batch, timeout)
        } else {
            self.recv_each(batch, timeout)
        }
    }

    fn send(&self, batch: &PacketBatch) -> io::Result<usize> {
        if self.mmsg {
            Ok(self.send_batched(batch))
        } else {
            self.send_each(batch)
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket
            .local_addr()
            .map(plexsphere_wire::endpoint::canonical)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_round_trip_over_loopback_with_plain_ipv4_addresses() {
        for (mmsg, gso, gro) in [
            (false, false, false),
            (true, false, false),
            (true, true, true),
        ] {
            round_trip(LinuxUdpBinder { mmsg, gso, gro });
        }
    }

    #[test]
    fn the_dual_stack_socket_carries_ipv6_too() {
        let binder = LinuxUdpBinder::default();
        let a = binder.bind(0).expect("bind a");
        let b = binder.bind(0).expect("bind b");
        assert!(
            b.dual_stack,
            "this host has IPv6; the socket should be dual-stack"
        );
        let to = SocketAddr::from((Ipv6Addr::LOCALHOST, b.local_addr().expect("addr").port()));
        let mut out = PacketBatch::new(64, 1);
        out.push(b"six", to);
        assert_eq!(a.send(&out).expect("send"), 1);
        let mut got = PacketBatch::new(64, 4);
        for _ in 0..50 {
            if b.recv(&mut got, Duration::from_millis(100)).expect("recv") > 0 {
                break;
            }
        }
        let (d, from) = got.datagrams().next().expect("a datagram over ::1");
        assert_eq!(d, b"six");
        assert_eq!(from.ip(), IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(
            got.src(0).map(|s| s.ip),
            Some(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            "the local address it arrived at"
        );
    }

    /// A datagram stamped with a source that is not (or no longer) local goes out without
    /// it, on every send path, and the receiver sees the local address it arrived at.
    #[test]
    fn a_refused_source_is_dropped_and_the_datagram_still_goes() {
        for (mmsg, gso) in [(false, false), (true, false), (true, true)] {
            let binder = LinuxUdpBinder {
                mmsg,
                gso,
                gro: false,
            };
            let (a, b) = (
                binder.bind(0).expect("bind a"),
                binder.bind(0).expect("bind b"),
            );
            let to = SocketAddr::from(([127, 0, 0, 1], b.local_addr().expect("addr").port()));
            let gone = Source::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 77)), 0);
            let mut out = PacketBatch::new(64, 4);
            for _ in 0..3 {
                out.push(&[7; 20], to);
                out.set_src(gone);
            }
            assert_eq!(a.send(&out).expect("send"), 3, "mmsg={mmsg} gso={gso}");
            let mut got = PacketBatch::new(64, 8);
            let mut n = 0;
            for _ in 0..50 {
                b.recv(&mut got, Duration::from_millis(100)).expect("recv");
                for (d, from, local) in got.datagrams_to() {
                    assert_eq!(d, &[7; 20]);
                    assert_eq!(from.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
                    assert_eq!(local.map(|l| l.ip), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
                    n += 1;
                }
                if n >= 3 {
                    break;
                }
            }
            assert_eq!(n, 3, "mmsg={mmsg} gso={gso}");
            assert!(
                a.refused.any.load(Ordering::Relaxed),
                "the refused source is remembered"
            );
        }
    }

    fn round_trip(binder: LinuxUdpBinder) {
        let a = binder.bind(0).expect("bind a");
        let b = binder.bind(0).expect("bind b");
        let b_addr = SocketAddr::from(([127, 0, 0, 1], b.local_addr().expect("addr").port()));
        let mut out = PacketBatch::new(64, 4);
        for i in 0..3u8 {
            out.push(&[i; 10], b_addr);
        }
        assert_eq!(a.send(&out).expect("send"), 3);
        let mut got = PacketBatch::new(64, 8);
        let mut datagrams: Vec<Vec<u8>> = Vec::new();
        for _ in 0..50 {
            b.recv(&mut got, Duration::from_millis(100)).expect("recv");
            for (d, from) in got.datagrams() {
                assert!(from.is_ipv4(), "mapped addresses come back as IPv4");
                assert_eq!(from.port(), a.local_addr().expect("addr").port());
                datagrams.push(d.to_vec());
            }
            if datagrams.len() >= 3 {
                break;
            }
        }
        // With GSO and GRO the three may travel as one; they come out as three all the same.
        assert_eq!(
            datagrams,
            vec![vec![0u8; 10], vec![1; 10], vec![2; 10]],
            "{binder:?}"
        );
    }
}
