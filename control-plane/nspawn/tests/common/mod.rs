//! Shared by the root tests: the host check (fail under CI, skip elsewhere), a guard that
//! leaves nothing behind even when an assert fails, and a tiny HTTP server on the bridge.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use plexsphere_test_support::machines::Leftovers;

/// The image cache CI keeps between runs.
pub const IMAGE_CACHE: &str = plexsphere_nspawn::DEFAULT_IMAGE_CACHE;

pub use plexsphere_nspawn::testing::host_ready;

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "plexsphere_nspawn=info".into()),
        )
        .try_init();
}

/// A state dir of the test's own whose machines are destroyed, and whose bridge is removed,
/// when dropped (then the dir itself goes).
pub struct Cleanup {
    /// Declared first: fields drop in order, so the machines go before their state dir.
    leftovers: Leftovers,
    state: tempfile::TempDir,
}

impl Cleanup {
    pub fn new(bridge: &str) -> Cleanup {
        let state = tempfile::Builder::new()
            .prefix("plexsphere-nspawn-test-")
            .tempdir_in("/var/tmp")
            .expect("a state dir in /var/tmp");
        Cleanup {
            leftovers: Leftovers::new(state.path(), bridge),
            state,
        }
    }

    pub fn dir(&self) -> &Path {
        self.state.path()
    }
}

/// One request seen by [`serve_http`]: who sent it and its request line.
#[derive(Debug)]
pub struct Seen {
    pub peer: IpAddr,
    pub request_line: String,
}

/// Serves `HTTP/1.1 200` with `body` to every connection on `addr`, reporting each request.
pub fn serve_http(addr: SocketAddr, body: &'static str) -> (SocketAddr, mpsc::Receiver<Seen>) {
    let listener = TcpListener::bind(addr).expect("bind on the bridge address");
    let local = listener.local_addr().expect("local addr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let line = String::from_utf8_lossy(&head)
                .lines()
                .next()
                .unwrap_or_default()
                .to_string();
            let reply = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(reply.as_bytes());
            if let Ok(peer) = stream.peer_addr() {
                let _ = tx.send(Seen {
                    peer: peer.ip(),
                    request_line: line,
                });
            }
        }
    });
    (local, rx)
}

pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect()
}
