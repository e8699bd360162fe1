//! Pushes `GB` gigabytes (default 1) of 1452-byte WireGuard-sized frames from one UDP node to
//! another through a relay on loopback, then the same datagrams through a plain UDP forwarder
//! (the floor: a `recvmmsg`/`sendmmsg` loop that rewrites nothing and sends everything from A
//! on to B), then directly, and prints the relay's and the floor's CPU-seconds per GB
//! forwarded, their ratio, and the three rates. A window of frames in flight keeps the sender
//! from overrunning the socket buffers, so the figures are about the forwarders, not about loss.
//!
//! `cargo run --release -p plexsphere-relay --example relay_bench [GB]`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
        node_id: uuid::Uuid::from_bytes(node.0[..16].try_into().unwrap()),
        public_key: node.to_base64(),
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

/// CPU ticks (utime + stime) of this process's threads whose name starts with `name`, together
/// (the relay runs one UDP thread a core: `relay-udp-0`, `relay-udp-1`, ...).
fn thread_ticks(name: &str) -> u64 {
    let mut ticks = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let path = task.unwrap().path();
        let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        if comm.trim().starts_with(name) {
            let stat = std::fs::read_to_string(path.join("stat")).unwrap();
            let after = &stat[stat.rfind(')').unwrap() + 2..];
            let f: Vec<&str> = after.split(' ').collect();
            ticks += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        }
    }
    ticks
}

/// Datagrams per `recvmmsg`/`sendmmsg` of the floor: the relay's batch.
const FLOOR_BATCH: usize = 32;

/// The floor: a thread named `floor-fwd` that forwards every datagram arriving at `socket`
/// unchanged to `to`, `FLOOR_BATCH` at a time, until `stop`; counts the datagrams' bytes past
/// the relay head (what the relay counts as forwarded) in `forwarded`.
fn floor(
    socket: UdpSocket,
    to: SocketAddr,
    stop: Arc<AtomicBool>,
    forwarded: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};
    use std::io::{IoSlice, IoSliceMut};
    use std::os::fd::AsRawFd as _;

    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    std::thread::Builder::new()
        .name("floor-fwd".into())
        .spawn(move || {
            let fd = socket.as_raw_fd();
            let mut slots = vec![vec![0u8; 2048]; FLOOR_BATCH];
            let mut lens = Vec::with_capacity(FLOOR_BATCH);
            let dest = vec![Some(SockaddrStorage::from(to)); FLOOR_BATCH];
            let mut rx = MultiHeaders::<SockaddrStorage>::preallocate(FLOOR_BATCH, None);
            let mut tx = MultiHeaders::<SockaddrStorage>::preallocate(FLOOR_BATCH, None);
            while !stop.load(Ordering::Relaxed) {
                lens.clear();
                {
                    let mut iovs: Vec<[IoSliceMut<'_>; 1]> = slots
                        .iter_mut()
                        .map(|s| [IoSliceMut::new(s.as_mut_slice())])
                        .collect();
                    match recvmmsg(fd, &mut rx, iovs.iter_mut(), MsgFlags::MSG_WAITFORONE, None) {
                        Ok(got) => lens.extend(got.map(|r| r.bytes)),
                        Err(_) => continue,
                    }
                }
                let iovs: Vec<[IoSlice<'_>; 1]> = lens
                    .iter()
                    .enumerate()
                    .map(|(i, &len)| [IoSlice::new(&slots[i][..len])])
                    .collect();
                if let Ok(sent) = sendmmsg(
                    fd,
                    &mut tx,
                    iovs.iter(),
                    &dest[..iovs.len()],
                    [],
                    MsgFlags::empty(),
                ) {
                    let n = sent.count();
                    let bytes: usize = lens[..n].iter().map(|l| l - HEAD).sum();
                    forwarded.fetch_add(bytes as u64, Ordering::Relaxed);
                }
            }
        })
        .unwrap()
}

const HEAD: usize = plexsphere_wire::reach::relay::UDP_DATA_HEAD;

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

    let ticks0 = thread_ticks("relay-udp");
    let (rate, _) = push(&a, relay_addr, b.try_clone().unwrap(), &datagram, frames);
    let ticks = thread_ticks("relay-udp") - ticks0;
    let stats = relay.stats();
    let forwarded_gb = stats.forwarded_bytes as f64 / 1e9;
    let cpu = ticks as f64 / 100.0;
    let per_gb = cpu / forwarded_gb.max(1e-9);

    // The floor: the same datagrams through a forwarder that only forwards.
    let b_addr = b.local_addr().unwrap();
    let fwd = UdpSocket::bind("127.0.0.1:0").unwrap();
    let fwd_addr = fwd.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let floor_bytes = Arc::new(AtomicU64::new(0));
    let floor_thread = floor(fwd, b_addr, stop.clone(), floor_bytes.clone());
    let floor_ticks0 = thread_ticks("floor-fwd");
    let (floor_rate, _) = push(&a, fwd_addr, b.try_clone().unwrap(), &datagram, frames);
    let floor_cpu = (thread_ticks("floor-fwd") - floor_ticks0) as f64 / 100.0;
    stop.store(true, Ordering::Relaxed);
    floor_thread.join().unwrap();
    let floor_gb = floor_bytes.load(Ordering::Relaxed) as f64 / 1e9;
    let floor_per_gb = floor_cpu / floor_gb.max(1e-9);

    let plain = vec![4u8; FRAME];
    let (direct, _) = push(&a, b_addr, b, &plain, frames);

    println!("frames sent: {frames} x {FRAME} bytes ({gb} GB)");
    println!(
        "relay forwarded: {:.3} GB ({} frames)",
        forwarded_gb, stats.forwarded_frames
    );
    println!("relay UDP threads CPU: {cpu:.2} s = {per_gb:.2} CPU-seconds per GB forwarded");
    println!(
        "floor forwarded: {floor_gb:.3} GB; its thread's CPU: {floor_cpu:.2} s = {floor_per_gb:.2} CPU-seconds per GB"
    );
    println!(
        "relay / floor CPU per GB: {:.2}x (the goal: at most 1.5x)",
        per_gb / floor_per_gb.max(1e-9)
    );
    println!(
        "through the relay: {rate:.2} Gbit/s; through the floor: {floor_rate:.2} Gbit/s; direct: {direct:.2} Gbit/s (relay {:.0}% of direct)",
        100.0 * rate / direct
    );
    relay.shutdown().await;
}
