//! The event fan-out benchmark (docs/benchmarks.md "Event fan-out"): N open event streams,
//! events committed through the normal write path, commit-to-delivery on every stream.
//!
//! It starts `plexsphere dev` as its own process (so the server's CPU is its own, read from
//! /proc), registers N+1 nodes, opens one stream for each of N of them (real HTTP/2 clients
//! over TLS, `--per-connection` streams per connection), then lets the last node change its
//! endpoint `--events` times, one at a time: each change is one committed event for every
//! stream. For each event it takes the time just before the `POST /endpoints` is sent and the
//! time each stream's frame arrives, and prints p50/p99/max over all deliveries and the
//! server's CPU-seconds per delivered event.
//!
//! ```text
//! cargo build --release -p plexsphere --bin plexsphere --example fanout_bench
//! target/release/examples/fanout_bench --server-bin target/release/plexsphere --streams 1000,10000
//!     [--database-url postgres://...]           # a fresh database; default: SQLite in a temp dir
//!     [--api-url https://a,https://b --ca-file F --operator-token-file F]  # running replicas
//!     [--envelopes domain|node]    # what the streams ask for (default domain, as plexd)
//!     [--per-connection 1 --restart]  # a reconnect storm: see below
//! ```
//!
//! `--envelopes node` opens the streams as a node that does not send
//! `plexsphere-event-envelopes: domain` (each stream's events signed for its node, as before the
//! Domain envelopes); `domain` as plexd does (one signed copy per event for every stream).
//!
//! A reconnect storm: `--per-connection 1` gives every stream its own TCP and TLS connection
//! (every node of a fleet is its own client), and `--restart` stops the server (SIGTERM) and
//! starts it again on the same port and data directory before each stream count, then opens
//! all the streams at once the moment it listens, as a fleet does after a restart. The
//! "streams failed" column counts every stream that did not open (a reset, a refused
//! connection, a timeout, a status other than 200), and the run prints their reasons.
//!
//! With `--api-url` it starts nothing: the streams are spread over the URLs (e.g. three
//! replicas behind HAProxy, or the replicas themselves), the writer uses the first, and the
//! CPU column is left out unless `--server-pid` names the server processes.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject as _;
use serde_json::{Value, json};
use tokio::sync::watch;

type Failure = Box<dyn std::error::Error + Send + Sync>;

const LAB_NODES: &str = "019a0816-0000-7000-8000-000000000002";
/// How long one event may take to reach every stream before the run counts it as lost.
const DELIVERY_BOUND: Duration = Duration::from_secs(30);
/// Registrations in flight at once.
const REGISTER_PARALLEL: usize = 32;

struct Args {
    streams: Vec<usize>,
    events: u32,
    per_connection: usize,
    server_bin: String,
    database_url: Option<String>,
    api_urls: Vec<String>,
    ca_file: Option<String>,
    token_file: Option<String>,
    server_pids: Vec<u32>,
    domain_envelopes: bool,
    restart: bool,
}

fn parse_args() -> Result<Args, Failure> {
    let mut a = Args {
        streams: vec![1000],
        events: 20,
        per_connection: 100,
        server_bin: "target/release/plexsphere".into(),
        database_url: None,
        api_urls: Vec::new(),
        ca_file: None,
        token_file: None,
        server_pids: Vec::new(),
        domain_envelopes: true,
        restart: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--streams" => {
                a.streams = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--events" => a.events = value()?.parse()?,
            "--per-connection" => a.per_connection = value()?.parse::<usize>()?.max(1),
            "--server-bin" => a.server_bin = value()?,
            "--database-url" => a.database_url = Some(value()?),
            "--api-url" => a.api_urls = value()?.split(',').map(str::to_owned).collect(),
            "--ca-file" => a.ca_file = Some(value()?),
            "--operator-token-file" => a.token_file = Some(value()?),
            "--server-pid" => {
                a.server_pids = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--envelopes" => {
                a.domain_envelopes = match value()?.as_str() {
                    "domain" => true,
                    "node" => false,
                    other => return Err(format!("--envelopes {other:?}: domain or node").into()),
                }
            }
            "--restart" => a.restart = true,
            other => return Err(format!("unknown flag {other:?} (see the file's header)").into()),
        }
    }
    Ok(a)
}

/// The server under test: started here, or named by `--api-url`.
struct Target {
    urls: Vec<String>,
    ca_pem: String,
    operator_token: String,
    pids: Vec<u32>,
    child: Option<Child>,
    /// The data directory and port of the server started here (kept across a restart).
    dev: Option<(tempfile::TempDir, u16)>,
}

fn start_dev(args: &Args) -> Result<Target, Failure> {
    let dir = tempfile::Builder::new().prefix("fo-bench-").tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let (child, url, ca_pem, operator_token) = spawn_dev(args, dir.path(), port)?;
    Ok(Target {
        urls: vec![url],
        ca_pem,
        operator_token,
        pids: vec![child.id()],
        child: Some(child),
        dev: Some((dir, port)),
    })
}

/// Stops the server started here and starts it again on the same port and data directory;
/// answers once it listens.
fn restart(t: &mut Target, args: &Args) -> Result<(), Failure> {
    let (dir, port) = t
        .dev
        .as_ref()
        .ok_or("--restart needs the server started here")?;
    if let Some(mut child) = t.child.take() {
        stop(&mut child);
    }
    let (child, url, _, _) = spawn_dev(args, dir.path(), *port)?;
    eprintln!("restarted the server (pid {}) at {url}", child.id());
    t.pids = vec![child.id()];
    t.child = Some(child);
    Ok(())
}

fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// `plexsphere dev` on `port`: the child, its API URL, CA and operator token.
fn spawn_dev(
    args: &Args,
    dir: &std::path::Path,
    port: u16,
) -> Result<(Child, String, String, String), Failure> {
    let mut cmd = Command::new(&args.server_bin);
    cmd.env("PLEXSPHERE_NO_LOCAL_MACHINES", "1")
        .args([
            "dev",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(dir)
        .args(["--register-burst", "1000000", "--register-refill-secs", "1"])
        .args(["--log-level", "warn"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(url) = &args.database_url {
        cmd.args(["--database-url", url]);
    }
    let mut child = cmd.spawn()?;
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
    Ok((
        child,
        url,
        std::fs::read_to_string(ca)?,
        std::fs::read_to_string(token)?.trim().to_owned(),
    ))
}

fn attach(args: &Args) -> Result<Target, Failure> {
    let ca = args.ca_file.as_ref().ok_or("--api-url needs --ca-file")?;
    let token = args
        .token_file
        .as_ref()
        .ok_or("--api-url needs --operator-token-file")?;
    Ok(Target {
        urls: args.api_urls.clone(),
        ca_pem: std::fs::read_to_string(ca)?,
        operator_token: std::fs::read_to_string(token)?.trim().to_owned(),
        pids: args.server_pids.clone(),
        child: None,
        dev: None,
    })
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

/// The client for `url`: HTTP/2 over TLS, or HTTP/2 without TLS for an `http://` replica
/// behind a TLS-terminating proxy (h2c, as the streams of one connection share it).
fn client_for(url: &str, ca_pem: &str) -> Result<reqwest::Client, Failure> {
    if url.starts_with("http://") {
        plexsphere::tls::install_ring_provider();
        return Ok(reqwest::Client::builder().http2_prior_knowledge().build()?);
    }
    client(ca_pem)
}

/// The CPU-seconds (user + system) the processes used so far.
fn cpu_secs(pids: &[u32]) -> Option<f64> {
    let tick = 100.0; // USER_HZ on Linux
    let mut total = 0.0;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the command: state is field 3, utime 14, stime 15 (1-based over the line).
        let utime: f64 = fields.get(11)?.parse().ok()?;
        let stime: f64 = fields.get(12)?.parse().ok()?;
        total += (utime + stime) / tick;
    }
    Some(total)
}

struct Node {
    id: String,
    credential: String,
}

async fn register_nodes(
    t: &Target,
    http: &reqwest::Client,
    n: usize,
) -> Result<Vec<Node>, Failure> {
    let base = &t.urls[0];
    let mut tokens = Vec::new();
    for _ in 0..n.div_ceil(1000) {
        let r: Value = http
            .post(format!("{base}/v1/projects/{LAB_NODES}/bootstrap-tokens"))
            .bearer_auth(&t.operator_token)
            .json(&json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 7200, "max_uses": 1000}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        tokens.push(
            r["token"]
                .as_str()
                .ok_or("no token in the answer")?
                .to_owned(),
        );
    }
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..REGISTER_PARALLEL {
        let (http, next, tokens, base) = (http.clone(), next.clone(), tokens.clone(), base.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= n {
                    return Ok::<_, Failure>(out);
                }
                let mut secret = [0u8; 32];
                secret[..8].copy_from_slice(&(i as u64 + 1).to_be_bytes());
                secret[31] = 0x5a;
                let key = plexsphere_wire::reach::public_key(&secret);
                let token = &tokens[i / 1000];
                // Every registration proves its key over a challenge of its token.
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
                        "hostname": format!("fo-{i}"),
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
                out.push(Node {
                    id: r["node_id"].as_str().ok_or("no node_id")?.to_owned(),
                    credential: r["node_credential"]
                        .as_str()
                        .ok_or("no credential")?
                        .to_owned(),
                });
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

/// What one stream saw: (seq, arrival) of every event frame, and whether it ended early.
struct Seen {
    frames: Vec<(u64, Instant)>,
    failed: Option<String>,
}

async fn stream(
    http: reqwest::Client,
    url: String,
    node: Arc<Node>,
    domain_envelopes: bool,
    opened: Arc<AtomicU64>,
    delivered: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) -> Seen {
    let mut seen = Seen {
        frames: Vec::new(),
        failed: None,
    };
    let mut req = http
        .get(format!("{url}/v1/nodes/{}/events", node.id))
        .bearer_auth(&node.credential);
    if domain_envelopes {
        req = req.header("plexsphere-event-envelopes", "domain");
    }
    let resp = req.send().await;
    let mut resp = match resp {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            seen.failed = Some(format!("status {}", r.status()));
            return seen;
        }
        Err(e) => {
            seen.failed = Some(error_chain(&e));
            return seen;
        }
    };
    opened.fetch_add(1, Ordering::Relaxed);
    let mut buf = String::new();
    loop {
        let chunk = tokio::select! {
            c = resp.chunk() => c,
            _ = stop.wait_for(|s| *s) => return seen,
        };
        match chunk {
            Ok(Some(bytes)) => {
                let now = Instant::now();
                buf.push_str(&String::from_utf8_lossy(&bytes));
                while let Some(end) = buf.find("\n\n") {
                    let block: String = buf.drain(..end + 2).collect();
                    if let Some(id) = block.lines().find_map(|l| l.strip_prefix("id:"))
                        && let Ok(seq) = id.trim().parse()
                    {
                        seen.frames.push((seq, now));
                        delivered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Ok(None) => {
                seen.failed = Some("the server ended the stream".into());
                return seen;
            }
            Err(e) => {
                seen.failed = Some(error_chain(&e));
                return seen;
            }
        }
    }
}

/// An error with its sources (reqwest's own message hides a reset behind "error sending").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn run_one(
    t: &Target,
    args: &Args,
    nodes: &[Arc<Node>],
    writer: &Node,
    n: usize,
) -> Result<(), Failure> {
    let opened = Arc::new(AtomicU64::new(0));
    let delivered = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop) = watch::channel(false);
    let mut tasks = Vec::new();
    let open_start = Instant::now();
    let mut connections: Vec<reqwest::Client> = Vec::new();
    for (i, node) in nodes[..n].iter().enumerate() {
        let conn = i / args.per_connection;
        let url = t.urls[conn % t.urls.len()].clone();
        if connections.len() <= conn {
            connections.push(client_for(&url, &t.ca_pem)?);
        }
        let http = &connections[conn];
        tasks.push(tokio::spawn(stream(
            http.clone(),
            url,
            node.clone(),
            args.domain_envelopes,
            opened.clone(),
            delivered.clone(),
            stop.clone(),
        )));
    }
    let bound = Instant::now() + Duration::from_secs(120);
    while (opened.load(Ordering::Relaxed) as usize) < n && Instant::now() < bound {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let open_secs = open_start.elapsed().as_secs_f64();
    let open_now = opened.load(Ordering::Relaxed) as usize;
    eprintln!("{open_now}/{n} streams open after {open_secs:.1} s");
    tokio::time::sleep(Duration::from_secs(1)).await;

    let writer_http = client_for(&t.urls[0], &t.ca_pem)?;
    let cpu_before = cpu_secs(&t.pids);
    let mut sent = Vec::new();
    let base_delivered = delivered.load(Ordering::Relaxed);
    let mut lost_events = 0;
    for k in 0..args.events {
        let want = base_delivered + (u64::from(k) + 1) * open_now as u64;
        let at = Instant::now();
        writer_http
            .post(format!("{}/v1/nodes/{}/endpoints", t.urls[0], writer.id))
            .bearer_auth(&writer.credential)
            .json(&json!({"listen_port": 51820, "addresses": [format!("198.51.100.{}", k % 250 + 1)]}))
            .send()
            .await?
            .error_for_status()?;
        sent.push(at);
        let bound = at + DELIVERY_BOUND;
        while delivered.load(Ordering::Relaxed) < want && Instant::now() < bound {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if delivered.load(Ordering::Relaxed) < want {
            lost_events += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cpu_after = cpu_secs(&t.pids);
    stop_tx.send_replace(true);
    let mut seens = Vec::new();
    for task in tasks {
        seens.push(task.await?);
    }
    // Event k is the k-th distinct seq the streams saw during the run.
    let mut seqs: Vec<u64> = seens
        .iter()
        .flat_map(|s| s.frames.iter().map(|f| f.0))
        .collect();
    seqs.sort_unstable();
    seqs.dedup();
    let mut lat = Vec::new();
    let mut per_event = vec![0f64; sent.len()];
    let (mut dupes, mut failed) = (0usize, 0usize);
    for s in &seens {
        if s.failed.is_some() {
            failed += 1;
        }
        let mut mine: Vec<u64> = s.frames.iter().map(|f| f.0).collect();
        mine.dedup();
        dupes += s.frames.len() - mine.len();
        for (seq, at) in &s.frames {
            if let Ok(k) = seqs.binary_search(seq)
                && let Some(sent) = sent.get(k)
            {
                let ms = at.duration_since(*sent).as_secs_f64() * 1000.0;
                lat.push(ms);
                per_event[k] = per_event[k].max(ms);
            }
        }
    }
    let per_event: Vec<String> = per_event.iter().map(|ms| format!("{ms:.0}")).collect();
    eprintln!(
        "slowest delivery of each event, ms: {}",
        per_event.join(" ")
    );
    lat.sort_by(f64::total_cmp);
    let deliveries = lat.len();
    let cpu = match (cpu_before, cpu_after) {
        (Some(a), Some(b)) if deliveries > 0 => format!("{:.1}", (b - a) / deliveries as f64 * 1e6),
        _ => "-".into(),
    };
    let mut reasons: std::collections::BTreeMap<&str, usize> = Default::default();
    for reason in seens.iter().filter_map(|s| s.failed.as_deref()) {
        *reasons.entry(reason).or_default() += 1;
    }
    for (reason, count) in &reasons {
        eprintln!("{count} streams failed: {reason}");
    }
    println!(
        "| {n} | {} | {deliveries} / {} | {:.1} | {:.1} | {:.1} | {cpu} | {lost_events} | {dupes} | {failed} | {open_secs:.1} |",
        args.events,
        open_now * args.events as usize,
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN),
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let args = parse_args()?;
    let mut target = if args.api_urls.is_empty() {
        start_dev(&args)?
    } else {
        attach(&args)?
    };
    let max = args.streams.iter().copied().max().unwrap_or(0);
    let http = client_for(&target.urls[0], &target.ca_pem)?;
    let mut nodes = register_nodes(&target, &http, max + 1).await?;
    let writer = nodes.pop().ok_or("no writer node")?;
    let nodes: Vec<Arc<Node>> = nodes.into_iter().map(Arc::new).collect();
    println!(
        "| streams | events | deliveries / expected | p50 ms | p99 ms | max ms | server CPU µs per delivery | events not delivered everywhere in {} s | duplicates | streams failed | open s |",
        DELIVERY_BOUND.as_secs()
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for &n in &args.streams {
        if args.restart {
            restart(&mut target, &args)?;
        }
        run_one(&target, &args, &nodes, &writer, n).await?;
        // Let the server notice the closed streams before the next size.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    if let Some(mut child) = target.child.take() {
        stop(&mut child);
    }
    Ok(())
}
