//! `GET /v1/console/events`: the console's live updates (Server-Sent Events; docs/api.md
//! "Console events"). Events, each with an `id:`:
//!
//! | event | data | when |
//! |---|---|---|
//! | `snapshot` | `{"reason":..}` | first on every connection (fresh or with `Last-Event-ID`), and when the stream cannot tell what changed (a report removed links, too much at once): the console fetches again |
//! | `map` | `{"domain":..,"links":[link, ...]}` (the map's link shape) | a node's path report changed links the caller sees |
//! | `node` | `{"domain":..,"node":{map node}\|null,"id":..,"removed":bool}` | a node joined, changed (name, endpoints, key, tags), was revoked or left, or went online/offline |
//! | `resource` | `{"id","project_id","phase","updated_at"}` | a resource's phase moved |
//!
//! Across replicas: every stream reads the database, never this process's memory, so a
//! change written by any replica shows. Every [`CONSOLE_POLL`] it reads two small counter
//! tables (each Domain's path seq and event seq) and, when one moved, the rows past the seq
//! it has sent; resources every [`RESOURCE_POLL`] by `updated_at`; who is online every
//! [`ONLINE_SWEEP`]. Limits: [`MAX_CONSOLE_STREAMS_PER_CALLER`] per token or session and
//! [`MAX_CONSOLE_STREAMS`] per replica (429 past them), a stream ends after
//! [`MAX_STREAM_LIFETIME`] (the console reconnects and is authorized again), at most
//! [`MAX_EVENTS_PER_POLL`] events per poll (past it one `snapshot`), a keep-alive comment
//! every [`KEEPALIVE`].

use std::collections::{BTreeSet, HashMap, HashSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use uuid::Uuid;

use super::extract::Operator;
use super::state::AppState;
use crate::error::Error;
use crate::path_map::{self, rfc3339};
use crate::store::paths::{self as rows, MapNode};
use crate::store::{self, events};

/// Console streams one token or session may hold open on one replica.
pub(crate) const MAX_CONSOLE_STREAMS_PER_CALLER: usize = 8;
/// Console streams one replica holds open at most.
pub(crate) const MAX_CONSOLE_STREAMS: usize = 512;
/// Between reads of the path and event counters.
pub(crate) const CONSOLE_POLL: Duration = Duration::from_secs(1);
/// Between reads of the changed resources.
pub(crate) const RESOURCE_POLL: Duration = Duration::from_secs(2);
/// Between sweeps of who is online.
pub(crate) const ONLINE_SWEEP: Duration = Duration::from_secs(15);
/// A stream ends after this long; the console reconnects (and its caller is authorized again).
pub(crate) const MAX_STREAM_LIFETIME: Duration = Duration::from_secs(600);
/// Events one poll may send; past it the stream sends one `snapshot` instead.
pub(crate) const MAX_EVENTS_PER_POLL: usize = 256;
/// A comment line this often keeps proxies from closing an idle stream.
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(15);
/// Frames waiting for a slow console; a console that takes none for [`SLOW_READER`] is dropped.
const QUEUE: usize = 64;
const SLOW_READER: Duration = Duration::from_secs(30);

/// Counts a stream in until dropped.
struct Slot {
    st: Arc<AppState>,
    caller: String,
}

impl Slot {
    fn take(st: Arc<AppState>, caller: &str) -> Result<Self, Error> {
        let mut open = st
            .paths
            .console_streams
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let total: usize = open.values().sum();
        let mine = open.get(caller).copied().unwrap_or(0);
        if mine >= MAX_CONSOLE_STREAMS_PER_CALLER || total >= MAX_CONSOLE_STREAMS {
            tracing::warn!(caller, mine, total, "console events: too many streams");
            return Err(Error::TooManyConsoleStreams(
                if mine >= MAX_CONSOLE_STREAMS_PER_CALLER {
                    MAX_CONSOLE_STREAMS_PER_CALLER
                } else {
                    MAX_CONSOLE_STREAMS
                },
            ));
        }
        *open.entry(caller.to_owned()).or_insert(0) += 1;
        drop(open);
        Ok(Self {
            st,
            caller: caller.to_owned(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .st
            .paths
            .console_streams
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.caller);
            }
        }
    }
}

/// `GET /v1/console/events`.
pub async fn events(State(st): State<Arc<AppState>>, op: Operator) -> Result<Response, Error> {
    let slot = Slot::take(st.clone(), &op.id)?;
    let mut conn = st.store.acquire().await?;
    let domains = super::paths::seen_domains(&mut conn, &op, None).await?;
    drop(conn);
    let (tx, rx) = mpsc::channel::<Result<SseEvent, Infallible>>(QUEUE);
    let task = Task {
        st,
        op,
        domains,
        tx,
        next_id: 0,
        path_seq: HashMap::new(),
        event_seq: HashMap::new(),
        online: HashMap::new(),
        resources: HashMap::new(),
        resources_since: 0,
    };
    tokio::spawn(task.run(slot));
    let mut resp = Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(KEEPALIVE).text("keep-alive"))
        .into_response();
    resp.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(resp)
}

struct Task {
    st: Arc<AppState>,
    op: Operator,
    domains: Vec<Uuid>,
    tx: mpsc::Sender<Result<SseEvent, Infallible>>,
    next_id: u64,
    /// Per Domain: the path seq and the event seq sent up to.
    path_seq: HashMap<Uuid, u64>,
    event_seq: HashMap<Uuid, u64>,
    /// Who was online at the last sweep.
    online: HashMap<Uuid, bool>,
    /// The version of each resource sent (or seen at the start).
    resources: HashMap<Uuid, i64>,
    resources_since: i64,
}

/// Why a stream ended.
enum End {
    Gone,
    Slow,
    Lifetime,
}

impl Task {
    async fn run(mut self, _slot: Slot) {
        let opened = Instant::now();
        let end = match self.serve(opened).await {
            Ok(end) => end,
            Err(e) => {
                tracing::warn!(operator = %self.op.id, "console events: {e}; the stream ends (the console reconnects)");
                return;
            }
        };
        let why = match end {
            End::Gone => "the console went away",
            End::Slow => "the console read nothing for 30 s",
            End::Lifetime => "its lifetime ended",
        };
        tracing::debug!(operator = %self.op.id, "console events: stream closed ({why})");
    }

    async fn serve(&mut self, opened: Instant) -> Result<End, Error> {
        self.start().await?;
        if !self.send("snapshot", json!({"reason": "connected"})).await {
            return Ok(End::Slow);
        }
        let mut last_resources = Instant::now();
        let mut last_sweep = Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(CONSOLE_POLL) => {}
                () = self.tx.closed() => return Ok(End::Gone),
            }
            if opened.elapsed() >= MAX_STREAM_LIFETIME {
                return Ok(End::Lifetime);
            }
            let mut out = Vec::new();
            self.poll_paths(&mut out).await?;
            self.poll_events(&mut out).await?;
            if last_resources.elapsed() >= RESOURCE_POLL {
                last_resources = Instant::now();
                self.poll_resources(&mut out).await?;
            }
            if last_sweep.elapsed() >= ONLINE_SWEEP {
                last_sweep = Instant::now();
                self.sweep_online(&mut out).await?;
            }
            if out.len() > MAX_EVENTS_PER_POLL {
                out = vec![("snapshot", json!({"reason": "too many changes at once"}))];
            }
            for (name, data) in out {
                if !self.send(name, data).await {
                    return Ok(End::Slow);
                }
            }
        }
    }

    /// Where everything stands at the start: changes after it are sent.
    async fn start(&mut self) -> Result<(), Error> {
        let mut conn = self.st.store.acquire().await?;
        let heads = rows::heads(&mut conn).await?;
        let now = store::unix(self.st.now());
        let hb = self.st.config.offline_after_secs();
        for d in &self.domains {
            self.path_seq.insert(*d, heads.get(d).map_or(0, |h| h.seq));
            self.event_seq
                .insert(*d, events::head(&mut conn, *d).await?.seq);
            for n in rows::map_nodes(&mut conn, *d).await? {
                if self.op.sees(n.project_id) {
                    let v = path_map::node_view(&n, now, hb);
                    self.online.insert(n.id, v.online);
                }
            }
        }
        self.resources_since = now.saturating_sub(1);
        for r in rows::resources_since(&mut conn, self.resources_since, 10_000).await? {
            self.resources.insert(r.id, r.version);
        }
        Ok(())
    }

    async fn send(&mut self, name: &'static str, data: serde_json::Value) -> bool {
        self.next_id += 1;
        let ev = SseEvent::default()
            .event(name)
            .id(self.next_id.to_string())
            .data(data.to_string());
        matches!(
            tokio::time::timeout(SLOW_READER, self.tx.send(Ok(ev))).await,
            Ok(Ok(()))
        )
    }

    fn seen_nodes(&self, nodes: &[MapNode]) -> HashSet<Uuid> {
        nodes
            .iter()
            .filter(|n| self.op.sees(n.project_id))
            .map(|n| n.id)
            .collect()
    }

    async fn poll_paths(
        &mut self,
        out: &mut Vec<(&'static str, serde_json::Value)>,
    ) -> Result<(), Error> {
        let mut conn = self.st.store.acquire().await?;
        let heads = rows::heads(&mut conn).await?;
        for d in self.domains.clone() {
            let Some(head) = heads.get(&d).copied() else {
                continue;
            };
            let sent = self.path_seq.get(&d).copied().unwrap_or(0);
            if head.seq <= sent {
                continue;
            }
            self.path_seq.insert(d, head.seq);
            if head.removed_seq > sent {
                out.push((
                    "snapshot",
                    json!({"reason": "links were removed", "domain": d}),
                ));
                continue;
            }
            let changed = rows::in_domain(&mut conn, d, sent).await?;
            let pairs: BTreeSet<(Uuid, Uuid)> = changed
                .iter()
                .map(|r| (r.node_id.min(r.peer_node_id), r.node_id.max(r.peer_node_id)))
                .collect();
            let ids: Vec<Uuid> = pairs
                .iter()
                .flat_map(|(a, b)| [*a, *b])
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let both = rows::between(&mut conn, d, &ids).await?;
            let nodes = rows::map_nodes_by_id(&mut conn, &ids).await?;
            let seen = self.seen_nodes(&nodes);
            let links: Vec<_> = path_map::links(&both, &seen)
                .into_iter()
                .filter(|l| pairs.contains(&(l.a, l.b)))
                .collect();
            if !links.is_empty() {
                out.push(("map", json!({"domain": d, "links": links})));
            }
        }
        Ok(())
    }

    async fn poll_events(
        &mut self,
        out: &mut Vec<(&'static str, serde_json::Value)>,
    ) -> Result<(), Error> {
        let mut conn = self.st.store.acquire().await?;
        let heads: HashMap<Uuid, u64> = events::heads(&mut conn).await?.into_iter().collect();
        let limit = u32::try_from(MAX_EVENTS_PER_POLL).unwrap_or(u32::MAX);
        for d in self.domains.clone() {
            let head = heads.get(&d).copied().unwrap_or(0);
            let sent = self.event_seq.get(&d).copied().unwrap_or(0);
            if head <= sent {
                continue;
            }
            self.event_seq.insert(d, head);
            let evs = events::for_domain(&mut conn, d, sent, limit).await?;
            if evs.len() >= MAX_EVENTS_PER_POLL || evs.first().is_some_and(|e| e.seq > sent + 1) {
                out.push((
                    "snapshot",
                    json!({"reason": "many node changes", "domain": d}),
                ));
                continue;
            }
            let ids: Vec<Uuid> = evs
                .iter()
                .map(|e| e.subject)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let live = rows::map_nodes_by_id(&mut conn, &ids).await?;
            self.node_events(d, &ids, &live, out);
        }
        Ok(())
    }

    /// A `node` event for each of `ids`: its row when live and seen, `removed` when it is gone
    /// (only for nodes the stream knew as seen).
    fn node_events(
        &mut self,
        d: Uuid,
        ids: &[Uuid],
        live: &[MapNode],
        out: &mut Vec<(&'static str, serde_json::Value)>,
    ) {
        let now = store::unix(self.st.now());
        let hb = self.st.config.offline_after_secs();
        for id in ids {
            match live.iter().find(|n| n.id == *id) {
                Some(n) if self.op.sees(n.project_id) => {
                    let v = path_map::node_view(n, now, hb);
                    self.online.insert(n.id, v.online);
                    out.push((
                        "node",
                        json!({"domain": d, "id": id, "removed": false, "node": v}),
                    ));
                }
                Some(_) => {}
                None => {
                    if self.online.remove(id).is_some() {
                        out.push((
                            "node",
                            json!({"domain": d, "id": id, "removed": true, "node": null}),
                        ));
                    }
                }
            }
        }
    }

    async fn sweep_online(
        &mut self,
        out: &mut Vec<(&'static str, serde_json::Value)>,
    ) -> Result<(), Error> {
        let mut conn = self.st.store.acquire().await?;
        let now = store::unix(self.st.now());
        let hb = self.st.config.offline_after_secs();
        for d in self.domains.clone() {
            for n in rows::map_nodes(&mut conn, d).await? {
                if !self.op.sees(n.project_id) {
                    continue;
                }
                let v = path_map::node_view(&n, now, hb);
                if self.online.insert(n.id, v.online) != Some(v.online) {
                    out.push((
                        "node",
                        json!({"domain": d, "id": n.id, "removed": false, "node": v}),
                    ));
                }
            }
        }
        Ok(())
    }

    async fn poll_resources(
        &mut self,
        out: &mut Vec<(&'static str, serde_json::Value)>,
    ) -> Result<(), Error> {
        let mut conn = self.st.store.acquire().await?;
        let limit = u32::try_from(MAX_EVENTS_PER_POLL + 1).unwrap_or(u32::MAX);
        let changed = rows::resources_since(&mut conn, self.resources_since, limit).await?;
        if changed.len() > MAX_EVENTS_PER_POLL {
            self.resources_since = store::unix(self.st.now()).saturating_sub(1);
            out.push(("snapshot", json!({"reason": "many resource changes"})));
            return Ok(());
        }
        for r in changed {
            // Seconds are coarse: the next read starts a second back and skips what was sent.
            self.resources_since = self.resources_since.max(r.updated_at.saturating_sub(1));
            if self.resources.insert(r.id, r.version) == Some(r.version)
                || !self.op.sees(r.project_id)
            {
                continue;
            }
            out.push((
                "resource",
                json!({"id": r.id, "project_id": r.project_id, "phase": r.phase, "updated_at": rfc3339(r.updated_at)}),
            ));
        }
        Ok(())
    }
}
