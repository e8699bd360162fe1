//! `GET /v1/nodes/{id}/events`: the node's event stream (Server-Sent Events).
//!
//! Each connection gets its own task that reads the node's events from the store at its own
//! pace (the `events` table is the source of truth; the bus only wakes the task), signs each
//! one for this node and hands the frame to a bounded channel the response body drains. A
//! publisher never waits for a stream. A client that accepts no frame for
//! `slow_reader_timeout` is dropped; it resumes later with `Last-Event-ID`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use plexsphere_wire::node::{Event, EventKind};
use plexsphere_wire::signed::{DomainSigner, SignContext};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use uuid::Uuid;

use super::extract::NodeAuth;
use super::state::AppState;
pub use super::streams::Streams;
use crate::error::Error;
use crate::node_decisions::{self, Resume};
use crate::store::nodes::NodeRow;
use crate::store::{StoreError, domains, events};

/// Events read from the store per query.
const BATCH: u32 = 256;

/// Counts a stream as open until dropped; logs its end once.
struct Opened {
    st: Arc<AppState>,
    node_id: Uuid,
    end: End,
}

impl Opened {
    fn new(st: Arc<AppState>, node_id: Uuid) -> Self {
        *st.streams.lock().entry(node_id).or_insert(0) += 1;
        st.metrics.streams_open.inc();
        Self {
            st,
            node_id,
            end: End::ClientGone,
        }
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        let mut open = self.st.streams.lock();
        if let Some(n) = open.get_mut(&self.node_id) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.node_id);
            }
        }
        drop(open);
        self.st.metrics.streams_open.dec();
        if self.end == End::SlowReader {
            self.st.streams.slow_dropped.fetch_add(1, Ordering::Relaxed);
            self.st.metrics.streams_slow_dropped.inc();
        }
        tracing::info!(node_id = %self.node_id, reason = self.end.as_str(), "sse: stream closed");
    }
}

/// Why a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    ClientGone,
    SlowReader,
    Revoked,
    Failed,
    Shutdown,
}

impl End {
    fn as_str(self) -> &'static str {
        match self {
            End::ClientGone => "the client went away",
            End::SlowReader => "the client did not keep up; it resumes with Last-Event-ID",
            End::Revoked => "the node was revoked or deleted",
            End::Failed => "a server fault (logged above); the client resumes with Last-Event-ID",
            End::Shutdown => "the server is shutting down; the client resumes with Last-Event-ID",
        }
    }
}

type Frame = Result<SseEvent, Infallible>;

pub async fn events(
    State(st): State<Arc<AppState>>,
    NodeAuth { node }: NodeAuth,
    headers: HeaderMap,
) -> Result<Response, Error> {
    let mut conn = st.store.acquire().await?;
    let domain = domains::get(&mut conn, node.domain_id)
        .await?
        .ok_or_else(|| Error::Internal(format!("node {} names a missing domain", node.id)))?;
    let signer = st.keys.signer(&domain).await?;
    // Subscribe before reading the head: a change committed after the read wakes the task.
    let mut notices = st.bus.subscribe(node.domain_id);
    notices.borrow_and_update();
    let head = events::head(&mut conn, node.domain_id).await?;
    drop(conn);
    let last_event_id = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let resume = node_decisions::resume_point(last_event_id, head);
    tracing::info!(node_id = %node.id, last_event_id = ?last_event_id, head = head.seq, "sse: stream opened");

    let (tx, rx) = mpsc::channel::<Frame>(st.config.events.stream_buffer.max(1));
    let keepalive = st.config.events.keepalive;
    let opened = Opened::new(st.clone(), node.id);
    let task = StreamTask {
        st,
        node,
        signer,
        tx,
        cursor: 0,
        woken: None,
    };
    tokio::spawn(task.run(resume, notices, opened));

    let mut resp = Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(keepalive).text("keep-alive"))
        .into_response();
    // Tell buffering reverse proxies (nginx) to pass frames through at once.
    resp.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(resp)
}

struct StreamTask {
    st: Arc<AppState>,
    node: NodeRow,
    signer: Arc<DomainSigner>,
    tx: mpsc::Sender<Frame>,
    /// Every event for this node up to here has been sent (or was not for it).
    cursor: u64,
    /// When the bus last woke this stream for a committed change: each event the wake-up
    /// sends is timed from here (`plexsphere_event_delivery_seconds`); replays are not.
    woken: Option<Instant>,
}

impl StreamTask {
    async fn run(mut self, resume: Resume, mut notices: watch::Receiver<u64>, mut opened: Opened) {
        let mut closing = self.st.streams.closing.subscribe();
        opened.end = tokio::select! {
            end = self.serve(resume, &mut notices) => end,
            _ = closing.wait_for(|closing| *closing) => End::Shutdown,
        };
    }

    async fn serve(&mut self, resume: Resume, notices: &mut watch::Receiver<u64>) -> End {
        match resume {
            Resume::After(seq) => self.cursor = seq,
            Resume::Resync { head, reason } => {
                tracing::info!(node_id = %self.node.id, head, reason, "sse: resync");
                if let Err(end) = self.resync(head, reason).await {
                    return end;
                }
            }
        }
        loop {
            notices.borrow_and_update();
            if let Err(end) = self.drain().await {
                return end;
            }
            self.woken = None;
            tokio::select! {
                changed = notices.changed() => {
                    if changed.is_err() {
                        return End::Failed;
                    }
                    self.woken = Some(Instant::now());
                }
                () = self.tx.closed() => return End::ClientGone,
            }
        }
    }

    /// Sends every stored event for this node after the cursor.
    async fn drain(&mut self) -> Result<(), End> {
        loop {
            let (before, batch, after) = self.read().await.map_err(|e| {
                tracing::warn!(node_id = %self.node.id, error = %e, "sse: cannot read the event log");
                End::Failed
            })?;
            if after.pruned_through > self.cursor {
                // Events this stream had not sent yet were pruned: the node must pull.
                self.resync(after.seq, "the stream fell behind the replay window")
                    .await?;
                continue;
            }
            let full = batch.len() >= BATCH as usize;
            for ev in batch {
                let revoked = ev.kind == EventKind::NodeRevoked;
                self.send(ev.seq, ev.kind).await?;
                self.cursor = ev.seq;
                if revoked {
                    return Err(End::Revoked);
                }
            }
            if !full {
                // Every event up to `before` was visible to the read and none is left for us.
                self.cursor = self.cursor.max(before.seq);
                return Ok(());
            }
        }
    }

    /// The head, this node's next events, and the head again (to see a prune in between).
    async fn read(
        &self,
    ) -> Result<(events::Head, Vec<events::EventRow>, events::Head), StoreError> {
        let mut conn = self.st.store.acquire().await?;
        let domain = self.node.domain_id;
        let before = events::head(&mut conn, domain).await?;
        let batch = events::for_node(&mut conn, domain, self.node.id, self.cursor, BATCH).await?;
        let after = events::head(&mut conn, domain).await?;
        Ok((before, batch, after))
    }

    async fn resync(&mut self, head: u64, reason: &str) -> Result<(), End> {
        let kind = EventKind::Resync {
            reason: reason.to_owned(),
        };
        self.send(head, kind).await?;
        self.cursor = head;
        Ok(())
    }

    async fn send(&self, seq: u64, kind: EventKind) -> Result<(), End> {
        let name = kind.name();
        let event = Event {
            seq,
            node_id: self.node.id,
            kind,
        };
        let env = self
            .signer
            .sign(SignContext::Event, &event)
            .map_err(|_| End::Failed)?;
        let data = serde_json::to_string(&env).map_err(|_| End::Failed)?;
        let frame = SseEvent::default()
            .id(seq.to_string())
            .event(name)
            .data(data);
        let timeout = self.st.config.events.slow_reader_timeout;
        match tokio::time::timeout(timeout, self.tx.send(Ok(frame))).await {
            Ok(Ok(())) => {
                if let Some(woken) = self.woken {
                    self.st
                        .metrics
                        .event_delivery
                        .observe(woken.elapsed().as_secs_f64());
                }
                tracing::debug!(node_id = %self.node.id, seq, event = name, "sse: event sent");
                Ok(())
            }
            Ok(Err(_)) => Err(End::ClientGone),
            Err(_) => {
                tracing::warn!(node_id = %self.node.id, seq, "sse: slow reader dropped");
                Err(End::SlowReader)
            }
        }
    }
}
