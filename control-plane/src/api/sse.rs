//! `GET /v1/nodes/{id}/events`: the node's event stream (Server-Sent Events).
//!
//! Each connection gets its own task that takes the node's events from its Domain's ring
//! ([`super::fanout`]: one reader per Domain reads each new event from the store once, woken
//! by the bus) at its own pace and hands each frame to a bounded channel the response body
//! drains. A node that asks for Domain envelopes (`plexsphere-event-envelopes: domain`) gets
//! the event's one copy signed for the whole Domain, shared by every stream
//! ([`super::event_ring::Entry::shared_data`]); any other gets its own copy, signed for it. The key
//! that signs is looked up for every batch, so a rotation's new key signs on streams opened
//! before its overlap ended. A cursor older than the ring (a resume) reads the gap
//! from the store in bounded batches. A publisher never waits for a stream. A client that
//! accepts no frame for `slow_reader_timeout` is dropped; it resumes later with
//! `Last-Event-ID`. A node holds at most [`MAX_STREAMS_PER_NODE`] streams at once.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use plexsphere_wire::domain_event::{DOMAIN_ENVELOPES, ENVELOPES_HEADER};
use plexsphere_wire::node::{Event, EventKind};
use plexsphere_wire::signed::{DomainSigner, SignContext};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use uuid::Uuid;

use super::event_ring::{Entry, Take};
use super::extract::NodeAuth;
use super::fanout::{Hub, Member};
use super::state::AppState;
pub use super::streams::Streams;
use crate::error::Error;
use crate::node::decisions::{self, Resume};
use crate::store::domains::{self, Domain};
use crate::store::nodes::NodeRow;
use crate::store::{StoreError, events};

/// Events read from the store per query (a stream reading a gap older than the ring).
const BATCH: u32 = 256;
/// Event streams one node may hold open at once in this process (docs/api.md); one more is
/// answered 429 `rate_limited` with `Retry-After` ([`crate::error::STREAM_RETRY_AFTER_SECS`]).
pub const MAX_STREAMS_PER_NODE: usize = 4;

/// Counts a stream as open until dropped; logs its end once.
struct Opened {
    st: Arc<AppState>,
    node_id: Uuid,
    end: End,
}

impl Opened {
    /// Counts the stream in, unless the node already has [`MAX_STREAMS_PER_NODE`] open here.
    fn new(st: Arc<AppState>, node_id: Uuid) -> Result<Self, Error> {
        {
            let mut open = st.streams.lock();
            let n = open.entry(node_id).or_insert(0);
            if *n >= MAX_STREAMS_PER_NODE {
                tracing::warn!(node_id = %node_id, open = *n, "sse: too many streams for this node");
                return Err(Error::TooManyStreams(MAX_STREAMS_PER_NODE));
            }
            *n += 1;
        }
        st.metrics.streams_open.inc();
        Ok(Self {
            st,
            node_id,
            end: End::ClientGone,
        })
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
    let opened = Opened::new(st.clone(), node.id)?;
    let mut conn = st.store.acquire().await?;
    let domain = domains::get(&mut conn, node.domain_id)
        .await?
        .ok_or_else(|| Error::Internal(format!("node {} names a missing domain", node.id)))?;
    let signer = st.keys.signer(&domain).await?;
    // Join the Domain's fan-out before reading the head: its reader is subscribed to the bus
    // by then, so a change committed after the read reaches this stream through the ring.
    let member =
        st.streams
            .fanout
            .join(node.domain_id, &st.store, st.bus.subscribe(node.domain_id));
    let head = events::head(&mut conn, node.domain_id).await?;
    drop(conn);
    let last_event_id = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let domain_envelopes = headers
        .get_all(ENVELOPES_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim() == DOMAIN_ENVELOPES);
    let resume = decisions::resume_point(last_event_id, head);
    tracing::info!(node_id = %node.id, last_event_id = ?last_event_id, head = head.seq, domain_envelopes, "sse: stream opened");

    let (tx, rx) = mpsc::channel::<Frame>(st.config.events.stream_buffer.max(1));
    let keepalive = st.config.events.keepalive;
    let task = StreamTask {
        st,
        node,
        domain,
        signer,
        domain_envelopes,
        tx,
        cursor: 0,
        policy_floor: head.seq,
        opened_at: Instant::now(),
    };
    tokio::spawn(task.run(resume, member, opened));

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
    domain: Domain,
    /// The Domain key that signs now (looked up again before every batch).
    signer: Arc<DomainSigner>,
    /// The node understands Domain envelopes: ring events go out as their shared copy.
    domain_envelopes: bool,
    tx: mpsc::Sender<Frame>,
    /// Every event for this node up to here has been sent (or was not for it).
    cursor: u64,
    /// Peer events are filtered by a compile of the policy that includes every change
    /// through this seq (the stream's start, then the last `resync` it passed).
    policy_floor: u64,
    /// Events the bus announced after this are timed from the reader's wake-up
    /// (`plexsphere_event_delivery_seconds`); replays of older ones are not.
    opened_at: Instant,
}

impl StreamTask {
    async fn run(mut self, resume: Resume, mut member: Member, mut opened: Opened) {
        let mut closing = self.st.streams.closing.subscribe();
        opened.end = tokio::select! {
            end = self.serve(resume, &mut member) => end,
            _ = closing.wait_for(|closing| *closing) => End::Shutdown,
        };
    }

    async fn serve(&mut self, resume: Resume, member: &mut Member) -> End {
        match resume {
            Resume::After(seq) => {
                self.cursor = seq;
                // The node is live as of the stream's start (the floor set at open), also
                // when it resumes from before its own registration: events older than the
                // node are decided with a compile that knows it.
                self.policy_floor = self.policy_floor.max(seq);
            }
            Resume::Resync { head, reason } => {
                tracing::info!(node_id = %self.node.id, head, reason, "sse: resync");
                if let Err(end) = self.resync(head, reason).await {
                    return end;
                }
            }
        }
        loop {
            member.tip.borrow_and_update();
            if let Err(end) = self.deliver(&member.hub).await {
                return end;
            }
            tokio::select! {
                changed = member.tip.changed() => {
                    if changed.is_err() || member.hub.ended() {
                        // The Domain's reader ended (the bus closed): resume elsewhere.
                        return End::Failed;
                    }
                }
                () = self.tx.closed() => return End::ClientGone,
            }
        }
    }

    /// Sends every event for this node after the cursor: from the Domain's ring, after
    /// reading from the store whatever part of the gap the ring does not reach back to.
    async fn deliver(&mut self, hub: &Hub) -> Result<(), End> {
        loop {
            match hub.take(self.cursor, self.node.id) {
                Take::Events(batch, cursor) => {
                    if !batch.is_empty() {
                        self.refresh_signer().await?;
                    }
                    for entry in batch {
                        if !self.allowed(entry.row.seq, &entry.row.kind).await? {
                            self.cursor = entry.row.seq;
                            continue;
                        }
                        let timed = (entry.woken >= self.opened_at).then_some(entry.woken);
                        self.send_entry(&entry, timed).await?;
                    }
                    self.cursor = cursor;
                    return Ok(());
                }
                Take::Gap => {
                    if self.read_gap().await? {
                        // Caught up with the store before the ring started: wait for it.
                        if matches!(hub.take(self.cursor, self.node.id), Take::Gap) {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }

    /// Sends one batch of this node's stored events after the cursor; answers whether the
    /// store had no more (the cursor then stands at the head the read saw).
    async fn read_gap(&mut self) -> Result<bool, End> {
        let (before, batch, after) = self.read().await.map_err(|e| {
            tracing::warn!(node_id = %self.node.id, error = %e, "sse: cannot read the event log");
            End::Failed
        })?;
        if after.pruned_through > self.cursor {
            // Events this stream had not sent yet were pruned: the node must pull.
            self.resync(after.seq, "the stream fell behind the replay window")
                .await?;
            return Ok(false);
        }
        let full = batch.len() >= BATCH as usize;
        self.refresh_signer().await?;
        for ev in batch {
            if !self.allowed(ev.seq, &ev.kind).await? {
                self.cursor = ev.seq;
                continue;
            }
            self.send_row(ev.seq, ev.kind, None).await?;
        }
        if !full {
            // Every event up to `before` was visible to the read and none is left for us.
            self.cursor = self.cursor.max(before.seq);
        }
        Ok(!full)
    }

    /// The key that signs now: after a rotation's overlap the new one, also on a stream that
    /// opened before (the keyring answers from its cache; it reads the store at most every
    /// [`crate::keys::KEY_REFRESH`]).
    async fn refresh_signer(&mut self) -> Result<(), End> {
        match self.st.keys.signer(&self.domain).await {
            Ok(signer) => {
                self.signer = signer;
                Ok(())
            }
            Err(e) => {
                tracing::warn!(node_id = %self.node.id, error = %e, "sse: cannot read the Domain key");
                Err(End::Failed)
            }
        }
    }

    /// Sends a ring event (the shared Domain copy, or this node's own) and moves the cursor
    /// to it; a `node_revoked` ends the stream.
    async fn send_entry(&mut self, entry: &Entry, woken: Option<Instant>) -> Result<(), End> {
        let (seq, kind) = (entry.row.seq, &entry.row.kind);
        if self.domain_envelopes {
            let data = entry
                .shared_data(self.domain.id, &self.signer)
                .map_err(|_| End::Failed)?;
            self.send_frame(seq, kind.name(), &data, woken).await?;
        } else {
            self.send(seq, kind.clone(), woken).await?;
        }
        self.sent(seq, *kind == EventKind::NodeRevoked)
    }

    /// Sends this node's own copy of one event and moves the cursor to it; a `node_revoked`
    /// ends the stream.
    async fn send_row(
        &mut self,
        seq: u64,
        kind: EventKind,
        woken: Option<Instant>,
    ) -> Result<(), End> {
        let revoked = kind == EventKind::NodeRevoked;
        self.send(seq, kind, woken).await?;
        self.sent(seq, revoked)
    }

    /// After an event went out: the cursor moves to it, and a `node_revoked` ends the stream.
    fn sent(&mut self, seq: u64, revoked: bool) -> Result<(), End> {
        self.cursor = seq;
        if revoked {
            return Err(End::Revoked);
        }
        Ok(())
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
        self.send(head, kind, None).await?;
        self.cursor = head;
        self.policy_floor = self.policy_floor.max(head);
        Ok(())
    }

    /// Whether this node may receive the event at `seq` (`PolicyCache::may_send`: a peer
    /// event only when the Domain's policy connects the node to its subject). A `resync`
    /// (a policy or tag change appends one) raises the compile the next ones need.
    async fn allowed(&mut self, seq: u64, kind: &EventKind) -> Result<bool, End> {
        if matches!(kind, EventKind::Resync { .. }) {
            self.policy_floor = self.policy_floor.max(seq);
        }
        let (me, domain) = (self.node.id, self.domain.id);
        let store = &self.st.store;
        match (self.st.policies)
            .may_send(store, domain, me, self.policy_floor, seq, kind)
            .await
        {
            Ok(true) => Ok(true),
            Ok(false) => {
                tracing::debug!(node_id = %me, seq, event = kind.name(), "sse: event hidden by the policy");
                Ok(false)
            }
            Err(e) => {
                tracing::warn!(node_id = %me, error = %e, "sse: cannot compile the Domain's policy");
                Err(End::Failed)
            }
        }
    }

    /// Sends this node's own copy of an event, signed for it.
    async fn send(&self, seq: u64, kind: EventKind, woken: Option<Instant>) -> Result<(), End> {
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
        self.send_frame(seq, name, &data, woken).await
    }

    /// Hands one frame to the response body, waiting at most `slow_reader_timeout`.
    async fn send_frame(
        &self,
        seq: u64,
        name: &'static str,
        data: &str,
        woken: Option<Instant>,
    ) -> Result<(), End> {
        let frame = SseEvent::default()
            .id(seq.to_string())
            .event(name)
            .data(data);
        let timeout = self.st.config.events.slow_reader_timeout;
        match tokio::time::timeout(timeout, self.tx.send(Ok(frame))).await {
            Ok(Ok(())) => {
                if let Some(woken) = woken {
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
