//! The WireGuard UDP socket on Linux: one dual-stack socket (`[::]:port`, IPv4 as mapped
//! addresses), or an IPv4 one where the host has no IPv6. Non-blocking, with `poll` for waits
//! and large kernel buffers so bursts are not dropped.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::ops::Range;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::libc;
use nix::poll::PollFlags;
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6, bind, getsockopt, setsockopt,
    socket, sockopt,
};

use crate::batch::PacketBatch;
use crate::io::{Udp, UdpBind};

/// The socket buffer size asked for (wireguard-go asks for the same 7 MiB).
pub const SOCKET_BUFFER: usize = 7 << 20;

/// A bound WireGuard UDP socket.
pub struct LinuxUdp {
    socket: UdpSocket,
    dual_stack: bool,
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
        let addr = SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, port, 0, 0);
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &SockaddrIn6::from(addr),
        )?;
        Ok(Self {
            socket: UdpSocket::from(fd),
            dual_stack: true,
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
        let addr = std::net::SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port);
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &SockaddrIn::from(addr),
        )?;
        Ok(Self {
            socket: UdpSocket::from(fd),
            dual_stack: false,
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
    pub fn set_offload(&self, gso: bool, gro: bool) -> (bool, bool) {
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

    /// The address as peers see it: IPv4-mapped IPv6 becomes plain IPv4.
    fn canonical(addr: SocketAddr) -> SocketAddr {
        match addr {
            SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
                Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
                None => addr,
            },
            v4 => v4,
        }
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
            match super::mmsg::recv(&self.socket, batch, self.gro, Self::canonical) {
                Ok(n) => return Ok(n),
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
                match self
                    .with_retry(|| super::mmsg::send_gso(&self.socket, batch, range.clone(), to))
                {
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

    fn send_range(&self, batch: &PacketBatch, range: Range<usize>) -> usize {
        let mut next = range.start;
        let mut sent = 0;
        while next < range.end {
            match self.with_retry(|| {
                super::mmsg::send(&self.socket, batch, next..range.end, |a| self.outgoing(a))
            }) {
                Ok(n) => {
                    next += n.max(1);
                    sent += n;
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
            |batch| match self.socket.recv_from(batch.next_slot()) {
                Ok((n, from)) => {
                    batch.commit(n, Self::canonical(from));
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
        for (datagram, to) in batch.iter() {
            let to = self.outgoing(to);
            let mut result = self.socket.send_to(datagram, to);
            if matches!(&result, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
                && self.wait(PollFlags::POLLOUT, Duration::from_millis(50))?
            {
                result = self.socket.send_to(datagram, to);
            }
            match result {
                Ok(_) => sent += 1,
                Err(e) => tracing::trace!(%to, error = %e, "UDP send failed; datagram dropped"),
            }
        }
        Ok(sent)
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
        self.socket.local_addr().map(Self::canonical)
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
