//! `udp-gso-blast`: a QUIC-like bulk UDP sender and its receiver, for the `udpgso` row of
//! benches/wg-bench.sh. iperf3 (Debian 12's 3.12) writes one datagram per system call, so the
//! TUN's UDP segmentation offload (USO) never sees a super-datagram; this sender does what
//! QUIC stacks do: `UDP_SEGMENT` (UDP GSO) with `SEGMENT` bytes per datagram and
//! `SEGMENTS_PER_SEND` datagrams per `send`, for S seconds, with at most `WINDOW` bytes in
//! flight (a fixed congestion window: the receiver acknowledges the bytes it has, every
//! `ACK_EVERY`, through the tunnel; what goes unacknowledged for `LOSS_TIMEOUT` counts as
//! lost and stops holding the window). So, like a QUIC bulk transfer and unlike a blind flood,
//! the sender does not spin on a core of its own while the tunnel drops what it cannot carry.
//! The receiver reads with `recvmmsg` (and asks for UDP GRO, as a QUIC receiver does) and
//! counts what arrives.
//!
//! ```text
//! udp-gso-blast recv <ip:port> [--secs S]   # waits up to S s in all; ends 1 s after the last datagram
//! udp-gso-blast send <ip:port> [--secs S]   # sends for S s
//! ```
//!
//! Each prints one JSON object on stdout: the receiver `{"role":"recv","bytes":..,
//! "datagrams":..,"seconds":..}` (seconds from the first datagram to the last), the sender
//! `{"role":"send","bytes":..,"sends":..,"errors":..,"seconds":..}`. A benchmark tool, not
//! a test: it asserts nothing. Exit codes: 0 done, 1 a socket failed, 64 bad usage.

use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, setsockopt, sockopt,
};

const USAGE: &str = "usage: udp-gso-blast recv|send <ip:port> [--secs S]";
/// Payload bytes per datagram: what QUIC stacks send on a 1280-1500 byte path (quinn's and
/// quiche's default), and it fits the tunnel's MTU of 1420 (1200 + 28 < 1420).
const SEGMENT: usize = 1200;
/// Datagrams per `send`: 54 x 1200 = 64 800 bytes, just under the 65 000 a GSO send may carry
/// (an IP packet's 16-bit length), so one system call hands the kernel 64 KiB.
const SEGMENTS_PER_SEND: usize = 54;
/// The default length of a run, in seconds.
const DEFAULT_SECS: u64 = 5;
/// The most seconds either side may be asked to run (a bound, so a typo cannot hang a run).
const MAX_SECS: u64 = 600;
/// The receiver ends this long after the last datagram (once one has arrived).
const IDLE_END: Duration = Duration::from_secs(1);
/// How long one receive waits before the receiver looks at the clock.
const RECV_WAIT: Duration = Duration::from_millis(200);
/// Datagrams (or GRO super-datagrams) per `recvmmsg`, each slot 64 KiB.
const RECV_BATCH: usize = 32;
const RECV_SLOT: usize = 65_536;
/// The most bytes sent and not yet acknowledged (nor written off): about 32 sends, 4 ms at
/// 4 Gbit/s, several times the tunnel's round trip on one host.
const WINDOW: u64 = 2 << 20;
/// How often the receiver acknowledges (8 bytes: the bytes it has so far, little-endian).
const ACK_EVERY: Duration = Duration::from_millis(1);
/// Sent bytes with no acknowledgement progress for this long count as lost.
const LOSS_TIMEOUT: Duration = Duration::from_millis(5);
/// How long a sender with a full window waits for an acknowledgement at a time.
const ACK_WAIT: Duration = Duration::from_millis(1);
/// The receive buffer asked for (`SO_RCVBUFFORCE` as root, else `SO_RCVBUF` up to the
/// host's rmem_max): large, so the receiver's socket is not what drops a burst.
const RECV_BUFFER: usize = 8 << 20;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = parse(&args);
    let (role, addr, secs) = match parsed {
        Ok(p) => p,
        Err(e) => {
            eprintln!("udp-gso-blast: {e}\n{USAGE}");
            return ExitCode::from(64);
        }
    };
    let result = match role.as_str() {
        "send" => send(addr, secs),
        _ => recv(addr, secs),
    };
    match result {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("udp-gso-blast {role} {addr}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse(args: &[String]) -> Result<(String, SocketAddr, Duration), String> {
    let [role, addr, rest @ ..] = args else {
        return Err("missing the role and the address".into());
    };
    if role != "send" && role != "recv" {
        return Err(format!("the role is `send` or `recv`, not `{role}`"));
    }
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| format!("`{addr}` is not an ip:port ({e})"))?;
    let secs = match rest {
        [] => DEFAULT_SECS,
        [flag, n] if flag == "--secs" => n
            .parse::<u64>()
            .ok()
            .filter(|s| (1..=MAX_SECS).contains(s))
            .ok_or_else(|| format!("--secs takes 1..={MAX_SECS}, not `{n}`"))?,
        _ => return Err(format!("unexpected arguments {rest:?}")),
    };
    Ok((role.clone(), addr, Duration::from_secs(secs)))
}

/// Sends `SEGMENTS_PER_SEND` datagrams of `SEGMENT` bytes per system call to `to` for `secs`.
fn send(to: SocketAddr, secs: Duration) -> io::Result<String> {
    let bind: SocketAddr = if to.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(bind)?;
    socket.connect(to)?;
    // SEGMENT is 1200: it fits an i32.
    setsockopt(&socket.as_fd(), sockopt::UdpGsoSegment, &(SEGMENT as i32)).map_err(|e| {
        io::Error::other(format!(
            "UDP_SEGMENT refused ({e}); UDP GSO needs Linux 4.18 or later"
        ))
    })?;
    let payload: Vec<u8> = (0..SEGMENT * SEGMENTS_PER_SEND)
        .map(|i| (i % 251) as u8)
        .collect();
    socket.set_read_timeout(Some(ACK_WAIT))?;
    let (mut bytes, mut sends, mut errors) = (0u64, 0u64, 0u64);
    let (mut acked, mut written_off, mut stalls) = (0u64, 0u64, 0u64);
    let mut ack = [0u8; 8];
    let mut progress = Instant::now();
    let start = Instant::now();
    while start.elapsed() < secs {
        // Take every acknowledgement waiting; with a full window, wait for one.
        loop {
            let in_flight = bytes.saturating_sub(acked.max(written_off));
            let got = if in_flight < WINDOW {
                nix::sys::socket::recv(socket.as_raw_fd(), &mut ack, MsgFlags::MSG_DONTWAIT)
                    .map_err(io::Error::from)
            } else {
                socket.recv(&mut ack)
            };
            match got {
                Ok(8) => {
                    let n = u64::from_le_bytes(ack);
                    if n > acked {
                        acked = n;
                        progress = Instant::now();
                    }
                }
                Ok(_) => {}
                Err(_) if in_flight < WINDOW => break,
                Err(_) => {
                    if progress.elapsed() >= LOSS_TIMEOUT {
                        // What is in flight is lost: it no longer holds the window.
                        written_off = bytes;
                        progress = Instant::now();
                        stalls += 1;
                    }
                    if start.elapsed() >= secs {
                        break;
                    }
                }
            }
        }
        match socket.send(&payload) {
            Ok(n) => {
                bytes += n as u64;
                sends += 1;
            }
            // A full device queue (ENOBUFS) or an ICMP error from the other end: a flood
            // goes on, and the count says how often.
            Err(_) => errors += 1,
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(format!(
        "{{\"role\":\"send\",\"bytes\":{bytes},\"sends\":{sends},\"errors\":{errors},\"acked\":{acked},\"stalls\":{stalls},\"seconds\":{seconds:.6},\"segment\":{SEGMENT},\"segments_per_send\":{SEGMENTS_PER_SEND}}}"
    ))
}

/// Counts what arrives at `at`, from the first datagram until `IDLE_END` after the last, or
/// `secs` in all.
fn recv(at: SocketAddr, secs: Duration) -> io::Result<String> {
    let socket = UdpSocket::bind(at)?;
    let fd = socket.as_fd();
    if setsockopt(&fd, sockopt::RcvBufForce, &RECV_BUFFER).is_err() {
        // Not root: as much as the host's rmem_max allows.
        let _ = setsockopt(&fd, sockopt::RcvBuf, &RECV_BUFFER);
    }
    // As a QUIC receiver does; where the kernel coalesces, one slot holds many datagrams.
    let gro = setsockopt(&fd, sockopt::UdpGroSegment, &true).is_ok();
    socket.set_read_timeout(Some(RECV_WAIT))?;
    let mut slots = vec![vec![0u8; RECV_SLOT]; RECV_BATCH];
    let cmsg = gro.then(|| nix::cmsg_space!(i32));
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(RECV_BATCH, cmsg);
    let (mut bytes, mut datagrams) = (0u64, 0u64);
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    let (mut sender, mut acked_at) = (None::<SocketAddr>, Instant::now());
    let start = Instant::now();
    while start.elapsed() < secs && last.is_none_or(|l| l.elapsed() < IDLE_END) {
        let mut iovs: Vec<[IoSliceMut<'_>; 1]> = slots
            .iter_mut()
            .map(|s| [IoSliceMut::new(&mut s[..])])
            .collect();
        let results = match recvmmsg(
            socket.as_raw_fd(),
            &mut headers,
            iovs.iter_mut(),
            MsgFlags::MSG_WAITFORONE,
            None,
        ) {
            Ok(r) => r,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        let now = Instant::now();
        for r in results {
            let mut segment = 0;
            if let Ok(cmsgs) = r.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::UdpGroSegments(size) = c {
                        segment = usize::try_from(size).unwrap_or(0);
                    }
                }
            }
            bytes += r.bytes as u64;
            datagrams += if segment > 0 {
                r.bytes.div_ceil(segment) as u64
            } else {
                1
            };
            first.get_or_insert(now);
            last = Some(now);
            if let Some(a) = r.address.as_ref().and_then(|a| a.as_sockaddr_in()) {
                sender = Some(SocketAddr::V4((*a).into()));
            } else if let Some(a) = r.address.as_ref().and_then(|a| a.as_sockaddr_in6()) {
                sender = Some(SocketAddr::V6((*a).into()));
            }
        }
        if let Some(to) = sender
            && acked_at.elapsed() >= ACK_EVERY
        {
            // Lost acknowledgements are fine: the next one carries the same count, larger.
            let _ = socket.send_to(&bytes.to_le_bytes(), to);
            acked_at = now;
        }
    }
    let seconds = match (first, last) {
        (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    Ok(format!(
        "{{\"role\":\"recv\",\"bytes\":{bytes},\"datagrams\":{datagrams},\"seconds\":{seconds:.6},\"gro\":{gro}}}"
    ))
}
