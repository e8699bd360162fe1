//! The TCP side, with TLS: the same frames as UDP, each after its big-endian u16 length. Per
//! connection a reader (frames in, with the idle timeout; every whole frame of a read handled
//! at once and the `recv`s for UDP nodes sent in one batch, `crate::tcp_in`) and a writer that drains a bounded
//! queue ([`TCP_QUEUE_FRAMES`]) into one buffer of up to [`TCP_WRITE_BATCH`] bytes a write; a
//! frame for a full queue is dropped and counted, so a reader that does not keep up costs
//! bounded memory and never slows the senders.
//!
//! Strangers get little: a connection is counted against its source address (IPv6: /64) at
//! accept and closed there, before any TLS work, when that source holds
//! `--max-tcp-per-source` already; until it registers only `hello` and `register` are
//! handled (the rest is dropped and counted, a `ping` gets no `pong`), and one that has not
//! registered within `--tcp-register-within-secs` of its accept is closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::limits::{
    MAX_STREAM_FRAME, TCP_IDLE_TIMEOUT, TCP_QUEUE_FRAMES, TCP_WRITE_BATCH, TLS_HANDSHAKE_TIMEOUT,
};
use crate::shared::Shared;
use crate::tcp_in::{BadFrame, Inbound};

/// What every connection gets: the TLS acceptor and the registration deadline.
#[derive(Clone)]
pub(crate) struct Accept {
    pub(crate) acceptor: TlsAcceptor,
    pub(crate) register_within: Duration,
}

pub(crate) async fn accept_loop(
    listener: TcpListener,
    accept: Accept,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        match accepted {
            Ok((stream, addr)) => {
                let register_by = Instant::now() + accept.register_within;
                shared.counters.tcp_accepted.inc();
                let (tx, rx) = mpsc::channel::<Vec<u8>>(TCP_QUEUE_FRAMES);
                // Counted here, before a task or a handshake, so a flood of connections from
                // one source costs no TLS work past its cap and leaves the others their room.
                let Some(id) = shared
                    .core()
                    .handle_tcp_open(tx, addr, std::time::Instant::now())
                else {
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let conn = Conn {
                    addr,
                    id,
                    register_by,
                };
                tokio::spawn(connection(
                    stream,
                    conn,
                    rx,
                    accept.acceptor.clone(),
                    shared.clone(),
                    stop.clone(),
                ));
            }
            Err(e) => {
                // Out of file descriptors and the like: say so, wait a moment, go on.
                tracing::warn!(error = %e, "cannot accept a TCP connection");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum Closed {
    #[error("the node closed it")]
    Eof,
    #[error("no frame within the idle timeout (or the TLS handshake timeout)")]
    Idle,
    #[error("not registered within --tcp-register-within-secs of its accept")]
    Unregistered,
    #[error("{0}")]
    Io(std::io::Error),
    #[error("a frame of {0} bytes, over the limit of {MAX_STREAM_FRAME}")]
    TooLong(usize),
    #[error("a frame that does not decode")]
    Malformed,
}

/// One accepted connection: where from, its number, and when it must have registered.
struct Conn {
    addr: SocketAddr,
    id: crate::core::ConnId,
    register_by: Instant,
}

async fn connection(
    stream: TcpStream,
    conn: Conn,
    rx: mpsc::Receiver<Vec<u8>>,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let (addr, id) = (conn.addr, conn.id);
    let result = tokio::select! {
        r = serve(stream, &conn, acceptor, &shared, rx) => r,
        _ = stop.changed() => Ok(Closed::Eof),
    };
    shared.core().handle_tcp_close(id);
    match result {
        Ok(Closed::Eof) => tracing::debug!(%addr, "relay connection closed"),
        Err(Closed::Unregistered) => {
            shared.counters.tcp_closed_unregistered.inc();
            tracing::debug!(%addr, reason = %Closed::Unregistered, "relay connection closed");
        }
        Ok(why) | Err(why) => {
            shared.counters.tcp_closed_error.inc();
            tracing::debug!(%addr, reason = %why, "relay connection closed");
        }
    }
}

/// Reads with the registration deadline until the connection registered, then with the idle
/// timeout.
async fn within<T>(
    registered: bool,
    register_by: Instant,
    read: impl std::future::Future<Output = std::io::Result<T>>,
) -> Result<std::io::Result<T>, Closed> {
    if registered {
        tokio::time::timeout(TCP_IDLE_TIMEOUT, read)
            .await
            .map_err(|_| Closed::Idle)
    } else {
        tokio::time::timeout_at(register_by, read)
            .await
            .map_err(|_| Closed::Unregistered)
    }
}

async fn serve(
    stream: TcpStream,
    conn: &Conn,
    acceptor: TlsAcceptor,
    shared: &Shared,
    mut rx: mpsc::Receiver<Vec<u8>>,
) -> Result<Closed, Closed> {
    let (addr, id, register_by) = (conn.addr, conn.id, conn.register_by);
    let handshake_by = register_by.min(Instant::now() + TLS_HANDSHAKE_TIMEOUT);
    let tls = match tokio::time::timeout_at(handshake_by, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%addr, error = %e, "TLS handshake failed");
            return Err(Closed::Io(e));
        }
        Err(_) if handshake_by == register_by => return Err(Closed::Unregistered),
        Err(_) => return Err(Closed::Idle),
    };
    let (mut rd, mut wr) = tokio::io::split(tls);
    let writer = async move {
        // Grows as the traffic needs, to at most TCP_WRITE_BATCH and one frame; a connection
        // that only gets pongs keeps a small one.
        let mut out = Vec::new();
        while let Some(first) = rx.recv().await {
            // Everything queued meanwhile, up to TCP_WRITE_BATCH bytes, goes into one buffer
            // and out with one write: full TLS records and few system calls, not one of each a
            // frame.
            out.clear();
            out.extend_from_slice(&first);
            while out.len() < TCP_WRITE_BATCH {
                match rx.try_recv() {
                    Ok(more) => out.extend_from_slice(&more),
                    Err(_) => break,
                }
            }
            wr.write_all(&out).await?;
            wr.flush().await?;
        }
        Ok::<_, std::io::Error>(())
    };
    let reader = async {
        // Every whole frame of a read at once (`crate::tcp_in`).
        let mut inbound = Inbound::new();
        loop {
            let registered = inbound.registered;
            // A read that finds its bytes waiting completes whatever the deadline says, so a
            // connection that never pauses is held to it here.
            if !registered && Instant::now() >= register_by {
                return Err(Closed::Unregistered);
            }
            let n = match within(registered, register_by, rd.read(inbound.space())).await {
                Err(why) => return Err(why),
                Ok(Ok(0)) => return Ok(Closed::Eof),
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Ok(Closed::Eof);
                }
                Ok(Err(e)) => return Err(Closed::Io(e)),
                Ok(Ok(n)) => n,
            };
            inbound
                .handle_read(n, shared, id)
                .map_err(|bad| match bad {
                    BadFrame::TooLong(len) => Closed::TooLong(len),
                    BadFrame::Malformed => Closed::Malformed,
                })?;
        }
    };
    tokio::select! {
        r = reader => r,
        w = writer => match w {
            Ok(()) => Ok(Closed::Eof),
            Err(e) => Err(Closed::Io(e)),
        },
    }
}
