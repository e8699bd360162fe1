//! A TCP proxy for fault injection between plexd and plexsphere: it can pass bytes through,
//! hold connections open while forwarding nothing (a proxy that went silent), or flip one
//! byte after every `"signature":"` it sees in the server's answers (a tampering middlebox).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Pass = 0,
    /// Connections stay open but no byte moves in either direction.
    Silent = 1,
    /// The byte after each `"signature":"` from the server is changed.
    FlipSignatures = 2,
}

impl Mode {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Mode::Silent,
            2 => Mode::FlipSignatures,
            _ => Mode::Pass,
        }
    }
}

/// A running proxy on 127.0.0.1; stops with its runtime when dropped.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: Arc<AtomicU8>,
    connections: Arc<AtomicUsize>,
    flips: Arc<AtomicUsize>,
    _rt: tokio::runtime::Runtime,
}

const PATTERN: &[u8] = br#""signature":""#;

impl Proxy {
    pub fn start(upstream: SocketAddr) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("building the proxy runtime")?;
        let mode = Arc::new(AtomicU8::new(Mode::Pass as u8));
        let connections = Arc::new(AtomicUsize::new(0));
        let flips = Arc::new(AtomicUsize::new(0));
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0"))?;
        let addr = listener.local_addr()?;
        let (m, c, f) = (mode.clone(), connections.clone(), flips.clone());
        rt.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let (m, f) = (m.clone(), f.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        let _ = relay(client, server, m, f).await;
                    }
                });
            }
        });
        Ok(Self {
            addr,
            mode,
            connections,
            flips,
            _rt: rt,
        })
    }

    pub fn set_mode(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Signature bytes flipped so far.
    pub fn flips(&self) -> usize {
        self.flips.load(Ordering::SeqCst)
    }
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    mode: Arc<AtomicU8>,
    flips: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let m_up = mode.clone();
    let up = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = cr.read(&mut buf).await?;
            if n == 0 {
                return sw.shutdown().await;
            }
            wait_unless_silent(&m_up).await;
            sw.write_all(&buf[..n]).await?;
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 16 * 1024];
        let mut matched = 0usize;
        let mut flip_next = false;
        loop {
            let n = sr.read(&mut buf).await?;
            if n == 0 {
                return cw.shutdown().await;
            }
            wait_unless_silent(&mode).await;
            if Mode::from_u8(mode.load(Ordering::SeqCst)) == Mode::FlipSignatures {
                for b in &mut buf[..n] {
                    if flip_next {
                        // Another base64 character, so only the signature check can catch it.
                        *b = if *b == b'A' { b'B' } else { b'A' };
                        flip_next = false;
                        flips.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    if *b == PATTERN[matched] {
                        matched += 1;
                        if matched == PATTERN.len() {
                            matched = 0;
                            flip_next = true;
                        }
                    } else {
                        matched = usize::from(*b == PATTERN[0]);
                    }
                }
            }
            cw.write_all(&buf[..n]).await?;
        }
    };
    tokio::select! {
        r = up => r,
        r = down => r,
    }
}

/// While the proxy is silent, hold the bytes (and the connection) without forwarding them.
async fn wait_unless_silent(mode: &AtomicU8) {
    while Mode::from_u8(mode.load(Ordering::SeqCst)) == Mode::Silent {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
