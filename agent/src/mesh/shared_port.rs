//! WireGuard's own port, shared with the kernel: raw sockets (IPv4 and IPv6) whose BPF filter
//! passes only the datagrams to that port that plexd speaks (STUN, disco and relay frames) and
//! never WireGuard's, and that send from that port. With them the kernel's WireGuard keeps the
//! port and its socket, so a direct path runs kernel to kernel, while STUN, disco and relay
//! frames still leave from (and are answered at) the one address and port the NAT maps. The
//! idea is NetBird's "shared socket"; docs/reach.md ("The kernel backend") argues it against
//! the alternatives.
//!
//! - The filter runs in the kernel on every UDP datagram for this host and copies only the
//!   ones that match; WireGuard's datagrams never reach userspace.
//! - What arrives is a copy: the kernel's WireGuard sees the same datagram and drops it (its
//!   first four bytes are no WireGuard message type).
//! - A fragment other than the first is dropped by the filter (its payload does not start
//!   with a UDP header); STUN, disco and relay control frames are far below any MTU, and a
//!   relayed WireGuard datagram is framed below the path's MTU.
//! - Sends build the UDP header here. Over IPv4 the checksum is 0 ("none", RFC 768); over
//!   IPv6 the kernel computes it (`IPV6_CHECKSUM`), which is the one `unsafe` call here.
//!   The kernel picks the source address by its routes, as it does for WireGuard's own
//!   datagrams (a WireGuard fwmark with policy routing could make the two differ: not handled).
//! - Needs `CAP_NET_RAW` (plexd runs as root for the kernel backend anyway).
#![allow(unsafe_code)]

use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use plexsphere_wire::reach::{DISCO_MAGIC, MAX_DATAGRAM, RELAY_MAGIC};
use socket2::{Domain, Protocol, SockFilter, Socket, Type};

/// The UDP header's length.
const UDP_HEAD: usize = 8;
/// The longest IPv4 header (IHL 15).
const MAX_IPV4_HEAD: usize = 60;
/// STUN's magic cookie (RFC 5389), at offset 4 of a STUN message.
const STUN_COOKIE: u32 = 0x2112_A442;

/// plexd's side of WireGuard's port with the kernel backend: see the module's docs.
pub struct SharedPort {
    port: u16,
    v4: UdpSocket,
    /// None when the host has no IPv6 (the socket could not be made).
    v6: Option<UdpSocket>,
}

impl SharedPort {
    /// Raw sockets that see the STUN, disco and relay datagrams to `port` and send from it.
    /// Whoever owns the port (the kernel's WireGuard) keeps it.
    pub fn open(port: u16) -> io::Result<Self> {
        if port == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the shared port must be a fixed port (WireGuard's listen_port), not 0",
            ));
        }
        let v4 = raw(Domain::IPV4, &filter(port, true))?;
        let v6 = match raw(Domain::IPV6, &filter(port, false)) {
            Ok(s) => {
                ipv6_checksum_at(&s, 6)?;
                Some(s)
            }
            Err(e) if e.raw_os_error() == Some(nix::libc::EAFNOSUPPORT) => None,
            Err(e) => return Err(e),
        };
        Ok(Self {
            port,
            v4: UdpSocket::from(OwnedFd::from(v4)),
            v6: v6.map(|s| UdpSocket::from(OwnedFd::from(s))),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Waits up to `wait` for a datagram on either family; puts its UDP payload into `buf`
    /// and answers its length and source. `Ok(None)` when nothing came. A payload longer than
    /// `buf` is cut to it (callers give [`MAX_DATAGRAM`]).
    pub fn recv_from(
        &self,
        buf: &mut [u8],
        wait: Duration,
    ) -> io::Result<Option<(usize, SocketAddr)>> {
        let mut fds = vec![PollFd::new(self.v4.as_fd(), PollFlags::POLLIN)];
        if let Some(v6) = &self.v6 {
            fds.push(PollFd::new(v6.as_fd(), PollFlags::POLLIN));
        }
        let ms = u16::try_from(wait.as_millis()).unwrap_or(u16::MAX);
        let ready = poll(&mut fds, PollTimeout::from(ms)).map_err(io::Error::from)?;
        if ready == 0 {
            return Ok(None);
        }
        let v4_ready = fds[0].any().unwrap_or(false);
        let v6_ready = fds.get(1).and_then(|f| f.any()).unwrap_or(false);
        drop(fds);
        let mut packet = [0u8; MAX_IPV4_HEAD + UDP_HEAD + MAX_DATAGRAM];
        if v4_ready {
            let (n, from) = self.v4.recv_from(&mut packet)?;
            if let Some(got) = self.payload(&packet[..n], ipv4_head_len(&packet[..n]), from, buf) {
                return Ok(Some(got));
            }
        }
        if let (true, Some(v6)) = (v6_ready, &self.v6) {
            let (n, from) = v6.recv_from(&mut packet)?;
            if let Some(got) = self.payload(&packet[..n], Some(0), from, buf) {
                return Ok(Some(got));
            }
        }
        Ok(None)
    }

    /// The UDP payload of `packet` (its UDP header at `head`) into `buf`, with the source's
    /// port from the header; None when it is not a whole UDP datagram to our port.
    fn payload(
        &self,
        packet: &[u8],
        head: Option<usize>,
        from: SocketAddr,
        buf: &mut [u8],
    ) -> Option<(usize, SocketAddr)> {
        let head = head?;
        let udp = packet.get(head..head + UDP_HEAD)?;
        let src_port = u16::from_be_bytes([udp[0], udp[1]]);
        let dst_port = u16::from_be_bytes([udp[2], udp[3]]);
        if dst_port != self.port {
            return None;
        }
        let body = &packet[head + UDP_HEAD..];
        let n = body.len().min(buf.len());
        buf[..n].copy_from_slice(&body[..n]);
        Some((
            n,
            with_port(plexsphere_wire::endpoint::canonical(from), src_port),
        ))
    }

    /// Sends `payload` to `to` from the shared port.
    pub fn send_to(&self, payload: &[u8], to: SocketAddr) -> io::Result<usize> {
        let to = plexsphere_wire::endpoint::canonical(to);
        if payload.len() > MAX_DATAGRAM {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a datagram of {} bytes is longer than {MAX_DATAGRAM}",
                    payload.len()
                ),
            ));
        }
        let mut datagram = Vec::with_capacity(UDP_HEAD + payload.len());
        let len = (UDP_HEAD + payload.len()) as u16;
        datagram.extend_from_slice(&self.port.to_be_bytes());
        datagram.extend_from_slice(&to.port().to_be_bytes());
        datagram.extend_from_slice(&len.to_be_bytes());
        datagram.extend_from_slice(&[0, 0]);
        datagram.extend_from_slice(payload);
        // A raw socket takes no port in the address (IPv6 would take it for the protocol).
        let sent = match to {
            SocketAddr::V4(v4) => self.v4.send_to(&datagram, SocketAddrV4::new(*v4.ip(), 0))?,
            SocketAddr::V6(v6) => match &self.v6 {
                Some(s) => s.send_to(
                    &datagram,
                    SocketAddrV6::new(*v6.ip(), 0, v6.flowinfo(), v6.scope_id()),
                )?,
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrNotAvailable,
                        format!("cannot send to {to}: this host has no IPv6"),
                    ));
                }
            },
        };
        Ok(sent.saturating_sub(UDP_HEAD))
    }
}

fn raw(domain: Domain, program: &[SockFilter]) -> io::Result<Socket> {
    let s = Socket::new(domain, Type::RAW, Some(Protocol::UDP))?;
    s.set_cloexec(true)?;
    s.attach_filter(program)?;
    Ok(s)
}

/// `IPV6_CHECKSUM`: the kernel writes (and on receipt checks) the UDP checksum at `offset`.
fn ipv6_checksum_at(s: &Socket, offset: i32) -> io::Result<()> {
    let value: nix::libc::c_int = offset;
    // SAFETY: a plain setsockopt with a pointer to a live c_int and its size, on a socket this
    // function borrows for the duration of the call.
    let rc = unsafe {
        nix::libc::setsockopt(
            s.as_raw_fd(),
            nix::libc::IPPROTO_IPV6,
            nix::libc::IPV6_CHECKSUM,
            (&value as *const nix::libc::c_int).cast(),
            std::mem::size_of::<nix::libc::c_int>() as nix::libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Where an IPv4 packet's UDP header starts, or None for a later fragment or a short packet.
fn ipv4_head_len(packet: &[u8]) -> Option<usize> {
    let first = *packet.first()?;
    let flags_offset = u16::from_be_bytes([*packet.get(6)?, *packet.get(7)?]);
    if first >> 4 != 4 || flags_offset & 0x1fff != 0 {
        return None;
    }
    Some(usize::from(first & 0x0f) * 4)
}

fn with_port(a: SocketAddr, port: u16) -> SocketAddr {
    match a.ip() {
        IpAddr::V4(ip) => SocketAddr::from((ip, port)),
        IpAddr::V6(ip) => SocketAddr::from((ip, port)),
    }
}

// Classic BPF (linux/filter.h).
const LD_W_ABS: u16 = 0x20;
const LD_H_ABS: u16 = 0x28;
const LD_W_IND: u16 = 0x40;
const LD_H_IND: u16 = 0x48;
const LDX_B_MSH: u16 = 0xb1;
const JEQ_K: u16 = 0x15;
const JSET_K: u16 = 0x45;
const AND_K: u16 = 0x54;
const RET_K: u16 = 0x06;
/// How many bytes of a match the socket gets: all of it.
const ACCEPT_ALL: u32 = 0x0004_0000;

/// The filter: UDP to `port` whose payload is STUN (the cookie at 4), a relay frame (its
/// magic) or disco (the first three bytes of its magic). For IPv4 the program sees the IP
/// header first (later fragments are dropped); for IPv6 it starts at the UDP header.
fn filter(port: u16, ipv4: bool) -> Vec<SockFilter> {
    let relay = u32::from_be_bytes(RELAY_MAGIC);
    let disco = u32::from_be_bytes(DISCO_MAGIC) & 0xffff_ff00;
    let port = u32::from(port);
    // (code, jump-if-true to, jump-if-false to, k) with jumps as labels resolved below.
    let mut p: Vec<(u16, Label, Label, u32)> = Vec::new();
    let (ld_h, ld_w) = if ipv4 {
        p.push((LD_H_ABS, Next, Next, 6));
        p.push((JSET_K, Refuse, Next, 0x1fff));
        p.push((LDX_B_MSH, Next, Next, 0));
        (LD_H_IND, LD_W_IND)
    } else {
        (LD_H_ABS, LD_W_ABS)
    };
    p.push((ld_h, Next, Next, 2));
    p.push((JEQ_K, Next, Refuse, port));
    p.push((ld_w, Next, Next, 12));
    p.push((JEQ_K, Take, Next, STUN_COOKIE));
    p.push((ld_w, Next, Next, 8));
    p.push((JEQ_K, Take, Next, relay));
    p.push((AND_K, Next, Next, 0xffff_ff00));
    p.push((JEQ_K, Take, Refuse, disco));
    let refuse_at = p.len();
    let take_at = p.len() + 1;
    let mut out: Vec<SockFilter> = p
        .iter()
        .enumerate()
        .map(|(i, &(code, jt, jf, k))| {
            let to = |l: Label| -> u8 {
                let target = match l {
                    Next => i + 1,
                    Refuse => refuse_at,
                    Take => take_at,
                };
                // Every jump is forward and short: the program is 14 instructions.
                (target - i - 1) as u8
            };
            SockFilter::new(code, to(jt), to(jf), k)
        })
        .collect();
    out.push(SockFilter::new(RET_K, 0, 0, 0));
    out.push(SockFilter::new(RET_K, 0, 0, ACCEPT_ALL));
    out
}

#[derive(Clone, Copy)]
enum Label {
    Next,
    Refuse,
    Take,
}
use Label::{Next, Refuse, Take};
