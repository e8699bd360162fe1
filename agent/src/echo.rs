//! The ICMP socket `plexd ping` sends from: an unprivileged ping socket (`SOCK_DGRAM`,
//! allowed by `net.ipv4.ping_group_range`), else a raw socket (root or `CAP_NET_RAW`). It is
//! connected to the peer's mesh IP, so the kernel routes it over the mesh interface and a raw
//! socket only sees that host's packets.

use std::io::Read as _;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};

/// The payload of every echo request, in bytes: 8 bytes of a per-run token, then zeros.
pub const PAYLOAD_LEN: usize = 56;

/// The longest datagram read (an echo reply with its IP header fits easily).
const MAX_DATAGRAM: usize = 1500;

/// A connected ICMP echo socket.
pub(crate) struct EchoSocket {
    sock: Socket,
    v6: bool,
    raw: bool,
}

impl EchoSocket {
    /// Opens a ping socket to `ip`, or a raw one when ping sockets are not allowed.
    pub fn open(ip: IpAddr) -> Result<Self, String> {
        let (domain, proto, v6) = match ip {
            IpAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4, false),
            IpAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6, true),
        };
        let (sock, raw) = match Socket::new(domain, Type::DGRAM, Some(proto)) {
            Ok(s) => (s, false),
            Err(dgram) => match Socket::new(domain, Type::RAW, Some(proto)) {
                Ok(s) => (s, true),
                Err(raw) => {
                    return Err(format!(
                        "cannot open an ICMP socket: a ping socket is refused ({dgram}; see sysctl net.ipv4.ping_group_range) and a raw one too ({raw}; needs root or CAP_NET_RAW)"
                    ));
                }
            },
        };
        sock.connect(&SocketAddr::new(ip, 0).into())
            .map_err(|e| format!("cannot send ICMP to {ip}: {e}; is the mesh interface up?"))?;
        Ok(Self { sock, v6, raw })
    }

    /// `ping socket` or `raw socket`, for the report.
    pub fn kind(&self) -> &'static str {
        if self.raw {
            "raw socket"
        } else {
            "ping socket"
        }
    }

    /// Sends `count` requests `interval` apart, each waiting up to `timeout` for its reply.
    pub fn run(
        &self,
        count: u32,
        interval: Duration,
        timeout: Duration,
    ) -> Result<Vec<Reply>, String> {
        let token = crate::jitter::Jitter::from_os().next_u64().to_be_bytes();
        let ident = u16::from_be_bytes([token[0], token[1]]);
        let mut replies = Vec::new();
        for i in 0..count {
            let seq = u16::try_from(i + 1).unwrap_or(u16::MAX);
            let started = Instant::now();
            let packet = echo_request(self.v6, ident, seq, token);
            self.sock
                .send(&packet)
                .map_err(|e| format!("cannot send an echo request: {e}"))?;
            let rtt = self.wait_for(seq, token, started, timeout)?;
            replies.push(Reply {
                seq,
                rtt_ms: rtt.map(|d| (d.as_secs_f64() * 1_000_000.0).round() / 1000.0),
            });
            if i + 1 < count {
                std::thread::sleep(interval.saturating_sub(started.elapsed()));
            }
        }
        Ok(replies)
    }

    /// The round trip of request `seq`, or `None` when `timeout` passed without its reply.
    fn wait_for(
        &self,
        seq: u16,
        token: [u8; 8],
        started: Instant,
        timeout: Duration,
    ) -> Result<Option<Duration>, String> {
        let mut buf = [0u8; MAX_DATAGRAM];
        loop {
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Ok(None);
            }
            self.sock
                .set_read_timeout(Some(left))
                .map_err(|e| format!("cannot set the socket's timeout: {e}"))?;
            match (&self.sock).read(&mut buf) {
                Ok(n) => {
                    let with_header = self.raw && !self.v6;
                    if echo_reply_seq(&buf[..n], self.v6, with_header, token) == Some(seq) {
                        return Ok(Some(started.elapsed()));
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // An ICMP error (host unreachable) arrives as a socket error: no reply.
                Err(e) => {
                    tracing::debug!(error = %e, seq, "echo request failed");
                    std::thread::sleep(timeout.saturating_sub(started.elapsed()));
                    return Ok(None);
                }
            }
        }
    }
}

/// An ICMP (v4) or ICMPv6 echo request. The v4 checksum is filled in; the kernel fills the
/// ICMPv6 one (it covers a pseudo header only the kernel knows) and, on a ping socket, the
/// identifier.
pub fn echo_request(v6: bool, ident: u16, seq: u16, token: [u8; 8]) -> Vec<u8> {
    let mut p = vec![0u8; 8 + PAYLOAD_LEN];
    p[0] = if v6 { 128 } else { 8 };
    p[4..6].copy_from_slice(&ident.to_be_bytes());
    p[6..8].copy_from_slice(&seq.to_be_bytes());
    p[8..16].copy_from_slice(&token);
    if !v6 {
        let sum = checksum(&p);
        p[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    p
}

/// The sequence number of an echo reply carrying `token`, or `None` for anything else (other
/// ICMP traffic a raw socket sees). `with_ip_header`: the datagram starts with the IPv4 header
/// (a raw v4 socket's do).
pub fn echo_reply_seq(
    datagram: &[u8],
    v6: bool,
    with_ip_header: bool,
    token: [u8; 8],
) -> Option<u16> {
    let icmp = if with_ip_header {
        let ihl = usize::from(datagram.first()? & 0x0f) * 4;
        datagram.get(ihl..)?
    } else {
        datagram
    };
    let reply_type = if v6 { 129 } else { 0 };
    if icmp.len() < 16 || icmp[0] != reply_type || icmp[1] != 0 || icmp[8..16] != token {
        return None;
    }
    Some(u16::from_be_bytes([icmp[6], icmp[7]]))
}

/// The Internet checksum (RFC 1071).
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in data.chunks(2) {
        let word = match chunk {
            [a, b] => u16::from_be_bytes([*a, *b]),
            [a] => u16::from_be_bytes([*a, 0]),
            _ => 0,
        };
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// One request's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reply {
    pub seq: u16,
    /// The round trip in milliseconds; `None`: no reply within `--timeout`.
    pub rtt_ms: Option<f64>,
}
