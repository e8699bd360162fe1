//! The TCP side, with TLS: the same frames as UDP, each after its big-endian u16 length. Per
//! connection a reader (frames in, with the idle timeout) and a writer that drains a bounded
//! queue ([`TCP_QUEUE_FRAMES`]); a frame for a full queue is dropped and counted, so a reader
//! that does not keep up costs bounded memory and never slows the senders.

use std::net::SocketAddr;
use std::sync::Arc;

use plexsphere_wire::reach::relay::Frame;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;

use crate::core::{Now, Peer};
use crate::limits::{MAX_STREAM_FRAME, TCP_IDLE_TIMEOUT, TCP_QUEUE_FRAMES, TLS_HANDSHAKE_TIMEOUT};
use crate::shared::{Shared, deliver};

pub(crate) async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
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
                let _ = stream.set_nodelay(true);
                tokio::spawn(connection(
                    stream,
                    addr,
                    acceptor.clone(),
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
    #[error("{0}")]
    Io(std::io::Error),
    #[error("a frame of {0} bytes, over the limit of {MAX_STREAM_FRAME}")]
    TooLong(usize),
    #[error("a frame that does not decode")]
    Malformed,
}

async fn connection(
    stream: TcpStream,
    addr: SocketAddr,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    shared.counters.tcp_accepted.inc();
    let (tx, rx) = mpsc::channel::<Vec<u8>>(TCP_QUEUE_FRAMES);
    // Counted before the handshake, so a flood of connections costs no TLS work past the limit.
    let Some(id) = shared.core().open_tcp(tx, addr, std::time::Instant::now()) else {
        return;
    };
    let result = tokio::select! {
        r = serve(stream, addr, acceptor, &shared, id, rx) => r,
        _ = stop.changed() => Ok(Closed::Eof),
    };
    shared.core().close_tcp(id);
    match result {
        Ok(Closed::Eof) => tracing::debug!(%addr, "relay connection closed"),
        Ok(why) | Err(why) => {
            shared.counters.tcp_closed_error.inc();
            tracing::debug!(%addr, reason = %why, "relay connection closed");
        }
    }
}

async fn serve(
    stream: TcpStream,
    addr: SocketAddr,
    acceptor: TlsAcceptor,
    shared: &Shared,
    id: crate::core::ConnId,
    mut rx: mpsc::Receiver<Vec<u8>>,
) -> Result<Closed, Closed> {
    let tls = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%addr, error = %e, "TLS handshake failed");
            return Err(Closed::Io(e));
        }
        Err(_) => return Err(Closed::Idle),
    };
    let (mut rd, mut wr) = tokio::io::split(tls);
    let writer = async move {
        while let Some(first) = rx.recv().await {
            wr.write_all(&first).await?;
            // Everything queued meanwhile goes out in the same flush.
            while let Ok(more) = rx.try_recv() {
                wr.write_all(&more).await?;
            }
            wr.flush().await?;
        }
        Ok::<_, std::io::Error>(())
    };
    let reader = async {
        let mut buf = vec![0u8; MAX_STREAM_FRAME];
        loop {
            let mut len = [0u8; 2];
            match tokio::time::timeout(TCP_IDLE_TIMEOUT, rd.read_exact(&mut len)).await {
                Err(_) => return Err(Closed::Idle),
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Ok(Closed::Eof);
                }
                Ok(Err(e)) => return Err(Closed::Io(e)),
                Ok(Ok(_)) => {}
            }
            let len = usize::from(u16::from_be_bytes(len));
            if len > MAX_STREAM_FRAME {
                return Err(Closed::TooLong(len));
            }
            match tokio::time::timeout(TCP_IDLE_TIMEOUT, rd.read_exact(&mut buf[..len])).await {
                Err(_) => return Err(Closed::Idle),
                Ok(Err(e)) => return Err(Closed::Io(e)),
                Ok(Ok(_)) => {}
            }
            let frame = Frame::decode(&buf[..len]).map_err(|_| Closed::Malformed)?;
            let out = shared.core().handle(Peer::Tcp(id), frame, Now::system());
            if let Some(out) = out {
                deliver(shared, out);
            }
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
