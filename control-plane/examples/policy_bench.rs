//! The policy change benchmark (docs/benchmarks.md "Policy change to every node"): N nodes
//! with open event streams, one policy change committed through the admin API, and the time
//! until every node enforces it.
//!
//! It starts `plexsphere dev` as its own process per size (so the server's CPU is its own,
//! read from /proc), registers N nodes, opens one event stream for each (HTTP/2 over TLS,
//! 100 streams per connection, Domain envelopes as plexd asks), then sends
//! `PUT /v1/domains/{domain}/policy`. A simulated node "enforces" the change when it has
//! received the `resync`, fetched its state, verified the Domain's signature, seen the new
//! policy version in it and built a `NodeFilter` from its view (what plexd does before it
//! installs the filter). Latency is from just before the PUT is sent to that moment, per node;
//! the server's CPU is its utime+stime over the same window.
//!
//! ```text
//! cargo build --release -p plexsphere --bin plexsphere --example policy_bench
//! target/release/examples/policy_bench --server-bin target/release/plexsphere \
//!     --nodes 1000,10000 --policy tags        # 100 tags, each reaches two others
//! target/release/examples/policy_bench --server-bin target/release/plexsphere \
//!     --nodes 1000 --policy allow-all         # every state lists every other node
//! ```
//!
//! `--policy tags`: node i registers with a token carrying tag `tI` (I = i mod 100); the
//! document before is `tK -> tK+1, tK+2 tcp/5432` for every K, after `tK -> tK+1, tK+3`, so
//! every node's view changes and each state lists about 4 % of the fleet. `--policy
//! allow-all`: the default document before, `* -> * tcp, udp` after: every state lists every
//! other node (N - 1 peers).

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use plexsphere_wire::node::NodeState;
use plexsphere_wire::signed::{DomainVerifier, SignContext, SignedEnvelope};
use rustls::pki_types::pem::PemObject as _;
use serde_json::{Value, json};
use tokio::sync::watch;

type Failure = Box<dyn std::error::Error + Send + Sync>;

const LAB_NODES: &str = "019a0816-0000-7000-8000-000000000002";
/// How long every node may take to enforce the change before the run stops waiting.
const ENFORCE_BOUND: Duration = Duration::from_secs(300);
/// Registrations in flight at once.
const REGISTER_PARALLEL: usize = 32;
/// Streams per HTTP/2 connection.
const PER_CONNECTION: usize = 100;
/// State pulls one simulated node makes at most (a 503 while the server is busy, or a state
/// of the old version, makes it pull again).
const PULLS: usize = 1000;
/// How long a simulated node waits after a 503 before it pulls again.
const RETRY_AFTER: Duration = Duration::from_millis(200);
/// Tags of the restrictive policy.
const TAGS: usize = 100;

struct Args {
    nodes: Vec<usize>,
    server_bin: String,
    tags: bool,
}

fn parse_args() -> Result<Args, Failure> {
    let mut a = Args {
        nodes: vec![1000],
        server_bin: "target/release/plexsphere".into(),
        tags: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--nodes" => {
                a.nodes = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--server-bin" => a.server_bin = value()?,
            "--policy" => {
                a.tags = match value()?.as_str() {
                    "tags" => true,
                    "allow-all" => false,
                    other => return Err(format!("--policy {other:?}: tags or allow-all").into()),
                }
            }
            other => return Err(format!("unknown flag {other:?} (see the file's header)").into()),
        }
    }
    Ok(a)
}

/// The document: tag K reaches tags K+1 and K+`second` on tcp/5432.
fn tag_document(second: usize) -> String {
    let mut doc = String::from("rules:\n");
    for k in 0..TAGS {
        let (a, b) = ((k + 1) % TAGS, (k + second) % TAGS);
        doc.push_str(&format!(
            "  - {{src: 'tag:t{k}', dst: ['tag:t{a}', 'tag:t{b}'], proto: tcp, ports: 5432}}\n"
        ));
    }
    doc
}

struct Server {
    url: String,
    ca_pem: String,
    operator_token: String,
    child: Child,
    _dir: tempfile::TempDir,
}

/// `plexsphere dev` in a fresh data directory: answers once it listens.
fn start_dev(bin: &str) -> Result<Server, Failure> {
    let dir = tempfile::Builder::new().prefix("policy-bench-").tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut child = Command::new(bin)
        .env("PLEXSPHERE_NO_LOCAL_MACHINES", "1")
        .args([
            "dev",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(dir.path())
        .args(["--register-burst", "1000000", "--register-refill-secs", "1"])
        .args(["--log-level", "warn"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let (mut url, mut ca, mut token) = (None, None, None);
    for line in lines.by_ref() {
        let line = line?;
        if let Some(v) = line.strip_prefix("api url: ") {
            url = Some(v.to_owned());
        } else if let Some(v) = line.strip_prefix("ca file: ") {
            ca = Some(v.to_owned());
        } else if let Some(v) = line.strip_prefix("operator token file: ") {
            token = Some(v.to_owned());
        } else if line.starts_with("listening on ") {
            break;
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    let (Some(url), Some(ca), Some(token)) = (url, ca, token) else {
        return Err("plexsphere dev did not print its api url, ca file and token file".into());
    };
    Ok(Server {
        url,
        ca_pem: std::fs::read_to_string(ca)?,
        operator_token: std::fs::read_to_string(token)?.trim().to_owned(),
        child,
        _dir: dir,
    })
}

fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

fn client(ca_pem: &str) -> Result<reqwest::Client, Failure> {
    plexsphere::tls::install_ring_provider();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .build()?)
}

/// The CPU-seconds (user + system) the process used so far.
fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

struct Node {
    id: String,
    credential: String,
    domain_id: String,
    verifier: DomainVerifier,
}

async fn issue_token(
    s: &Server,
    http: &reqwest::Client,
    tags: Vec<String>,
    uses: usize,
) -> Result<String, Failure> {
    let r: Value = http
        .post(format!("{}/v1/projects/{LAB_NODES}/bootstrap-tokens", s.url))
        .bearer_auth(&s.operator_token)
        .json(&json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 7200, "max_uses": uses, "tags": tags}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(r["token"]
        .as_str()
        .ok_or("no token in the answer")?
        .to_owned())
}

/// Registers `n` nodes; with `tags`, node i with a token carrying `t{i % TAGS}`.
async fn register_nodes(
    s: &Server,
    http: &reqwest::Client,
    n: usize,
    tags: bool,
) -> Result<Vec<Arc<Node>>, Failure> {
    let mut tokens = Vec::new();
    if tags {
        for k in 0..TAGS {
            tokens.push(issue_token(s, http, vec![format!("t{k}")], n.div_ceil(TAGS)).await?);
        }
    } else {
        for _ in 0..n.div_ceil(1000) {
            tokens.push(issue_token(s, http, Vec::new(), 1000).await?);
        }
    }
    let tokens = Arc::new(tokens);
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..REGISTER_PARALLEL {
        let (http, next, tokens, base) =
            (http.clone(), next.clone(), tokens.clone(), s.url.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= n {
                    return Ok::<_, Failure>(out);
                }
                let mut secret = [0u8; 32];
                secret[..8].copy_from_slice(&(i as u64 + 1).to_be_bytes());
                secret[31] = 0x5b;
                let key = plexsphere_wire::reach::public_key(&secret);
                let token = if tags {
                    &tokens[i % TAGS]
                } else {
                    &tokens[i / 1000]
                };
                let c: plexsphere_wire::proof::Challenge = http
                    .post(format!(
                        "{base}{}",
                        plexsphere_wire::proof::REGISTER_CHALLENGE_PATH
                    ))
                    .json(&json!({ "bootstrap_token": token }))
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await?;
                let server = plexsphere_wire::key::PublicKey::from_base64(&c.server_public_key)
                    .map_err(|_| "the challenge's key is not 32 bytes")?;
                let id = plexsphere_wire::secret::BootstrapToken::parse(token)?.id;
                let proof = plexsphere_wire::proof::prove_register(&secret, &server, &id, &c.nonce);
                let r: Value = http
                    .post(format!("{base}/v1/register"))
                    .json(&json!({
                        "bootstrap_token": token,
                        "wireguard_public_key": key.to_base64(),
                        "hostname": format!("pb-{i}"),
                        "arch": "amd64",
                        "plexd_version": "0.1.0",
                        "nonce": c.nonce,
                        "proof": proof,
                    }))
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await?;
                let key = r["domain_signing_public_key"].as_str().ok_or("no key")?;
                out.push(Arc::new(Node {
                    id: r["node_id"].as_str().ok_or("no node_id")?.to_owned(),
                    credential: r["node_credential"]
                        .as_str()
                        .ok_or("no credential")?
                        .to_owned(),
                    domain_id: r["domain_id"].as_str().ok_or("no domain_id")?.to_owned(),
                    verifier: DomainVerifier::from_b64(key)?,
                }));
            }
        }));
    }
    let mut nodes = Vec::new();
    for t in tasks {
        nodes.extend(t.await??);
    }
    eprintln!(
        "registered {n} nodes in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(nodes)
}

/// When one node enforced version `want`: the time, and its peer count.
type Enforced = Result<(Instant, usize), String>;

/// One simulated node: its stream open (counted in `opened`), then, once `armed`, the first
/// `resync` makes it pull its state until it carries version `want`; then it builds its filter.
async fn node(
    http: reqwest::Client,
    url: String,
    node: Arc<Node>,
    want: u64,
    opened: Arc<AtomicU64>,
    retries: Arc<AtomicU64>,
    mut armed: watch::Receiver<bool>,
) -> Enforced {
    let mut resp = http
        .get(format!("{url}/v1/nodes/{}/events", node.id))
        .bearer_auth(&node.credential)
        .header("plexsphere-event-envelopes", "domain")
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("stream status {}", resp.status()));
    }
    opened.fetch_add(1, Ordering::Relaxed);
    armed.wait_for(|a| *a).await.map_err(|e| e.to_string())?;
    let mut buf = String::new();
    loop {
        let chunk = resp.chunk().await.map_err(|e| e.to_string())?;
        let Some(bytes) = chunk else {
            return Err("the server ended the stream".into());
        };
        buf.push_str(&String::from_utf8_lossy(&bytes));
        if buf.contains("event: resync") || buf.contains("event:resync") {
            break;
        }
        if let Some(end) = buf.rfind("\n\n") {
            buf.drain(..end + 2);
        }
    }
    for _ in 0..PULLS {
        let r = http
            .get(format!("{url}/v1/nodes/{}/state", node.id))
            .bearer_auth(&node.credential)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE
            || r.status() == reqwest::StatusCode::TOO_MANY_REQUESTS
        {
            // What plexd does too: the server is busy, pull again shortly.
            retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(RETRY_AFTER).await;
            continue;
        }
        let env: SignedEnvelope = r
            .error_for_status()
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        let state: NodeState = node
            .verifier
            .open(SignContext::NodeState, &env)
            .map_err(|e| format!("a state that does not verify: {e}"))?;
        let Some(p) = state.policy else {
            return Err("a state without a policy".into());
        };
        if p.version < want {
            continue;
        }
        plexsphere_policy::NodeFilter::new(&p.view).map_err(|e| e.to_string())?;
        return Ok((Instant::now(), state.peers.len()));
    }
    Err(format!(
        "no state with policy version {want} after {PULLS} pulls"
    ))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn put_policy(
    s: &Server,
    http: &reqwest::Client,
    domain: &str,
    doc: &str,
) -> Result<u64, Failure> {
    let url = format!("{}/v1/domains/{domain}/policy", s.url);
    let current: Value = http
        .get(&url)
        .bearer_auth(&s.operator_token)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let expected = current["version"].as_u64().ok_or("no version")?;
    let r = http
        .put(&url)
        .bearer_auth(&s.operator_token)
        .json(&json!({"document": doc, "expected_version": expected}))
        .send()
        .await?;
    let status = r.status();
    let body: Value = r.json().await?;
    if !status.is_success() {
        return Err(format!("policy refused: {status} {body}").into());
    }
    body["version"]
        .as_u64()
        .ok_or_else(|| "no version in the answer".into())
}

async fn run_one(args: &Args, n: usize) -> Result<(), Failure> {
    let mut server = start_dev(&args.server_bin)?;
    let http = client(&server.ca_pem)?;
    let nodes = register_nodes(&server, &http, n, args.tags).await?;
    let domain = nodes.first().ok_or("no node")?.domain_id.clone();
    let (before, after) = if args.tags {
        (Some(tag_document(2)), tag_document(3))
    } else {
        (
            None,
            "rules:\n  - {src: '*', dst: '*', proto: [tcp, udp]}\n".to_owned(),
        )
    };
    let mut want = match &before {
        Some(doc) => put_policy(&server, &http, &domain, doc).await?,
        None => 1,
    };
    want += 1;
    let opened = Arc::new(AtomicU64::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let (arm, armed) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut connections: Vec<reqwest::Client> = Vec::new();
    let open_start = Instant::now();
    for (i, nd) in nodes.iter().enumerate() {
        if connections.len() <= i / PER_CONNECTION {
            connections.push(client(&server.ca_pem)?);
        }
        let c = connections[i / PER_CONNECTION].clone();
        tasks.push(tokio::spawn(node(
            c,
            server.url.clone(),
            nd.clone(),
            want,
            opened.clone(),
            retries.clone(),
            armed.clone(),
        )));
    }
    let bound = Instant::now() + Duration::from_secs(120);
    while (opened.load(Ordering::Relaxed) as usize) < n && Instant::now() < bound {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "{}/{n} streams open after {:.1} s",
        opened.load(Ordering::Relaxed),
        open_start.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = server.child.id();
    let cpu_before = cpu_secs(pid);
    let client_before = cpu_secs(std::process::id());
    arm.send_replace(true);
    let t0 = Instant::now();
    let version = put_policy(&server, &http, &domain, &after).await?;
    let committed = t0.elapsed().as_secs_f64() * 1000.0;
    if version != want {
        return Err(format!("stored version {version}, expected {want}").into());
    }
    let mut lat = Vec::new();
    let (mut failed, mut peers) = (Vec::new(), 0usize);
    let deadline = tokio::time::Instant::now() + ENFORCE_BOUND;
    for t in tasks {
        match tokio::time::timeout_at(deadline, t).await {
            Ok(Ok(Ok((at, p)))) => {
                lat.push(at.duration_since(t0).as_secs_f64() * 1000.0);
                peers += p;
            }
            Ok(Ok(Err(e))) => failed.push(e),
            Ok(Err(e)) => failed.push(e.to_string()),
            Err(_) => failed.push("not enforced within the bound".into()),
        }
    }
    let cpu = match (cpu_before, cpu_secs(pid)) {
        (Some(a), Some(b)) => format!("{:.1}", b - a),
        _ => "-".into(),
    };
    let client_cpu = match (client_before, cpu_secs(std::process::id())) {
        (Some(a), Some(b)) => format!("{:.1}", b - a),
        _ => "-".into(),
    };
    lat.sort_by(f64::total_cmp);
    for e in failed.iter().take(5) {
        eprintln!("a node failed: {e}");
    }
    println!(
        "| {n} | {} | {:.0} | {}/{n} | {:.0} | {:.0} | {:.0} | {cpu} | {client_cpu} | {} | {} |",
        if args.tags {
            "100 tags, each reaches 2"
        } else {
            "allow-all"
        },
        peers as f64 / lat.len().max(1) as f64,
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN),
        format_args!("{committed:.0}"),
        retries.load(Ordering::Relaxed),
    );
    stop(&mut server.child);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let args = parse_args()?;
    println!(
        "| nodes | policy | peers per state | nodes enforcing | p50 ms | p99 ms | max ms | server CPU s | bench client CPU s | PUT answered ms | state pulls answered 503 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for &n in &args.nodes {
        run_one(&args, n).await?;
    }
    Ok(())
}
