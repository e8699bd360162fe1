//! A relay connection over TCP with TLS, for networks that drop UDP: per connection a writer
//! thread sends the frames queued for it (one [`LinkQueue`], bounded by
//! `plexd_dataplane::relay_link::LINK_QUEUE_BYTES`; full = dropped) as soon as they queue,
//! everything waiting taken in one swap and sealed in full TLS records, and a reader thread
//! hands every frame it reads to the runtime, except the `recv`s carrying WireGuard for peers
//! the userspace data plane carries on this link: those go straight to the data plane through
//! its [`LinkDoor`] (opened on the reader's thread, no hop through the runtime). The data
//! plane queues its relayed datagrams on the same queue. The two threads share the TLS state,
//! each only to encrypt or decrypt. Frames on the stream are
//! length-prefixed (big-endian u16) and carry no magic. The certificate is checked against
//! `RelaySpec.tls_server_name` with the node's TLS trust (the CA file or pinned CA the API
//! uses).

use std::io::{self, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use plexd_dataplane::relay_link::Taken;
use plexd_dataplane::{LinkDoor, LinkInbox, LinkQueue};
use plexsphere_wire::reach::relay::Frame;

/// How long the TCP connect may take.
pub const TCP_CONNECT: Duration = Duration::from_secs(5);
/// How long the TLS handshake may take once connected.
pub const TLS_HANDSHAKE: Duration = Duration::from_secs(10);
/// How long the reader's read and the writer's wait for the queue last before each looks at
/// its stop flag (a dropped link ends within it).
const POLL: Duration = Duration::from_millis(20);
/// The most bytes one read of the socket takes.
const READ_BATCH: usize = 64 * 1024;
/// The plaintext of one full TLS record.
const TLS_RECORD: usize = 16 * 1024;
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
    queue: Arc<LinkQueue>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Where the link's reader hands what it reads.
struct Readers<'a> {
    report: &'a dyn Fn(TcpEvent),
    /// The userspace data plane's door, when it carries peers on links.
    door: Option<LinkDoor>,
    queue: &'a LinkQueue,
}

impl TcpLink {
    /// Connects on a thread of its own; `report` gets every frame and the end, except the
    /// WireGuard `recv`s `door` (the userspace data plane's, when there is one) takes.
    pub fn open(
        addr: SocketAddr,
        server_name: String,
        tls: Arc<rustls::ClientConfig>,
        door: Option<LinkDoor>,
        report: impl Fn(TcpEvent) + Send + 'static,
    ) -> io::Result<Self> {
        let queue = LinkQueue::new();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, q) = (stop.clone(), queue.clone());
        let thread = thread::Builder::new()
            .name("reach-relay-tcp".into())
            .spawn(move || {
                let readers = Readers {
                    report: &report,
                    door,
                    queue: &q,
                };
                let why = match run(addr, &server_name, tls, &readers, &s) {
                    Ok(()) => "closed".to_owned(),
                    Err(e) => e,
                };
                // Nothing more goes out: the data plane's endpoints on this link are gone.
                q.close();
                report(TcpEvent::Closed(why));
            })?;
        Ok(Self {
            queue,
            stop,
            thread: Some(thread),
        })
    }

    /// Queues a frame; `false` when the queue is full or the link ended (the frame is
    /// dropped).
    pub fn send(&self, frame: &Frame) -> bool {
        self.queue.push(&frame.to_stream())
    }

    /// The link's queue: for the data plane's relay endpoints on this link, and for
    /// forwarders (stream-framed bytes).
    pub fn queue(&self) -> &Arc<LinkQueue> {
        &self.queue
    }
}

impl Drop for TcpLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.queue.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(
    addr: SocketAddr,
    server_name: &str,
    tls: Arc<rustls::ClientConfig>,
    readers: &Readers<'_>,
    stop: &AtomicBool,
) -> Result<(), String> {
    let queue = readers.queue;
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
    // Full duplex from here: the writer sends what queued as soon as it queued, the reader
    // waits for the relay; they share the TLS state, each holding it only to encrypt or
    // decrypt, never across the socket's I/O.
    let conn = Mutex::new(conn);
    let writer_tcp = tcp
        .try_clone()
        .map_err(|e| format!("cannot share the TCP connection to {addr} ({e})"))?;
    let ended = AtomicBool::new(false);
    let (conn, ended) = (&conn, &ended);
    thread::scope(|scope| {
        let writer = thread::Builder::new()
            .name("reach-relay-tcp-w".into())
            .spawn_scoped(scope, move || {
                let r = write_loop(addr, conn, writer_tcp, queue, stop, ended);
                ended.store(true, Ordering::Relaxed);
                r
            })
            .map_err(|e| format!("cannot start the link's writer ({e})"))?;
        let read = read_loop(addr, conn, tcp, stop, ended, readers);
        ended.store(true, Ordering::Relaxed);
        let wrote = writer
            .join()
            .unwrap_or_else(|_| Err("the link's writer panicked".to_owned()));
        // The first failure is the reason; a clean stop on both sides is no failure.
        read.and(wrote)
    })
}

/// Writes what the queue holds: every frame waiting, taken in one swap, as one plaintext
/// write, so TLS makes records of up to 16 KiB and the socket gets one write, not a record
/// and a system call per frame.
fn write_loop(
    addr: SocketAddr,
    conn: &Mutex<rustls::ClientConnection>,
    mut tcp: TcpStream,
    queue: &LinkQueue,
    stop: &AtomicBool,
    ended: &AtomicBool,
) -> Result<(), String> {
    let mut batch: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut sealed: Vec<u8> = Vec::with_capacity(64 * 1024);
    while !stop.load(Ordering::Relaxed) && !ended.load(Ordering::Relaxed) {
        // Idle: still send what the reader's side left (below).
        if queue.take(&mut batch, POLL) == Taken::Closed {
            // The link was dropped: nothing more to write.
            return Ok(());
        }
        sealed.clear();
        {
            let mut conn = lock(conn);
            // A record's worth at a time, each taken out sealed before the next: rustls holds
            // at most 64 KiB of sealed bytes and refuses plaintext past that.
            for record in batch.chunks(TLS_RECORD) {
                conn.writer()
                    .write_all(record)
                    .map_err(|e| format!("TLS write to {addr} failed ({e})"))?;
                take_sealed(&mut conn, &mut sealed, addr)?;
            }
            // Also what the reader's side left to send (a TLS alert or key update).
            take_sealed(&mut conn, &mut sealed, addr)?;
        }
        if !sealed.is_empty() {
            tcp.write_all(&sealed)
                .map_err(|e| format!("TCP write to {addr} failed ({e})"))?;
        }
    }
    Ok(())
}

/// Moves what TLS sealed into `sealed`, for the socket.
fn take_sealed(
    conn: &mut rustls::ClientConnection,
    sealed: &mut Vec<u8>,
    addr: SocketAddr,
) -> Result<(), String> {
    while conn.wants_write() {
        conn.write_tls(sealed)
            .map_err(|e| format!("TLS write to {addr} failed ({e})"))?;
    }
    Ok(())
}

/// Reads what the relay sends, decrypts it and hands every whole frame to the data plane's
/// door (the WireGuard `recv`s it takes, a batch per read) or to `report`.
fn read_loop(
    addr: SocketAddr,
    conn: &Mutex<rustls::ClientConnection>,
    mut tcp: TcpStream,
    stop: &AtomicBool,
    ended: &AtomicBool,
    readers: &Readers<'_>,
) -> Result<(), String> {
    let mut inbox = LinkInbox::new();
    let mut pending: Vec<u8> = Vec::with_capacity(4096);
    // Up to four TLS records a read: the data plane gets the recvs of one read in one
    // hand-over (fewer, larger TUN writes).
    let mut buf = vec![0u8; READ_BATCH];
    let mut plain = vec![0u8; READ_BATCH];
    while !stop.load(Ordering::Relaxed) && !ended.load(Ordering::Relaxed) {
        let n = match tcp.read(&mut buf) {
            Ok(0) => return Err(format!("{addr} closed the connection")),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) => return Err(format!("TCP read from {addr} failed ({e})")),
        };
        {
            let mut conn = lock(conn);
            let mut input = &buf[..n];
            while !input.is_empty() {
                conn.read_tls(&mut input)
                    .map_err(|e| format!("TLS with {addr} failed ({e})"))?;
                let state = conn
                    .process_new_packets()
                    .map_err(|e| format!("TLS with {addr} failed ({e})"))?;
                if state.peer_has_closed() && state.plaintext_bytes_to_read() == 0 {
                    return Err(format!("{addr} closed the connection"));
                }
                loop {
                    match conn.reader().read(&mut plain) {
                        Ok(0) => break,
                        Ok(m) => pending.extend_from_slice(&plain[..m]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(format!("TLS with {addr} failed ({e})")),
                    }
                }
            }
        }
        if pending.len() > MAX_PENDING + plain.len() {
            return Err(format!("{addr} sent more than a frame's worth of garbage"));
        }
        // The data plane's hand for this read's WireGuard recvs, when it carries peers here.
        let hand = readers.door.as_ref().and_then(|d| d.hand(readers.queue));
        let mut at = 0;
        while pending.len() - at >= 2 {
            let len = usize::from(u16::from_be_bytes([pending[at], pending[at + 1]]));
            if pending.len() - at < 2 + len {
                break;
            }
            let body = &pending[at + 2..at + 2 + len];
            at += 2 + len;
            if let Some(hand) = &hand
                && hand.offer(&mut inbox, body)
            {
                continue;
            }
            match Frame::decode(body) {
                Ok(f) => (readers.report)(TcpEvent::Frame(f)),
                Err(e) => {
                    tracing::debug!(relay = %addr, "unreadable relay frame over TCP: {e}")
                }
            }
        }
        pending.drain(..at);
        if let Some(hand) = &hand {
            hand.flush(&mut inbox);
        }
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
    use std::sync::mpsc;

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
        let link = TcpLink::open(addr, "relay.test".into(), tls, None, move |e| {
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

    /// Sending and receiving at once (the reader decrypting the relay's answers while the
    /// writer encrypts the next frames, both on the one TLS state): every frame goes out and
    /// every answer comes back, in order, with neither side waiting on the other.
    #[test]
    fn frames_sent_while_the_answers_stream_back_all_arrive_in_order() {
        const FRAMES: u64 = 2_000;
        let (addr, tls) = slow_tls_echo(Duration::ZERO);
        let (tx, rx) = mpsc::channel();
        let link = TcpLink::open(addr, "relay.test".into(), tls, None, move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
        let mut received = Vec::new();
        let until = Instant::now() + Duration::from_secs(30);
        for i in 0..FRAMES {
            // A full queue (the link's bound) drops the frame: send it again once answers
            // drained some, as a sender that must not lose it would.
            while !link.send(&Frame::Ping {
                nonce: i.to_be_bytes(),
            }) {
                assert!(Instant::now() < until, "the queue stayed full");
                while let Ok(e) = rx.recv_timeout(Duration::from_millis(1)) {
                    received.push(e);
                }
            }
        }
        while received.len() < FRAMES as usize {
            let left = until.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(e) => received.push(e),
                Err(_) => panic!("{} of {FRAMES} answers came back", received.len()),
            }
        }
        for (i, e) in received.iter().enumerate() {
            let want = (i as u64).to_be_bytes();
            assert!(
                matches!(e, TcpEvent::Frame(Frame::Pong { nonce }) if *nonce == want),
                "answer {i}: {e:?}"
            );
        }
    }

    /// A burst of full-size relayed datagrams queued at once (here while the handshake runs,
    /// so the writer finds them all waiting) goes out whole: rustls takes at most 64 KiB of
    /// plaintext before its records are taken out, and a batch past that once ended the link
    /// ("failed to write whole buffer"), which is what made TCP relaying carry next to nothing.
    #[test]
    fn a_burst_larger_than_tls_s_send_buffer_goes_out_and_the_link_stays_up() {
        let (addr, tls) = slow_tls_echo(Duration::from_millis(300));
        let (tx, rx) = mpsc::channel();
        let link = TcpLink::open(addr, "relay.test".into(), tls, None, move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
        let datagram = Frame::Send {
            dst: [1; 8],
            payload: vec![0x5A; 1_400],
        };
        // 200 x 1.4 kB: about 280 kB, four times the TLS send buffer.
        for _ in 0..200 {
            assert!(link.send(&datagram), "the queue holds 1 MiB");
        }
        assert!(link.send(&Frame::Ping { nonce: [9; 8] }));
        let event = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("an event from the link");
        assert!(
            matches!(event, TcpEvent::Frame(Frame::Pong { nonce }) if nonce == [9; 8]),
            "{event:?}"
        );
    }
}
