//! A relay connection over TCP with TLS, for networks that drop UDP: one thread per
//! connection owns the TLS stream, writes the frames queued for it ([`TCP_QUEUE`]; full =
//! dropped) and hands every frame it reads to the runtime. Frames on the stream are
//! length-prefixed (big-endian u16) and carry no magic. The certificate is checked against
//! `RelaySpec.tls_server_name` with the node's TLS trust (the CA file or pinned CA the API
//! uses).

use std::io::{self, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use plexsphere_wire::reach::relay::Frame;

/// How long the TCP connect may take.
pub const TCP_CONNECT: Duration = Duration::from_secs(5);
/// How long the TLS handshake may take once connected.
pub const TLS_HANDSHAKE: Duration = Duration::from_secs(10);
/// Frames waiting to be written, per connection.
pub const TCP_QUEUE: usize = 256;
/// How long a read waits before the thread writes what queued and looks at its stop flag.
const POLL: Duration = Duration::from_millis(20);
/// The most bytes read and not yet a whole frame (a frame is at most 2 + 65535).
const MAX_PENDING: usize = 2 + 65_535;

/// What the connection's thread reports.
#[derive(Debug)]
pub enum TcpEvent {
    Frame(Frame),
    /// The connection ended (the reason, for the journal).
    Closed(String),
}

/// One TCP+TLS connection to a relay; dropping it closes the connection.
pub struct TcpLink {
    tx: SyncSender<Vec<u8>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TcpLink {
    /// Connects on a thread of its own; `report` gets every frame and the end.
    pub fn open(
        addr: SocketAddr,
        server_name: String,
        tls: Arc<rustls::ClientConfig>,
        report: impl Fn(TcpEvent) + Send + 'static,
    ) -> io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(TCP_QUEUE);
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = thread::Builder::new()
            .name("reach-relay-tcp".into())
            .spawn(move || {
                let why = match run(addr, &server_name, tls, &rx, &s, &report) {
                    Ok(()) => "closed".to_owned(),
                    Err(e) => e,
                };
                report(TcpEvent::Closed(why));
            })?;
        Ok(Self {
            tx,
            stop,
            thread: Some(thread),
        })
    }

    /// Queues a frame; `false` when the queue is full (the frame is dropped).
    pub fn send(&self, frame: &Frame) -> bool {
        !matches!(
            self.tx.try_send(frame.to_stream()),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_))
        )
    }

    /// A sender for forwarders (stream-framed bytes).
    pub fn sender(&self) -> SyncSender<Vec<u8>> {
        self.tx.clone()
    }
}

impl Drop for TcpLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(
    addr: SocketAddr,
    server_name: &str,
    tls: Arc<rustls::ClientConfig>,
    rx: &Receiver<Vec<u8>>,
    stop: &AtomicBool,
    report: &dyn Fn(TcpEvent),
) -> Result<(), String> {
    let name = rustls_pki_types::ServerName::try_from(server_name.to_owned())
        .map_err(|e| format!("`{server_name}` is not a TLS server name ({e})"))?;
    let tcp = TcpStream::connect_timeout(&addr, TCP_CONNECT)
        .map_err(|e| format!("cannot connect to {addr} over TCP ({e})"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut conn = rustls::ClientConnection::new(tls, name)
        .map_err(|e| format!("cannot start TLS with {addr} ({e})"))?;
    tcp.set_read_timeout(Some(POLL))
        .map_err(|e| e.to_string())?;
    // The handshake first, within its own bound and looking at the stop flag: a frame written
    // while it ran made rustls finish it inside the write, where the loop's short read timeout
    // ended the link when the relay took longer than POLL to answer (a loaded host).
    let mut tcp = tcp;
    let give_up = Instant::now() + TLS_HANDSHAKE;
    while conn.is_handshaking() {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        match conn.complete_io(&mut tcp) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if Instant::now() >= give_up {
                    return Err(format!(
                        "the TLS handshake with {addr} took longer than {} s",
                        TLS_HANDSHAKE.as_secs()
                    ));
                }
            }
            Err(e) => return Err(format!("TLS handshake with {addr} failed ({e})")),
        }
    }
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    let mut pending: Vec<u8> = Vec::with_capacity(4096);
    let mut buf = vec![0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) {
        let mut wrote = false;
        while let Ok(bytes) = rx.try_recv() {
            stream
                .write_all(&bytes)
                .map_err(|e| format!("TLS write to {addr} failed ({e})"))?;
            wrote = true;
        }
        if wrote {
            stream
                .flush()
                .map_err(|e| format!("TLS write to {addr} failed ({e})"))?;
        }
        match stream.read(&mut buf) {
            Ok(0) => return Err(format!("{addr} closed the connection")),
            Ok(n) => {
                pending.extend_from_slice(&buf[..n]);
                if pending.len() > MAX_PENDING + buf.len() {
                    return Err(format!("{addr} sent more than a frame's worth of garbage"));
                }
                while pending.len() >= 2 {
                    let len = usize::from(u16::from_be_bytes([pending[0], pending[1]]));
                    if pending.len() < 2 + len {
                        break;
                    }
                    match Frame::decode(&pending[2..2 + len]) {
                        Ok(f) => report(TcpEvent::Frame(f)),
                        Err(e) => {
                            tracing::debug!(relay = %addr, "unreadable relay frame over TCP: {e}")
                        }
                    }
                    pending.drain(..2 + len);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(format!("TLS with {addr} failed ({e})")),
        }
    }
    Ok(())
}

/// For tests of relay links: a server config with a self-signed certificate for `relay.test`,
/// and a client config that trusts exactly that certificate.
#[cfg(test)]
pub(crate) fn relay_test_tls() -> (rustls::ServerConfig, rustls::ClientConfig) {
    let ck = rcgen::generate_simple_self_signed(vec!["relay.test".to_owned()])
        .expect("a self-signed certificate");
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let server = rustls::ServerConfig::builder_with_provider(plexsphere_tls_client::provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .expect("a server config");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).expect("a root");
    let client = rustls::ClientConfig::builder_with_provider(plexsphere_tls_client::provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    (server, client)
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    /// A TLS relay stand-in that waits `delay` before its side of the handshake, then answers
    /// each ping with a pong.
    fn slow_tls_echo(delay: Duration) -> (SocketAddr, Arc<rustls::ClientConfig>) {
        let (server, client) = relay_test_tls();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            thread::sleep(delay);
            let conn = rustls::ServerConnection::new(Arc::new(server)).unwrap();
            let mut s = rustls::StreamOwned::new(conn, tcp);
            let mut pending = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    return;
                }
                pending.extend_from_slice(&buf[..n]);
                while pending.len() >= 2 {
                    let len = usize::from(u16::from_be_bytes([pending[0], pending[1]]));
                    if pending.len() < 2 + len {
                        break;
                    }
                    if let Ok(Frame::Ping { nonce }) = Frame::decode(&pending[2..2 + len]) {
                        let _ = s.write_all(&Frame::Pong { nonce }.to_stream());
                    }
                    pending.drain(..2 + len);
                }
            }
        });
        (addr, Arc::new(client))
    }

    /// A frame queued at once, while a relay on a loaded host takes longer than the loop's
    /// read timeout (20 ms) to answer the handshake, goes out once it is done; it used to end
    /// the link ("TLS write failed: Resource temporarily unavailable").
    #[test]
    fn a_frame_queued_while_a_slow_relay_finishes_the_handshake_goes_out_after_it() {
        let (addr, tls) = slow_tls_echo(Duration::from_millis(300));
        let (tx, rx) = mpsc::channel();
        let link = TcpLink::open(addr, "relay.test".into(), tls, move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
        assert!(link.send(&Frame::Ping { nonce: [7; 8] }));
        let until = Instant::now() + Duration::from_secs(10);
        let event = rx
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .expect("an event from the link");
        assert!(
            matches!(event, TcpEvent::Frame(Frame::Pong { nonce }) if nonce == [7; 8]),
            "{event:?}"
        );
    }
}
