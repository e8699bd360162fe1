//! What the harness tests measure a NAT with: a UDP echo on the public segment that answers
//! every datagram with the source address it saw (`ip:port`, as text), and a client that sends
//! from one socket to several such echoes and reads back how it was translated.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::netns::on_thread_in;

/// How often the echo's thread looks at its stop flag.
const ECHO_POLL: Duration = Duration::from_millis(100);
/// The longest datagram the echo and the client read.
const MAX_DATAGRAM: usize = 1500;

/// A UDP echo bound in a namespace; it stops when dropped.
pub struct UdpEcho {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl UdpEcho {
    /// Binds `addr` (port 0 picks one) inside `ns` and answers every datagram with its source.
    pub fn start(ns: &str, addr: SocketAddr) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let flag = Arc::clone(&stop);
        let thread = on_thread_in(ns, move || {
            let sock = UdpSocket::bind(addr).with_context(|| format!("binding {addr}"))?;
            sock.set_read_timeout(Some(ECHO_POLL))?;
            tx.send(sock.local_addr()?)?;
            let mut buf = [0u8; MAX_DATAGRAM];
            while !flag.load(Ordering::Relaxed) {
                let Ok((_, from)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                let _ = sock.send_to(from.to_string().as_bytes(), from);
            }
            Ok(())
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(5))
            .context("the UDP echo did not bind")?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// From one UDP socket bound to `local_port` inside `ns`, asks each echo in `echoes` where the
/// datagram came from. `None` for an echo that did not answer within `bound` (resent every
/// 200 ms meanwhile, so one lost datagram does not count as blocked).
pub fn udp_mapped_from(
    ns: &str,
    local_port: u16,
    echoes: &[SocketAddr],
    bound: Duration,
) -> Result<Vec<Option<SocketAddr>>> {
    let echoes = echoes.to_vec();
    on_thread_in(ns, move || {
        let sock = UdpSocket::bind(("0.0.0.0", local_port))
            .with_context(|| format!("binding UDP port {local_port}"))?;
        sock.set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut seen = Vec::with_capacity(echoes.len());
        for echo in &echoes {
            seen.push(ask(&sock, *echo, bound)?);
        }
        Ok(seen)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the UDP probe thread panicked"))?
}

fn ask(sock: &UdpSocket, echo: SocketAddr, bound: Duration) -> Result<Option<SocketAddr>> {
    let deadline = Instant::now() + bound;
    let mut buf = [0u8; MAX_DATAGRAM];
    while Instant::now() < deadline {
        sock.send_to(b"where am i", echo)
            .with_context(|| format!("sending to {echo}"))?;
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        if from != echo {
            continue;
        }
        let text = std::str::from_utf8(&buf[..n]).context("the echo's answer is not text")?;
        let seen = text
            .parse()
            .with_context(|| format!("the echo answered `{text}`"))?;
        return Ok(Some(seen));
    }
    Ok(None)
}
