//! The ICMP socket `plexd ping` sends from: an unprivileged ping socket (`SOCK_DGRAM`,
//! allowed by `net.ipv4.ping_group_range`), else a raw socket (root or `CAP_NET_RAW`). It is
//! connected to the peer's mesh IP, so the kernel routes it over the mesh interface and a raw
//! socket only sees that host's packets.

use std::io::Read as _;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::ping::{self, Reply};

/// The longest datagram read (an echo reply with its IP header fits easily).
const MAX_DATAGRAM: usize = 1500;

/// A connected ICMP echo socket.
pub struct EchoSocket {
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
            let packet = ping::echo_request(self.v6, ident, seq, token);
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
                    if ping::echo_reply_seq(&buf[..n], self.v6, with_header, token) == Some(seq) {
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
