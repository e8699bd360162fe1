//! The HA tests' HTTP side: an operator and many nodes calling the lab through HAProxy (or a
//! replica directly), and event streams that resume through HAProxy with Last-Event-ID when
//! the replica that served them dies, recording every seq they were sent.
//!
//! Every document is checked against the Domain key the node got at registration, so a
//! replica that signed with a key of its own would fail the test.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use plexsphere_wire::RegisterResponse;
use plexsphere_wire::node::{Event, NodeState};
use plexsphere_wire::signed::{DomainVerifier, SignContext, SignedEnvelope};
use serde_json::{Value, json};

/// How long one request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// A client that trusts the lab CA only (HTTP/2 or HTTP/1.1 by ALPN).
pub fn client(ca_file: &Path) -> Result<reqwest::Client> {
    let trust = plexsphere_tls_client::Trust {
        system_store: false,
        ca_files: vec![ca_file.to_owned()],
        pin: None,
    };
    let config = plexsphere_tls_client::client_config(&trust, plexsphere_tls_client::ALPN_H2_HTTP1)
        .context("the lab CA")?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .context("building the HTTP client")
}

/// A distinct WireGuard private key per call (a counter in the first bytes).
pub fn fresh_wg_key() -> [u8; 32] {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let mut k = [0u8; 32];
    k[..4].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    k[4..8].copy_from_slice(&std::process::id().to_be_bytes());
    k[31] = 0x5a;
    k
}

/// `POST /v1/register/challenge` for `token`, and the registration proof of `secret`'s key:
/// the body's `nonce` and `proof` (every registration proves its WireGuard private key).
pub async fn prove(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    secret: &[u8; 32],
) -> std::result::Result<(String, String), String> {
    let r = http
        .post(format!(
            "{base}{}",
            plexsphere_wire::proof::REGISTER_CHALLENGE_PATH
        ))
        .json(&json!({ "bootstrap_token": token }))
        .timeout(REQUEST_TIMEOUT)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let text = r.text().await.map_err(|e| e.to_string())?;
    let c: plexsphere_wire::proof::Challenge =
        serde_json::from_str(&text).map_err(|_| format!("challenge {status}: {text}"))?;
    let server = plexsphere_wire::key::PublicKey::from_base64(&c.server_public_key)
        .map_err(|_| format!("the challenge's key is not 32 bytes: {text}"))?;
    let id = plexsphere_wire::secret::BootstrapToken::parse(token)
        .map_err(|e| format!("the token: {e}"))?
        .id;
    let proof = plexsphere_wire::proof::prove_register(secret, &server, &id, &c.nonce);
    Ok((c.nonce, proof))
}

/// The operator's calls.
#[derive(Clone)]
pub struct Operator {
    pub http: reqwest::Client,
    pub base: String,
    pub token: String,
}

impl Operator {
    /// A one-use node bootstrap token of `project`.
    pub async fn issue_token(&self, project: &str) -> Result<String> {
        let r = self
            .http
            .post(format!(
                "{}/v1/projects/{project}/bootstrap-tokens",
                self.base
            ))
            .bearer_auth(&self.token)
            .json(&json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 3600}))
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await?;
        let status = r.status();
        let body: Value = r.json().await?;
        if status.as_u16() != 201 {
            bail!("issuing a token answered {status}: {body}");
        }
        body["token"]
            .as_str()
            .map(str::to_owned)
            .context("no token in the answer")
    }
}

/// A registered node: its registration answer and the key its documents are signed with.
#[derive(Clone)]
pub struct Node {
    pub reg: RegisterResponse,
    pub verifier: Arc<DomainVerifier>,
}

/// What one registration attempt came to.
#[derive(Debug)]
pub enum Attempt {
    /// 201 (created) or 200 (an idempotent retry of the same registration).
    Registered(u16, Box<RegisterResponse>),
    /// An answer that is not a registration (502/503 while a replica died...).
    Refused(u16, String),
    /// No answer (the connection broke).
    NoAnswer(String),
}

/// One `POST /v1/register` at `base`.
pub async fn register_once(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    secret: &[u8; 32],
    hostname: &str,
) -> Attempt {
    let (nonce, proof) = match prove(http, base, token, secret).await {
        Ok(p) => p,
        Err(e) => return Attempt::NoAnswer(e),
    };
    let key = plexsphere_wire::reach::public_key(secret);
    let body = json!({
        "bootstrap_token": token,
        "wireguard_public_key": key.to_base64(),
        "hostname": hostname,
        "arch": "amd64",
        "plexd_version": "0.1.0",
        "nonce": nonce,
        "proof": proof,
    });
    let sent = http
        .post(format!("{base}/v1/register"))
        .json(&body)
        .timeout(REQUEST_TIMEOUT)
        .send()
        .await;
    let r = match sent {
        Ok(r) => r,
        Err(e) => return Attempt::NoAnswer(e.to_string()),
    };
    let status = r.status().as_u16();
    let text = match r.text().await {
        Ok(t) => t,
        Err(e) => return Attempt::NoAnswer(format!("{status} without a whole body: {e}")),
    };
    match (status, serde_json::from_str::<RegisterResponse>(&text)) {
        (200 | 201, Ok(reg)) => Attempt::Registered(status, Box::new(reg)),
        _ => Attempt::Refused(status, text),
    }
}

/// Registers, retrying the same token and key until it is registered (what plexd does).
pub async fn register(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    hostname: &str,
) -> Result<Node> {
    let key = fresh_wg_key();
    let mut last = String::new();
    for _ in 0..50 {
        match register_once(http, base, token, &key, hostname).await {
            Attempt::Registered(_, reg) => {
                let verifier = DomainVerifier::from_b64(&reg.domain_signing_public_key)
                    .map_err(|e| anyhow::anyhow!("the Domain key of the answer: {e}"))?;
                return Ok(Node {
                    reg: *reg,
                    verifier: Arc::new(verifier),
                });
            }
            Attempt::Refused(s, text) if s >= 500 => last = format!("{s}: {text}"),
            Attempt::Refused(s, text) => bail!("registering {hostname} answered {s}: {text}"),
            Attempt::NoAnswer(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("registering {hostname} never succeeded; last: {last}")
}

impl Node {
    /// `GET /v1/nodes/<id>/state` at `base`, verified.
    pub async fn state(&self, http: &reqwest::Client, base: &str) -> Result<NodeState> {
        let r = http
            .get(format!("{base}/v1/nodes/{}/state", self.reg.node_id))
            .bearer_auth(&self.reg.node_credential)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await?;
        let status = r.status();
        let text = r.text().await?;
        if !status.is_success() {
            bail!("state answered {status}: {text}");
        }
        let env: SignedEnvelope = serde_json::from_str(&text).context("the state envelope")?;
        self.verifier
            .open(SignContext::NodeState, &env)
            .map_err(|e| anyhow::anyhow!("the state does not verify against the Domain key: {e}"))
    }

    /// `POST /v1/nodes/<id>/endpoints` at `base`: one event for every peer.
    pub async fn report_endpoint(
        &self,
        http: &reqwest::Client,
        base: &str,
        port: u16,
    ) -> Result<()> {
        let r = http
            .post(format!("{base}/v1/nodes/{}/endpoints", self.reg.node_id))
            .bearer_auth(&self.reg.node_credential)
            .json(&json!({"listen_port": port, "addresses": ["192.0.2.9"]}))
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("endpoints answered {}: {}", r.status(), r.text().await?);
        }
        Ok(())
    }
}

/// What a resuming stream has seen.
#[derive(Debug, Default)]
pub struct Received {
    /// Every seq sent, in order (a repeat would show here twice).
    pub seqs: Vec<u64>,
    /// How many times the stream (re)opened.
    pub opens: u32,
    /// Why each earlier connection ended.
    pub ends: Vec<String>,
}

impl Received {
    pub fn set(&self) -> BTreeSet<u64> {
        self.seqs.iter().copied().collect()
    }
    pub fn last(&self) -> Option<u64> {
        self.seqs.last().copied()
    }
}

/// A node's event stream that reopens at `base` with Last-Event-ID whenever it ends, until
/// the task is aborted; what it received is shared.
pub fn follow_events(
    http: reqwest::Client,
    base: String,
    node: Node,
    from: Option<u64>,
) -> (Arc<Mutex<Received>>, tokio::task::JoinHandle<()>) {
    let received = Arc::new(Mutex::new(Received::default()));
    let shared = received.clone();
    let task = tokio::spawn(async move {
        let mut last = from;
        loop {
            if let Ok(mut r) = shared.lock() {
                r.opens += 1;
            }
            let end = match stream_once(&http, &base, &node, last, &shared).await {
                Ok(()) => "the server ended the stream".to_owned(),
                Err(e) => format!("{e:#}"),
            };
            if let Ok(mut r) = shared.lock() {
                r.ends.push(end);
                last = r.last().or(last);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (received, task)
}

async fn stream_once(
    http: &reqwest::Client,
    base: &str,
    node: &Node,
    last: Option<u64>,
    received: &Mutex<Received>,
) -> Result<()> {
    let mut req = http
        .get(format!("{base}/v1/nodes/{}/events", node.reg.node_id))
        .bearer_auth(&node.reg.node_credential)
        .header("accept", "text/event-stream");
    if let Some(seq) = last {
        req = req.header("last-event-id", seq.to_string());
    }
    let mut resp = req.send().await?;
    if !resp.status().is_success() {
        bail!("the stream answered {}", resp.status());
    }
    let mut buf = String::new();
    // A silent stream for this long is a dead one (the server sends keep-alives).
    let idle = Duration::from_secs(4 * crate::ha::SSE_KEEPALIVE_SECS + 2);
    loop {
        let chunk = tokio::time::timeout(idle, resp.chunk())
            .await
            .context("the stream went silent")??;
        let Some(bytes) = chunk else { return Ok(()) };
        buf.push_str(std::str::from_utf8(&bytes).context("the stream is not UTF-8")?);
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            if let Some(seq) = event_seq(&block, node)?
                && let Ok(mut r) = received.lock()
            {
                r.seqs.push(seq);
            }
        }
    }
}

/// The seq of an event frame, checked (signature, id, node); `None` for a comment.
fn event_seq(block: &str, node: &Node) -> Result<Option<u64>> {
    let (mut id, mut data) = (None, Vec::new());
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.trim_start().to_owned());
        }
    }
    let Some(id) = id else { return Ok(None) };
    let env: SignedEnvelope = serde_json::from_str(&data.join("\n")).context("an event's data")?;
    let ev: Event = node
        .verifier
        .open(SignContext::Event, &env)
        .map_err(|e| anyhow::anyhow!("an event does not verify against the Domain key: {e}"))?;
    if ev.seq.to_string() != id || ev.node_id != node.reg.node_id {
        bail!("event {id} carries seq {} for node {}", ev.seq, ev.node_id);
    }
    Ok(Some(ev.seq))
}

/// The seqs of the Domain's log addressed to `node` after `after` (the rule of the server's
/// `events::for_node`), read from the database with psql.
pub fn expected_seqs(database_url: &str, node: &Node, after: u64) -> Result<BTreeSet<u64>> {
    let id = node.reg.node_id;
    let out = crate::ha::psql(
        database_url,
        &format!(
            "SELECT seq FROM events WHERE domain_id = '{}' AND seq > {after} \
             AND (target_node_id = '{id}' OR (target_node_id IS NULL AND subject_node_id <> '{id}')) ORDER BY seq",
            node.reg.domain_id
        ),
    )?;
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.parse().with_context(|| format!("seq {l:?}")))
        .collect()
}
