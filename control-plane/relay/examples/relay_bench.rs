//! Pushes `GB` gigabytes (default 1) of 1452-byte WireGuard-sized frames from one UDP node to
//! another through a relay on loopback, then the same directly, and prints the relay thread's
//! CPU-seconds per GB forwarded and both rates. A window of frames in flight keeps the sender
//! from overrunning the socket buffers, so the figures are about the relay, not about loss.
//!
//! `cargo run --release -p plexsphere-relay --example relay_bench [GB]`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plexsphere_relay::{Limits, RelayConfig};
use plexsphere_wire::reach::relay::{Frame, RelayToken};
use plexsphere_wire::signed::{DomainSigner, SignContext};

const FRAME: usize = 1452;
const WINDOW: u64 = 128;
const RELAY_SK: [u8; 32] = [0x42; 32];

fn register(sock: &UdpSocket, relay: SocketAddr, sk: [u8; 32], signer: &DomainSigner) {
    let node = plexsphere_wire::reach::public_key(&sk);
    let mut buf = [0u8; 2048];
    sock.send_to(&Frame::Hello { node }.to_datagram(), relay)
        .unwrap();
    let (n, _) = sock.recv_from(&mut buf).unwrap();
    let Ok(Frame::Challenge { cookie }) = Frame::from_datagram(&buf[..n]) else {
        panic!("no challenge")
    };
    let shared =
        plexsphere_wire::reach::shared_secret(&sk, &plexsphere_wire::reach::public_key(&RELAY_SK));
    let token = RelayToken {
        domain_id: uuid::Uuid::nil(),
        // One node id a key: relays keep one registration a node id.
        node_id: uuid::Uuid::from_bytes(node[..16].try_into().unwrap()),
        public_key: STANDARD.encode(node),
        expires_at: time::OffsetDateTime::now_utc().unix_timestamp() + 600,
        key_generation: 1,
    };
    let token = serde_json::to_vec(&signer.sign(SignContext::RelayToken, &token).unwrap()).unwrap();
    let frame = Frame::Register {
        node,
        cookie,
        proof: plexsphere_wire::reach::relay::proof(&shared, &cookie, &node),
        token,
    };
    sock.send_to(&frame.to_datagram(), relay).unwrap();
    let (n, _) = sock.recv_from(&mut buf).unwrap();
    assert!(matches!(
        Frame::from_datagram(&buf[..n]),
        Ok(Frame::Registered { .. })
    ));
}

/// CPU ticks (utime + stime) of this process's thread named `name`.
fn thread_ticks(name: &str) -> Option<u64> {
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path();
        let comm = std::fs::read_to_string(path.join("comm")).ok()?;
        if comm.trim() == name {
            let stat = std::fs::read_to_string(path.join("stat")).ok()?;
            let after = &stat[stat.rfind(')')? + 2..];
            let f: Vec<&str> = after.split(' ').collect();
            return Some(f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?);
        }
    }
    None
}

/// Sends `frames` datagrams from `tx` to `to`, `recv` counts them at `rx`; the rate in Gbit/s.
fn push(tx: &UdpSocket, to: SocketAddr, rx: UdpSocket, datagram: &[u8], frames: u64) -> (f64, u64) {
    let got = Arc::new(AtomicU64::new(0));
    let counter = got.clone();
    rx.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while let Ok((_n, _)) = rx.recv_from(&mut buf) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    let start = Instant::now();
    let mut sent = 0u64;
    let mut stalled = Instant::now();
    while sent < frames {
        let done = got.load(Ordering::Relaxed);
        if sent - done < WINDOW {
            tx.send_to(datagram, to).unwrap();
            sent += 1;
            stalled = Instant::now();
        } else if stalled.elapsed() > Duration::from_millis(20) {
            // A lost datagram: give the window back rather than wait forever.
            got.fetch_add(1, Ordering::Relaxed);
            stalled = Instant::now();
        } else {
            std::thread::yield_now();
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    reader.join().unwrap();
    let bits = (frames * FRAME as u64 * 8) as f64;
    (bits / elapsed / 1e9, sent)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let gb: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1.0);
    let frames = (gb * 1e9 / FRAME as f64) as u64;
    let signer = DomainSigner::from_seed(&[7; 32]).unwrap();
    let relay = plexsphere_relay::start(RelayConfig {
        name: "bench".into(),
        secret_key: RELAY_SK,
        udp: Some("127.0.0.1:0".parse().unwrap()),
        tls: None,
        domain_keys: vec![signer.public_key_b64()],
        limits: Limits {
            node_frames_per_sec: 0,
            node_bytes_per_sec: 0,
            ..Limits::default()
        },
    })
    .await
    .unwrap();
    let relay_addr = relay.udp_addr.unwrap();
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    a.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    register(&a, relay_addr, [1; 32], &signer);
    register(&b, relay_addr, [2; 32], &signer);
    let dst = plexsphere_wire::reach::public_key(&[2; 32]);

    // A `send` whose datagram is 1452 bytes of WireGuard.
    let mut datagram = Vec::with_capacity(plexsphere_wire::reach::relay::UDP_DATA_HEAD + FRAME);
    datagram.extend_from_slice(&plexsphere_wire::reach::RELAY_MAGIC);
    Frame::Send {
        dst: plexsphere_wire::reach::relay::prefix(&dst),
        payload: vec![4; FRAME],
    }
    .encode_into(&mut datagram);

    let ticks0 = thread_ticks("relay-udp").unwrap_or(0);
    let (rate, _) = push(&a, relay_addr, b.try_clone().unwrap(), &datagram, frames);
    let ticks = thread_ticks("relay-udp").unwrap_or(0) - ticks0;
    let stats = relay.stats();
    let forwarded_gb = stats.forwarded_bytes as f64 / 1e9;
    let cpu = ticks as f64 / 100.0;

    let b_addr = b.local_addr().unwrap();
    let plain = vec![4u8; FRAME];
    let (direct, _) = push(&a, b_addr, b, &plain, frames);

    println!("frames sent: {frames} x {FRAME} bytes ({gb} GB)");
    println!(
        "relay forwarded: {:.3} GB ({} frames)",
        forwarded_gb, stats.forwarded_frames
    );
    println!(
        "relay thread CPU: {cpu:.2} s = {:.2} CPU-seconds per GB forwarded",
        cpu / forwarded_gb.max(1e-9)
    );
    println!(
        "through the relay: {rate:.2} Gbit/s; direct: {direct:.2} Gbit/s ({:.0}%)",
        100.0 * rate / direct
    );
    relay.shutdown().await;
}
