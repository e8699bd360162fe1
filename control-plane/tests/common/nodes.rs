//! Node-side helpers: enrol a node, call the node API with its credential, and read its event
//! stream frame by frame (a small SSE parser over reqwest's body chunks).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use plexsphere_wire::RegisterResponse;
use plexsphere_wire::domain_event::{DOMAIN_ENVELOPES, DomainEvent, ENVELOPES_HEADER, EventData};
use plexsphere_wire::node::Event;
use plexsphere_wire::signed::{DomainVerifier, SignContext, SignedEnvelope};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::{TestServer, register_body, wg_key};

static NEXT_KEY: AtomicU32 = AtomicU32::new(10_000);

/// How long a test waits for something the server should do at once.
pub const BOUND: Duration = Duration::from_secs(20);

impl TestServer {
    /// Issues a token and registers a new node with a fresh key.
    pub async fn enrol(&self, project: &str) -> RegisterResponse {
        let token = self.issue_token(project).await;
        let key = wg_key(NEXT_KEY.fetch_add(1, Ordering::Relaxed));
        let (status, body) = self.register(&register_body(&token.token, &key)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        serde_json::from_value(body).unwrap()
    }

    /// Two nodes of the lab-nodes Project (peers of each other).
    pub async fn enrol_pair(&self) -> (RegisterResponse, RegisterResponse) {
        (
            self.enrol(super::LAB_NODES).await,
            self.enrol(super::LAB_NODES).await,
        )
    }

    /// A request to `/v1/nodes/{node}{tail}` with `node`'s credential.
    pub fn node_req(
        &self,
        method: Method,
        reg: &RegisterResponse,
        tail: &str,
    ) -> reqwest::RequestBuilder {
        self.client
            .request(
                method,
                self.url(&format!("/v1/nodes/{}{tail}", reg.node_id)),
            )
            .bearer_auth(&reg.node_credential)
    }

    pub async fn heartbeat(&self, reg: &RegisterResponse) -> (StatusCode, Value) {
        let body = serde_json::json!({
            "uptime_secs": 12,
            "plexd_version": "0.2.0",
            "state_version": null,
            "peers": {"configured": 0, "connected": 0},
        });
        let r = self
            .node_req(Method::POST, reg, "/heartbeat")
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        (status, r.json().await.unwrap())
    }

    /// The operator's view of a node.
    pub async fn node_view(&self, id: uuid::Uuid) -> Value {
        let (status, body) = self.op_get(&format!("/v1/nodes/{id}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    /// Opens `reg`'s event stream with `client`, optionally resuming.
    pub async fn open_events_with(
        &self,
        client: &reqwest::Client,
        reg: &RegisterResponse,
        last_event_id: Option<&str>,
    ) -> SseReader {
        self.open_events_as(client, reg, last_event_id, false).await
    }

    /// Opens `reg`'s event stream as a node that understands Domain envelopes (as plexd does).
    pub async fn open_domain_events(
        &self,
        reg: &RegisterResponse,
        last_event_id: Option<&str>,
    ) -> SseReader {
        self.open_events_as(&self.client, reg, last_event_id, true)
            .await
    }

    async fn open_events_as(
        &self,
        client: &reqwest::Client,
        reg: &RegisterResponse,
        last_event_id: Option<&str>,
        domain_envelopes: bool,
    ) -> SseReader {
        let mut req = client
            .get(self.url(&format!("/v1/nodes/{}/events", reg.node_id)))
            .bearer_auth(&reg.node_credential);
        if domain_envelopes {
            req = req.header(ENVELOPES_HEADER, DOMAIN_ENVELOPES);
        }
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        SseReader {
            resp,
            buf: String::new(),
            verifiers: vec![DomainVerifier::from_b64(&reg.domain_signing_public_key).unwrap()],
            node_id: reg.node_id,
            domain_id: reg.domain_id,
            domain_frames: 0,
        }
    }

    pub async fn open_events(&self, reg: &RegisterResponse, last: Option<&str>) -> SseReader {
        self.open_events_with(&self.client, reg, last).await
    }

    /// Waits until `cond` holds, polling; panics after [`BOUND`].
    pub async fn wait_for<F: AsyncFnMut() -> bool>(&self, what: &str, mut cond: F) {
        let start = Instant::now();
        while !cond().await {
            assert!(start.elapsed() < BOUND, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// One SSE frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Comment(String),
    Event {
        id: String,
        event: String,
        data: String,
    },
}

pub struct SseReader {
    resp: reqwest::Response,
    buf: String,
    /// The pinned key first, then the keys [`SseReader::trust`] added.
    verifiers: Vec<DomainVerifier>,
    node_id: uuid::Uuid,
    domain_id: uuid::Uuid,
    /// How many of the events read came as Domain envelopes.
    pub domain_frames: usize,
}

impl SseReader {
    /// The next frame, or `None` when the server ended the stream. Panics after [`BOUND`].
    pub async fn next(&mut self) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + BOUND;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                return Some(parse(&block));
            }
            let chunk = tokio::time::timeout_at(deadline, self.resp.chunk())
                .await
                .expect("no SSE frame within the bound")
                .unwrap();
            match chunk {
                Some(bytes) => self.buf.push_str(std::str::from_utf8(&bytes).unwrap()),
                None => {
                    assert!(
                        self.buf.trim().is_empty(),
                        "a partial frame: {:?}",
                        self.buf
                    );
                    return None;
                }
            }
        }
    }

    /// Accepts events signed by `key` too (standard base64), as a node told of a rotation.
    pub fn trust(&mut self, key: &str) {
        self.verifiers.push(DomainVerifier::from_b64(key).unwrap());
    }

    /// The next event (skipping keep-alive comments), verified: signed by the Domain, for
    /// this node, with `seq` equal to the frame id and the kind's name as `event:`.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.next_signed().await.map(|(ev, _)| ev)
    }

    /// [`Self::next_event`], and which key signed it (0: the pinned one, then in the order
    /// [`Self::trust`] added them). A Domain envelope must name this node's Domain and this
    /// node as a recipient; it is answered as the copy addressed to this node.
    pub async fn next_signed(&mut self) -> Option<(Event, usize)> {
        loop {
            match self.next().await? {
                Frame::Comment(_) => continue,
                Frame::Event { id, event, data } => {
                    let data: EventData = serde_json::from_str(&data).unwrap();
                    let (ev, by) = match data {
                        EventData::Node(env) => self.open::<Event>(SignContext::Event, &env),
                        EventData::Domain(d) => {
                            self.domain_frames += 1;
                            let (ev, by) =
                                self.open::<DomainEvent>(SignContext::DomainEvent, &d.domain_event);
                            assert_eq!(ev.domain_id, self.domain_id);
                            assert!(ev.is_for(self.node_id), "not for this node: {ev:?}");
                            (ev.addressed_to(self.node_id), by)
                        }
                    };
                    assert_eq!(ev.seq.to_string(), id);
                    assert_eq!(ev.kind.name(), event);
                    assert_eq!(ev.node_id, self.node_id);
                    return Some((ev, by));
                }
            }
        }
    }

    fn open<T: serde::de::DeserializeOwned>(
        &self,
        ctx: SignContext,
        env: &SignedEnvelope,
    ) -> (T, usize) {
        self.verifiers
            .iter()
            .enumerate()
            .find_map(|(i, v)| v.open(ctx, env).ok().map(|doc| (doc, i)))
            .expect("an event signed by none of the keys this node trusts")
    }
}

fn parse(block: &str) -> Frame {
    let (mut id, mut event, mut data, mut comment) = (None, None, Vec::new(), None);
    for line in block.lines().filter(|l| !l.is_empty()) {
        if let Some(c) = line.strip_prefix(':') {
            comment = Some(c.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("id:") {
            id = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("event:") {
            event = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.trim_start().to_owned());
        } else {
            panic!("unexpected SSE line {line:?}");
        }
    }
    match (id, event, comment) {
        (Some(id), Some(event), _) => Frame::Event {
            id,
            event,
            data: data.join("\n"),
        },
        (None, None, Some(c)) => Frame::Comment(c),
        _ => panic!("an SSE frame without id/event: {block:?}"),
    }
}

/// `GET /state` as `reg`'s node, optionally with `If-None-Match`: the status, the `ETag` and
/// the signed state (on 200).
pub async fn pull(
    srv: &TestServer,
    reg: &plexsphere_wire::RegisterResponse,
    etag: Option<&str>,
) -> (StatusCode, Option<String>, Option<SignedEnvelope>) {
    let mut req = srv.node_req(Method::GET, reg, "/state");
    if let Some(t) = etag {
        req = req.header("if-none-match", t);
    }
    let r = req.send().await.unwrap();
    let status = r.status();
    let tag = r
        .headers()
        .get("etag")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = if status == StatusCode::OK {
        Some(r.json().await.unwrap())
    } else {
        None
    };
    (status, tag, body)
}
