//! A TCP proxy for fault injection between plexd and plexsphere. It can pass bytes through,
//! refuse new connections (a server that is down), hold connections open while forwarding
//! nothing (a proxy that went silent), or flip one byte after every `"signature":"` in the
//! server's answers (a tampering middlebox). With TLS termination it presents the lab server
//! certificate to plexd and speaks TLS to plexsphere, so it sees the plaintext: it can cut only
//! the connections that pull the signed state, lose the answers to ingest batches (after the
//! server stored them) in any mode, and records every ingest batch it forwarded.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Pass = 0,
    /// Connections stay open but no byte moves in either direction.
    Silent = 1,
    /// The byte after each `"signature":"` from the server is changed.
    FlipSignatures = 2,
    /// New connections are closed at once; open ones are cut.
    Refuse = 3,
    /// A connection is cut when it sends a state pull (`GET .../state`); everything else
    /// passes. Only a TLS-terminating proxy sees the request line.
    RefuseStatePulls = 4,
    /// A replaying attacker (TLS-terminating only): a connection whose first request is a state
    /// pull gets the recorded state answer ([`Proxy::set_replay`]), one that opens the event
    /// stream gets the recorded frames and then keep-alives; everything else passes, and a
    /// state pull or stream later on a passing connection cuts it (so it comes back first).
    Replay = 5,
}

impl Mode {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Mode::Silent,
            2 => Mode::FlipSignatures,
            3 => Mode::Refuse,
            4 => Mode::RefuseStatePulls,
            5 => Mode::Replay,
            _ => Mode::Pass,
        }
    }
}

struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
}

#[derive(Clone)]
struct Shared {
    mode: Arc<AtomicU8>,
    upstream: Arc<Mutex<SocketAddr>>,
    connections: Arc<AtomicUsize>,
    flips: Arc<AtomicUsize>,
    /// Besides the mode: an ingest request reaches the server, but its connection is cut when
    /// the answer comes back (the server stored the batch, the node never hears so).
    lose_ingest_answers: Arc<AtomicBool>,
    lost_answers: Arc<AtomicUsize>,
    ingests: Arc<Mutex<Vec<IngestSeen>>>,
    replay: Arc<Mutex<Replay>>,
    tls: Option<Arc<Tls>>,
}

/// What [`Mode::Replay`] answers, and how often it did.
#[derive(Default)]
struct Replay {
    state_body: Vec<u8>,
    frames: Vec<u8>,
    states_served: usize,
    streams_served: usize,
}

/// An ingest batch the proxy forwarded to the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestSeen {
    pub batch_id: String,
    pub observations: usize,
}

/// A running proxy on 127.0.0.1; stops with its runtime when dropped.
pub struct Proxy {
    pub addr: SocketAddr,
    shared: Shared,
    _rt: tokio::runtime::Runtime,
}

const PATTERN: &[u8] = br#""signature":""#;

impl Proxy {
    /// A byte-for-byte TCP proxy.
    pub fn start(upstream: SocketAddr) -> Result<Self> {
        Self::start_inner(upstream, None)
    }

    /// A TLS-terminating proxy: serves `cert_chain`/`key` (PEM files) to clients and connects
    /// to the upstream over TLS trusting `ca` for the name `127.0.0.1`.
    pub fn start_tls(
        upstream: SocketAddr,
        cert_chain: &Path,
        key: &Path,
        ca: &Path,
    ) -> Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = CertificateDer::pem_file_iter(cert_chain)
            .context("reading the proxy's certificate chain")?
            .collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_file(key).context("reading the proxy's key")?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(ca)? {
            roots.add(c?)?;
        }
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tls = Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
        };
        Self::start_inner(upstream, Some(Arc::new(tls)))
    }

    fn start_inner(upstream: SocketAddr, tls: Option<Arc<Tls>>) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("building the proxy runtime")?;
        let shared = Shared {
            mode: Arc::new(AtomicU8::new(Mode::Pass as u8)),
            upstream: Arc::new(Mutex::new(upstream)),
            connections: Arc::new(AtomicUsize::new(0)),
            flips: Arc::new(AtomicUsize::new(0)),
            lose_ingest_answers: Arc::new(AtomicBool::new(false)),
            lost_answers: Arc::new(AtomicUsize::new(0)),
            ingests: Arc::new(Mutex::new(Vec::new())),
            replay: Arc::new(Mutex::new(Replay::default())),
            tls,
        };
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0"))?;
        let addr = listener.local_addr()?;
        let s = shared.clone();
        rt.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                s.connections.fetch_add(1, Ordering::SeqCst);
                if Mode::from_u8(s.mode.load(Ordering::SeqCst)) == Mode::Refuse {
                    drop(client);
                    continue;
                }
                let s = s.clone();
                tokio::spawn(async move {
                    let _ = s.connect(client).await;
                });
            }
        });
        Ok(Self {
            addr,
            shared,
            _rt: rt,
        })
    }

    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::SeqCst);
    }

    /// Points new connections at another upstream (a restarted server on a new port).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        if let Ok(mut u) = self.shared.upstream.lock() {
            *u = upstream;
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Signature bytes flipped so far.
    pub fn flips(&self) -> usize {
        self.shared.flips.load(Ordering::SeqCst)
    }

    /// Whether answers to ingest batches are lost from now on, whatever the mode (only a
    /// TLS-terminating proxy sees which requests are ingest batches).
    pub fn lose_ingest_answers(&self, lose: bool) {
        self.shared
            .lose_ingest_answers
            .store(lose, Ordering::SeqCst);
    }

    /// Ingest answers cut so far.
    pub fn lost_answers(&self) -> usize {
        self.shared.lost_answers.load(Ordering::SeqCst)
    }

    /// Every ingest batch forwarded so far, in order (TLS termination only).
    pub fn ingests(&self) -> Vec<IngestSeen> {
        self.shared
            .ingests
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    /// What [`Mode::Replay`] answers: a state pull's JSON body and the event stream's frames
    /// (recorded earlier from the real server).
    pub fn set_replay(&self, state_body: Vec<u8>, frames: Vec<u8>) {
        if let Ok(mut r) = self.shared.replay.lock() {
            r.state_body = state_body;
            r.frames = frames;
        }
    }

    /// How many (state answers, event streams) [`Mode::Replay`] served.
    pub fn replayed(&self) -> (usize, usize) {
        self.shared
            .replay
            .lock()
            .map_or((0, 0), |r| (r.states_served, r.streams_served))
    }

    /// The URL plexd should use to reach the upstream through this proxy.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

impl Shared {
    async fn connect(&self, client: TcpStream) -> std::io::Result<()> {
        let upstream = *self
            .upstream
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?;
        let server = TcpStream::connect(upstream).await?;
        match &self.tls {
            None => self.relay(client, server).await,
            Some(tls) => {
                let mut client = tls.acceptor.accept(client).await?;
                let name = ServerName::try_from("127.0.0.1")
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                let mut server = tls.connector.connect(name, server).await?;
                if Mode::from_u8(self.mode.load(Ordering::SeqCst)) == Mode::Replay {
                    let head = read_head(&mut client).await?;
                    if is_state_pull(&head) || is_stream_open(&head) {
                        return self.answer_replay(client, &head).await;
                    }
                    server.write_all(&head).await?;
                }
                self.relay(client, server).await
            }
        }
    }

    /// Answers a state pull or a stream opening from the recording, as a replaying attacker.
    async fn answer_replay<C: AsyncRead + AsyncWrite + Unpin>(
        &self,
        mut client: C,
        head: &[u8],
    ) -> std::io::Result<()> {
        let (body, frames) = {
            let mut r = self
                .replay
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?;
            if is_state_pull(head) {
                r.states_served += 1;
            } else {
                r.streams_served += 1;
            }
            (r.state_body.clone(), r.frames.clone())
        };
        if is_state_pull(head) {
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            client.write_all(answer.as_bytes()).await?;
            client.write_all(&body).await?;
            client.flush().await?;
            return client.shutdown().await;
        }
        client
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n")
            .await?;
        client.write_all(&frames).await?;
        client.flush().await?;
        // Keep-alives, so the node keeps the stream and does not call it stalled.
        while Mode::from_u8(self.mode.load(Ordering::SeqCst)) == Mode::Replay {
            client.write_all(b": keep-alive\n\n").await?;
            client.flush().await?;
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        client.shutdown().await
    }

    async fn relay<C, S>(&self, client: C, server: S) -> std::io::Result<()>
    where
        C: AsyncRead + AsyncWrite + Send + 'static,
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (mut cr, mut cw) = tokio::io::split(client);
        let (mut sr, mut sw) = tokio::io::split(server);
        let m_up = self.mode.clone();
        let ingests = self.ingests.clone();
        // Set when this connection carried an ingest request whose answer is to be lost.
        let lose = Arc::new(AtomicBool::new(false));
        let lose_up = lose.clone();
        let losing = self.lose_ingest_answers.clone();
        let up = async move {
            let mut buf = vec![0u8; 16 * 1024];
            let mut requests = Requests::default();
            loop {
                let n = cr.read(&mut buf).await?;
                if n == 0 {
                    return sw.shutdown().await;
                }
                if !gate(&m_up).await {
                    return Ok(());
                }
                let mode = Mode::from_u8(m_up.load(Ordering::SeqCst));
                if mode == Mode::RefuseStatePulls && is_state_pull(&buf[..n]) {
                    return Ok(());
                }
                if mode == Mode::Replay && (is_state_pull(&buf[..n]) || is_stream_open(&buf[..n])) {
                    return Ok(());
                }
                if losing.load(Ordering::SeqCst) && is_ingest(&buf[..n]) {
                    lose_up.store(true, Ordering::SeqCst);
                }
                if let Ok(mut seen) = ingests.lock() {
                    seen.extend(requests.feed(&buf[..n]));
                }
                sw.write_all(&buf[..n]).await?;
                sw.flush().await?;
            }
        };
        let mode = self.mode.clone();
        let flips = self.flips.clone();
        let lost_answers = self.lost_answers.clone();
        let down = async move {
            let mut buf = vec![0u8; 16 * 1024];
            let mut matched = 0usize;
            let mut flip_next = false;
            loop {
                let n = sr.read(&mut buf).await?;
                if n == 0 {
                    return cw.shutdown().await;
                }
                if !gate(&mode).await {
                    return Ok(());
                }
                if lose.load(Ordering::SeqCst) {
                    lost_answers.fetch_add(1, Ordering::SeqCst);
                    return Ok(());
                }
                if Mode::from_u8(mode.load(Ordering::SeqCst)) == Mode::FlipSignatures {
                    for b in &mut buf[..n] {
                        if flip_next {
                            // Another base64 character, so only the signature check catches it.
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
                cw.flush().await?;
            }
        };
        tokio::select! {
            r = up => r,
            r = down => r,
        }
    }
}

/// Holds the bytes while the proxy is silent; false when the connection must be cut.
async fn gate(mode: &AtomicU8) -> bool {
    loop {
        match Mode::from_u8(mode.load(Ordering::SeqCst)) {
            Mode::Silent => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            Mode::Refuse => return false,
            Mode::Pass | Mode::FlipSignatures | Mode::RefuseStatePulls | Mode::Replay => {
                return true;
            }
        }
    }
}

/// Whether a chunk from plexd starts with the request line `<method> /v1/nodes/<id><suffix>`
/// (`suffix` ends with the space before the HTTP version). hyper writes a request's head in one
/// piece, so the line is not split across chunks.
fn is_node_call(chunk: &[u8], method: &str, suffix: &str) -> bool {
    let line = chunk.split(|&b| b == b'\n').next().unwrap_or_default();
    let prefix = format!("{method} /v1/nodes/");
    line.starts_with(prefix.as_bytes())
        && line.windows(suffix.len()).any(|w| w == suffix.as_bytes())
}

fn is_state_pull(chunk: &[u8]) -> bool {
    is_node_call(chunk, "GET", "/state ")
}

fn is_stream_open(chunk: &[u8]) -> bool {
    is_node_call(chunk, "GET", "/events")
}

/// Reads a request head (up to the empty line, at most 16 KiB) from the client.
async fn read_head<C: AsyncRead + Unpin>(client: &mut C) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 || client.read(&mut byte).await? == 0 {
            return Err(std::io::Error::other("no request head"));
        }
        head.push(byte[0]);
    }
    Ok(head)
}

fn is_ingest(chunk: &[u8]) -> bool {
    is_node_call(chunk, "POST", "/ingest ")
}

/// The HTTP/1.1 requests of one connection, reassembled from its chunks (heads end with an
/// empty line, bodies are `Content-Length` long, as plexd's client sends them).
#[derive(Default)]
struct Requests {
    buf: Vec<u8>,
}

impl Requests {
    /// Adds a chunk; answers the ingest batches it completed.
    fn feed(&mut self, chunk: &[u8]) -> Vec<IngestSeen> {
        self.buf.extend_from_slice(chunk);
        let mut seen = Vec::new();
        while let Some(head_end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
            let length = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            let end = head_end + 4 + length;
            if self.buf.len() < end {
                break;
            }
            if is_ingest(head.as_bytes()) {
                let body: serde_json::Value =
                    serde_json::from_slice(&self.buf[head_end + 4..end]).unwrap_or_default();
                seen.push(IngestSeen {
                    batch_id: body["batch_id"].as_str().unwrap_or_default().to_owned(),
                    observations: body["observations"].as_array().map_or(0, Vec::len),
                });
            }
            self.buf.drain(..end);
        }
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::{IngestSeen, Requests, is_ingest, is_state_pull};

    #[test]
    fn ingest_batches_are_reassembled_across_chunks_and_requests() {
        let body = br#"{"batch_id":"b1","observations":[{"at":1},{"at":2}],"dropped":0}"#;
        let head = format!(
            "POST /v1/nodes/0192/ingest HTTP/1.1\r\ncontent-type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut r = Requests::default();
        assert!(is_ingest(head.as_bytes()));
        assert!(
            r.feed(b"POST /v1/nodes/0192/heartbeat HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}")
                .is_empty()
        );
        assert!(
            r.feed(head.as_bytes()).is_empty(),
            "the body is still missing"
        );
        assert_eq!(
            r.feed(body),
            vec![IngestSeen {
                batch_id: "b1".into(),
                observations: 2
            }]
        );
        assert!(r.buf.is_empty());
    }

    #[test]
    fn only_the_state_pull_request_line_matches() {
        assert!(is_state_pull(
            b"GET /v1/nodes/0192/state HTTP/1.1\r\nhost: x\r\n\r\n"
        ));
        assert!(!is_state_pull(
            b"GET /v1/nodes/0192/events HTTP/1.1\r\nx-state: /state \r\n\r\n"
        ));
        assert!(!is_state_pull(
            b"POST /v1/nodes/0192/heartbeat HTTP/1.1\r\n\r\n"
        ));
    }
}
