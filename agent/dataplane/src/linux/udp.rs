//! The WireGuard UDP socket on Linux: one dual-stack socket (`[::]:port`, IPv4 as mapped
//! addresses), or an IPv4 one where the host has no IPv6. Non-blocking, with `poll` for waits
//! and large kernel buffers so bursts are not dropped.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6, bind, setsockopt, socket, sockopt,
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
}

/// Binds `LinuxUdp` sockets for the runner.
#[derive(Debug, Clone, Copy)]
pub struct LinuxUdpBinder {
    /// Use recvmmsg/sendmmsg (on by default; off measures the per-datagram baseline).
    pub mmsg: bool,
}

impl Default for LinuxUdpBinder {
    fn default() -> Self {
        Self { mmsg: true }
    }
}

impl UdpBind for LinuxUdpBinder {
    type Socket = LinuxUdp;

    fn bind(&self, port: u16) -> io::Result<LinuxUdp> {
        let mut socket = LinuxUdp::bind(port)?;
        socket.mmsg = self.mmsg;
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
        })
    }

    fn wait(&self, flags: PollFlags, timeout: Duration) -> io::Result<bool> {
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.socket.as_fd(), flags)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(n) => Ok(n > 0),
            Err(nix::Error::EINTR) => Ok(false),
            Err(e) => Err(e.into()),
        }
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
            match super::mmsg::recv(&self.socket, batch, Self::canonical) {
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
        let mut retried = false;
        while next < batch.len() {
            match super::mmsg::send(&self.socket, batch, next, |a| self.outgoing(a)) {
                Ok(n) => {
                    next += n.max(1);
                    sent += n;
                    retried = false;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !retried => {
                    retried = true;
                    let _ = self.wait(PollFlags::POLLOUT, Duration::from_millis(50));
                }
                Err(e) => {
                    // The first datagram of the rest was refused (no route, too big): skip it.
                    tracing::trace!(to = %batch.addr(next), error = %e, "UDP send failed; datagram dropped");
                    next += 1;
                    retried = false;
                }
            }
        }
        sent
    }

    fn recv_each(&self, batch: &mut PacketBatch, timeout: Duration) -> io::Result<usize> {
        batch.clear();
        let mut waited = false;
        while !batch.is_full() {
            let slot = batch.next_slot();
            match self.socket.recv_from(slot) {
                Ok((n, from)) => batch.commit(n, Self::canonical(from)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !batch.is_empty() || waited {
                        break;
                    }
                    waited = true;
                    if !self.wait(PollFlags::POLLIN, timeout)? {
                        break;
                    }
                }
                // ICMP errors from earlier sends surface here; they are not fatal.
                Err(e) if e.kind() != io::ErrorKind::Interrupted => {
                    tracing::trace!(error = %e, "UDP receive error");
                    if waited {
                        break;
                    }
                }
                Err(_) => {}
            }
        }
        Ok(batch.len())
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
        for mmsg in [false, true] {
            round_trip(mmsg);
        }
    }

    fn round_trip(mmsg: bool) {
        let binder = LinuxUdpBinder { mmsg };
        let a = binder.bind(0).expect("bind a");
        let b = binder.bind(0).expect("bind b");
        let b_addr = SocketAddr::from(([127, 0, 0, 1], b.local_addr().expect("addr").port()));
        let mut out = PacketBatch::new(64, 4);
        for i in 0..3u8 {
            out.push(&[i; 10], b_addr);
        }
        assert_eq!(a.send(&out).expect("send"), 3);
        let mut got = PacketBatch::new(64, 8);
        let mut n = 0;
        for _ in 0..50 {
            n += b.recv(&mut got, Duration::from_millis(100)).expect("recv");
            if n == 3 {
                break;
            }
        }
        assert_eq!(n, 3);
        assert!(got.addr(0).is_ipv4(), "mapped addresses come back as IPv4");
        assert_eq!(got.addr(0).port(), a.local_addr().expect("addr").port());
    }
}
