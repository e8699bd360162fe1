//! The opt-in Prometheus listener (`metrics.listen`, docs/metrics.md): `GET /metrics` over
//! plain HTTP/1.1, one request per connection. A scrape asks the loop for the same report
//! `plexd status` shows (nothing is counted on the packet path; the data plane's counters are
//! read when the report is built) and encodes it with `prometheus-client`, the official Rust
//! client, into a fresh registry: [`render`] is a pure function of the report.
//!
//! Labels are bounded by the signed state: a peer's node id (never its hostname or anything
//! else free-form from the network) and a closed list of paths.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::core::protocol::{Answer, Request};
use super::input::Input;
use super::status::{PathTransport, PeerPath, StatusReport};

/// The longest request head (request line and headers) the listener reads.
pub const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// How long a client gets to send its request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a scrape waits for the loop's report.
pub const REPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// Scrapes served at once; a connection beyond this is closed at once.
pub const MAX_CONNECTIONS: usize = 4;

const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PathLabel {
    path: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PeerLabel {
    peer: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DropLabels {
    direction: &'static str,
    reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PeerPathLabels {
    peer: String,
    path: &'static str,
}

/// Every value the `path` label takes.
pub const PATHS: [&str; 4] = ["direct", "relay_udp", "relay_tcp", "none"];

fn path_name(p: &PeerPath) -> &'static str {
    match p {
        PeerPath::None => "none",
        PeerPath::Direct { .. } => "direct",
        PeerPath::Relay {
            transport: PathTransport::Udp,
            ..
        } => "relay_udp",
        PeerPath::Relay {
            transport: PathTransport::Tcp,
            ..
        } => "relay_tcp",
    }
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let g: Gauge = Gauge::default();
    g.set(value);
    registry.register(name, help, g);
}

/// The exposition of one status report (Prometheus text format 0.0.4).
pub fn render(r: &StatusReport) -> Result<String, std::fmt::Error> {
    let mut reg = Registry::with_prefix("plexd");
    gauge(&mut reg, "up", "1 while the daemon answers", 1);
    gauge(
        &mut reg,
        "uptime_seconds",
        "Seconds since plexd started",
        int(r.uptime_secs),
    );
    gauge(
        &mut reg,
        "api_reachable",
        "1 when the last call to the control plane was answered",
        i64::from(r.api.reachable),
    );
    gauge(
        &mut reg,
        "event_stream_connected",
        "1 while the event stream is connected",
        i64::from(r.event_stream_connected),
    );
    let reconnects: Counter = Counter::default();
    reconnects.inc_by(r.event_stream_disconnects);
    reg.register(
        "event_stream_reconnects",
        "Times the event stream ended and was retried since plexd started",
        reconnects,
    );
    // -1: no signed state applied yet.
    gauge(
        &mut reg,
        "state_version",
        "Version of the applied signed state (-1: none yet)",
        r.state_version.map_or(-1, int),
    );
    gauge(
        &mut reg,
        "last_event_id",
        "The last event seq applied (the stream resumes after it)",
        int(r.last_event_id),
    );
    gauge(
        &mut reg,
        "ingest_queue_length",
        "Observations waiting to be sent to the control plane",
        int(u64::try_from(r.ingest.waiting).unwrap_or(u64::MAX)),
    );
    gauge(
        &mut reg,
        "ingest_dropped_unreported",
        "Observations dropped (queue full) and not yet reported to the control plane",
        int(r.ingest.dropped_unreported),
    );
    gauge(
        &mut reg,
        "peers",
        "Peers in the applied state",
        int(u64::try_from(r.peers.len()).unwrap_or(u64::MAX)),
    );

    let by_path: Family<PathLabel, Gauge> = Family::default();
    for path in PATHS {
        by_path.get_or_create(&PathLabel { path }).set(0);
    }
    let path: Family<PeerPathLabels, Gauge> = Family::default();
    let handshake: Family<PeerLabel, Gauge> = Family::default();
    let rx: Family<PeerLabel, Counter> = Family::default();
    let tx: Family<PeerLabel, Counter> = Family::default();
    let rtt: Family<PeerLabel, Gauge> = Family::default();
    for p in &r.peers {
        let name = path_name(&p.path);
        by_path.get_or_create(&PathLabel { path: name }).inc();
        let peer = p.node_id.to_string();
        path.get_or_create(&PeerPathLabels {
            peer: peer.clone(),
            path: name,
        })
        .set(1);
        let one = PeerLabel { peer };
        if let Some(age) = p.last_handshake_age_secs {
            handshake.get_or_create(&one).set(int(age));
        }
        if let Some(ms) = p.rtt_ms {
            rtt.get_or_create(&one).set(int(ms));
        }
        rx.get_or_create(&one).inc_by(p.rx_bytes);
        tx.get_or_create(&one).inc_by(p.tx_bytes);
    }
    reg.register(
        "peers_by_path",
        "Peers by the path their traffic takes",
        by_path,
    );
    reg.register("peer_path", "1 for the path a peer's traffic takes", path);
    reg.register(
        "peer_last_handshake_age_seconds",
        "Seconds since the last WireGuard handshake with a peer (absent: none yet)",
        handshake,
    );
    reg.register(
        "peer_rtt_milliseconds",
        "Round trip of the last probe on a peer's path",
        rtt,
    );
    reg.register("peer_rx_bytes", "Bytes received from a peer", rx);
    reg.register("peer_tx_bytes", "Bytes sent to a peer", tx);
    if let Some(p) = &r.policy {
        policy_metrics(&mut reg, p);
    }
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &reg)?;
    Ok(out)
}

/// The access policy: its version, whether the filter is closed, drops per reason (labels:
/// two directions and the data plane's closed list of reasons).
fn policy_metrics(reg: &mut Registry, p: &super::policy_status::PolicyStatus) {
    use super::policy_status::FilterState;
    gauge(
        reg,
        "policy_version",
        "Version of the access policy the node enforces (-1: the control plane sends none)",
        p.version.map_or(-1, int),
    );
    gauge(
        reg,
        "policy_filter_closed",
        "1 while the policy filter could not be installed and nothing passes to or from any peer",
        i64::from(p.filter == FilterState::Closed),
    );
    if let Some(n) = p.flows {
        gauge(
            reg,
            "policy_flows",
            "Flows in the policy's flow table",
            int(u64::try_from(n).unwrap_or(u64::MAX)),
        );
    }
    let drops: Family<DropLabels, Counter> = Family::default();
    for d in &p.drops {
        for (direction, n) in [("inbound", d.inbound), ("outbound", d.outbound)] {
            drops
                .get_or_create(&DropLabels {
                    direction,
                    reason: d.reason.clone(),
                })
                .inc_by(n);
        }
    }
    reg.register(
        "policy_dropped_packets",
        "Packets the access policy's filter dropped, by direction and reason",
        drops,
    );
}

/// Binds the listener (before the loop starts, so a taken port is a clear error at start).
pub async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr).await.map_err(|e| {
        format!("cannot listen for metrics on {addr} (metrics.listen): {e}; pick a free address or remove metrics.listen")
    })
}

/// Accepts scrapes until the task is aborted.
pub async fn serve(listener: TcpListener, tx: mpsc::Sender<Input>) {
    let slots = std::sync::Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "metrics: too many scrapes at once; closing");
            continue;
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = handle(stream, tx).await {
                tracing::debug!(%peer, error = %e, "metrics client");
            }
        });
    }
}

/// What the request line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    Metrics,
    NotFound,
    WrongMethod,
    Bad,
}

/// Reads the request line from a complete head.
fn parse_head(head: &[u8]) -> Asked {
    let Some(line) = head.split(|b| *b == b'\n').next() else {
        return Asked::Bad;
    };
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end().split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Asked::Bad;
    };
    if !version.starts_with("HTTP/1.") {
        return Asked::Bad;
    }
    let path = target.split('?').next().unwrap_or(target);
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => Asked::Metrics,
        (_, "/metrics") => Asked::WrongMethod,
        _ => Asked::NotFound,
    }
}

/// Reads until the end of the head, at most [`MAX_REQUEST_HEAD`] bytes.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            return Ok(Some(buf));
        }
        if buf.len() > MAX_REQUEST_HEAD {
            return Ok(None);
        }
    }
}

async fn handle(mut stream: TcpStream, tx: mpsc::Sender<Input>) -> std::io::Result<()> {
    let head = match tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream)).await {
        Ok(head) => head?,
        Err(_) => None,
    };
    let (status, ctype, body) = match head.as_deref().map(parse_head) {
        None | Some(Asked::Bad) => (
            "400 Bad Request",
            "text/plain",
            format!("not an HTTP/1 request head of at most {MAX_REQUEST_HEAD} bytes\n"),
        ),
        Some(Asked::NotFound) => (
            "404 Not Found",
            "text/plain",
            "plexd serves GET /metrics here\n".to_owned(),
        ),
        Some(Asked::WrongMethod) => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET /metrics\n".to_owned(),
        ),
        Some(Asked::Metrics) => match scrape(&tx).await {
            Ok(text) => ("200 OK", CONTENT_TYPE, text),
            Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
        },
    };
    let head_only = head.as_deref().is_some_and(|h| h.starts_with(b"HEAD "));
    let mut answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        answer.push_str(&body);
    }
    stream.write_all(answer.as_bytes()).await?;
    stream.shutdown().await
}

/// Asks the loop for the status report and renders it.
async fn scrape(tx: &mpsc::Sender<Input>) -> Result<String, String> {
    let (atx, arx) = oneshot::channel();
    tx.send(Input::Control(Request::Status, atx))
        .await
        .map_err(|_| "plexd is stopping".to_owned())?;
    let answer = tokio::time::timeout(REPORT_TIMEOUT, arx)
        .await
        .map_err(|_| {
            format!(
                "the daemon did not report within {} s",
                REPORT_TIMEOUT.as_secs()
            )
        })?
        .map_err(|_| "plexd is stopping".to_owned())?;
    match answer {
        Answer::Status(report) => {
            render(&report).map_err(|_| "cannot encode the metrics".to_owned())
        }
        Answer::Error { message, .. } => Err(message),
        other => Err(format!("unexpected answer from the daemon: {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_renders_with_bounded_labels() {
        let text = render(&super::super::status::tests::report()).unwrap_or_default();
        let peer = "peer=\"019a0816-0000-7000-8000-000000000003\"";
        for line in [
            "plexd_up 1".to_owned(),
            "plexd_peers 1".to_owned(),
            "plexd_state_version 7".to_owned(),
            "plexd_event_stream_connected 0".to_owned(),
            "plexd_event_stream_reconnects_total 0".to_owned(),
            "plexd_ingest_queue_length 3".to_owned(),
            "plexd_peers_by_path{path=\"relay_udp\"} 1".to_owned(),
            "plexd_peers_by_path{path=\"direct\"} 0".to_owned(),
            format!("plexd_peer_path{{{peer},path=\"relay_udp\"}} 1"),
            format!("plexd_peer_tx_bytes_total{{{peer}}} 1200"),
            format!("plexd_peer_rtt_milliseconds{{{peer}}} 21"),
            "# TYPE plexd_peer_rx_bytes_total counter".to_owned(),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in\n{text}"
            );
        }
        // No handshake yet: no sample (not a made-up 0); no hostname anywhere.
        assert!(
            !text.contains("plexd_peer_last_handshake_age_seconds{"),
            "{text}"
        );
        assert!(!text.contains("web-3"), "{text}");
    }

    #[test]
    fn the_policy_renders_its_version_closed_filter_and_drops() {
        use super::super::policy_status::{DropCount, FilterState, PolicyStatus};
        let mut r = super::super::status::tests::report();
        r.policy = Some(PolicyStatus {
            version: Some(5),
            filter: FilterState::Closed,
            why: Some("x".into()),
            peers: 1,
            flows: Some(2),
            drops: vec![DropCount {
                reason: "no_rule".into(),
                inbound: 4,
                outbound: 1,
            }],
        });
        let text = render(&r).unwrap_or_default();
        for line in [
            "plexd_policy_version 5",
            "plexd_policy_filter_closed 1",
            "plexd_policy_flows 2",
            "plexd_policy_dropped_packets_total{direction=\"inbound\",reason=\"no_rule\"} 4",
            "plexd_policy_dropped_packets_total{direction=\"outbound\",reason=\"no_rule\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn the_request_line_decides() {
        assert_eq!(
            parse_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Asked::Metrics
        );
        assert_eq!(
            parse_head(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Asked::Metrics
        );
        assert_eq!(parse_head(b"GET / HTTP/1.1\r\n\r\n"), Asked::NotFound);
        assert_eq!(
            parse_head(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Asked::WrongMethod
        );
        assert_eq!(parse_head(b"GET /metrics\r\n\r\n"), Asked::Bad);
        assert_eq!(parse_head(b"\x16\x03\x01 tls"), Asked::Bad);
    }
}
