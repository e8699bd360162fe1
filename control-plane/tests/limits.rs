//! The robustness limits of one replica over the real server (docs/api.md, "Limits"): the
//! registration 429 over HTTP/2 and HTTP/1.1 with real curl, the header-read and idle
//! timeouts with a raw socket, the connection cap, every X-Forwarded-For line, IPv6 clients
//! per /64, and the node routes' budget.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use plexsphere::ratelimit::RateLimit;
use plexsphere::server::{self, ServerLimits, Transport};
use reqwest::StatusCode;
use serde_json::Value;

/// How long a test waits for something the server must do by itself.
const BOUND: Duration = Duration::from_secs(20);

fn small_budget(burst: u32) -> RateLimit {
    RateLimit {
        burst,
        refill: Duration::from_secs(600),
    }
}

/// A registration body of about 12 KiB (under the 16 KiB limit): big enough that curl is still
/// sending it when a handler that ignored the body would already have answered.
fn big_register_body() -> String {
    let pad = "a".repeat(12 * 1024);
    serde_json::json!({
        "bootstrap_token": "pxbt_lab_node_0123456789abcdef_nope",
        "wg_public_key": wg_key(1),
        "hostname": pad,
    })
    .to_string()
}

/// One `curl` registration attempt: its exit code, the status line's code and Retry-After.
fn curl_register(
    srv: &TestServer,
    ca: &std::path::Path,
    body: &std::path::Path,
    http: &str,
) -> (i32, String, Option<String>, String) {
    let out = Command::new("curl")
        .args(["-sS", http, "--cacert"])
        .arg(ca)
        .args([
            "-D",
            "-",
            "-o",
            "/dev/null",
            "-H",
            "content-type: application/json",
        ])
        .arg("--data-binary")
        .arg(format!("@{}", body.display()))
        .arg(srv.url("/v1/register"))
        .output()
        .expect("curl is installed (Debian package curl)");
    let head = String::from_utf8_lossy(&out.stdout).to_string();
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("")
        .to_owned();
    let retry = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("retry-after")
            .then(|| v.trim().to_owned())
    });
    (
        out.status.code().unwrap_or(-1),
        status,
        retry,
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Before the fix, Debian 12's curl over HTTP/2 mostly got "Stream error in the HTTP/2
/// framing layer" (exit 92) once past the budget: the 429 was answered before the body was
/// read and hyper reset the stream while curl was still sending it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_past_the_registration_budget_gets_429_with_retry_after_over_http2_and_http1() {
    let srv = TestServer::start_with(Options {
        rate_limit: small_budget(2),
        ..Options::default()
    })
    .await;
    let ca = srv.dir.path().join("lm-ca.pem");
    std::fs::write(&ca, &srv.ca_pem).unwrap();
    let body = srv.dir.path().join("lm-body.json");
    std::fs::write(&body, big_register_body()).unwrap();
    let (srv_ref, ca_ref, body_ref) = (&srv, ca.as_path(), body.as_path());
    let answers = tokio::task::block_in_place(|| {
        let mut answers = Vec::new();
        for http in ["--http2", "--http1.1"] {
            for _ in 0..12 {
                answers.push((http, curl_register(srv_ref, ca_ref, body_ref, http)));
            }
        }
        answers
    });
    let mut limited = 0;
    for (http, (code, status, retry, stderr)) in &answers {
        assert_eq!(*code, 0, "{http}: curl failed: {stderr}");
        if status == "429" {
            limited += 1;
            let secs: u64 = retry
                .as_deref()
                .expect("Retry-After on a 429")
                .parse()
                .unwrap();
            assert!((1..=600).contains(&secs), "{http}: Retry-After {secs}");
        } else {
            // The first two of the budget reach the handler, which refuses the body.
            assert!(status.starts_with('4'), "{http}: {status}");
        }
    }
    // 2 through, every other attempt (22) refused with a clean 429.
    assert_eq!(limited, 22, "{answers:?}");
    srv.stop().await;
}

/// A plain-HTTP server on the test server's state with `limits`: its address and a stop.
async fn plain_server(
    srv: &TestServer,
    limits: ServerLimits,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server::run_with(
        listener,
        Transport::PlainBehindProxy,
        plexsphere::api::router(srv.state.clone()),
        async move {
            let _ = rx.await;
        },
        limits,
    ));
    (addr, tx)
}

/// Whether the server closed `conn` (EOF or reset) within `bound`, reading what it sends.
fn closed_within(conn: &mut TcpStream, bound: Duration) -> (bool, String) {
    conn.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + bound;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match conn.read(&mut buf) {
            Ok(0) => return (true, String::from_utf8_lossy(&got).to_string()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return (true, String::from_utf8_lossy(&got).to_string()),
        }
    }
    (false, String::from_utf8_lossy(&got).to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_its_header_or_idling_is_cut_off_at_the_header_read_timeout() {
    let srv = TestServer::start().await;
    let limits = ServerLimits {
        header_read_timeout: Duration::from_secs(1),
        ..ServerLimits::default()
    };
    let (addr, stop) = plain_server(&srv, limits).await;
    tokio::task::block_in_place(|| {
        // A prompt client is served.
        let mut ok = TcpStream::connect(addr).unwrap();
        ok.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .unwrap();
        let (closed, answer) = closed_within(&mut ok, BOUND);
        assert!(closed && answer.starts_with("HTTP/1.1 200"), "{answer}");

        // One header byte every 300 ms: the connection is closed before the header is done,
        // although the client never stops sending.
        let mut slow = TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
        slow.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let header =
            b"x-trickle: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        let mut cut_off = false;
        for byte in header.iter().cycle().take(200) {
            if slow.write_all(&[*byte]).is_err() {
                cut_off = true;
                break;
            }
            let mut buf = [0u8; 256];
            match slow.read(&mut buf) {
                Ok(0) => {
                    cut_off = true;
                    break;
                }
                Ok(_) => panic!("the server answered a request whose header never ended"),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => {
                    cut_off = true;
                    break;
                }
            }
        }
        assert!(
            cut_off,
            "a trickling client held its connection for 200 header bytes (60 s)"
        );

        // A keep-alive connection idle after its answer is closed too.
        let mut idle = TcpStream::connect(addr).unwrap();
        idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        let (closed, answer) = closed_within(&mut idle, BOUND);
        assert!(
            closed,
            "an idle keep-alive connection stayed open: {answer}"
        );
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    });
    let _ = stop.send(());
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_connection_cap_a_request_gets_503_with_retry_after_and_its_connection_closes() {
    let srv = TestServer::start().await;
    let limits = ServerLimits {
        max_connections: 2,
        ..ServerLimits::default()
    };
    let (addr, stop) = plain_server(&srv, limits).await;
    tokio::task::block_in_place(|| {
        let request = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n";
        let read_answer = |c: &mut TcpStream| {
            c.set_read_timeout(Some(BOUND)).unwrap();
            let mut buf = [0u8; 4096];
            let n = c.read(&mut buf).unwrap();
            String::from_utf8_lossy(&buf[..n]).to_string()
        };
        // Two connections held open (keep-alive), each served.
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(request).unwrap();
            let a = read_answer(&mut c);
            assert!(a.starts_with("HTTP/1.1 200"), "{a}");
            held.push(c);
        }
        // The third is over the cap.
        let mut third = TcpStream::connect(addr).unwrap();
        third.write_all(request).unwrap();
        let (closed, answer) = closed_within(&mut third, BOUND);
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        let lower = answer.to_ascii_lowercase();
        assert!(lower.contains("retry-after: 5"), "{answer}");
        assert!(lower.contains("connection: close"), "{answer}");
        assert!(answer.contains("\"unavailable\""), "{answer}");
        assert!(answer.contains("connections open"), "{answer}");
        assert!(closed, "the refused connection stayed open");
        // One held connection goes: a new one is served again.
        drop(held.pop());
        let deadline = Instant::now() + BOUND;
        loop {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(request).unwrap();
            let a = read_answer(&mut c);
            if a.starts_with("HTTP/1.1 200") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "still refused after a connection closed: {a}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let _ = stop.send(());
    srv.stop().await;
}

/// Sends a registration attempt with these `X-Forwarded-For` lines.
async fn register_via(srv: &TestServer, lines: &[&str]) -> (StatusCode, Option<String>, Value) {
    let body = register_body("pxbt_lab_node_0123456789abcdef_nope", &wg_key(1));
    let mut req = srv.client.post(srv.url("/v1/register")).json(&body);
    for l in lines {
        req = req.header("x-forwarded-for", *l);
    }
    let r = req.send().await.unwrap();
    let status = r.status();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry, r.json().await.unwrap())
}

/// Before the fix only the first line was read: a client could prepend a line of its own
/// and get a new budget per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_x_forwarded_for_line_is_read_and_the_rightmost_untrusted_hop_counts() {
    let srv = TestServer::start_with(Options {
        rate_limit: small_budget(1),
        trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
        ..Options::default()
    })
    .await;
    let (s, _, b) = register_via(&srv, &["192.0.2.1", "198.51.100.9"]).await;
    assert_ne!(s, StatusCode::TOO_MANY_REQUESTS, "{b}");
    // A different forged first line, the same real client (the proxy's line): refused.
    let (s, retry, b) = register_via(&srv, &["192.0.2.2", "198.51.100.9"]).await;
    assert_code(s, &b, 429, "rate_limited");
    assert!(retry.is_some());
    // Another client behind the proxy has its own budget.
    let (s, _, b) = register_via(&srv, &["192.0.2.2", "198.51.100.10"]).await;
    assert_ne!(s, StatusCode::TOO_MANY_REQUESTS, "{b}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_clients_share_the_registration_budget_of_their_64() {
    let srv = TestServer::start_with(Options {
        rate_limit: small_budget(2),
        trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
        ..Options::default()
    })
    .await;
    for a in ["2001:db8:1:2::1", "2001:db8:1:2:ffff::9"] {
        let (s, _, b) = register_via(&srv, &[a]).await;
        assert_ne!(s, StatusCode::TOO_MANY_REQUESTS, "{a}: {b}");
    }
    // A third address of the same /64 is the same client.
    let (s, _, b) = register_via(&srv, &["2001:db8:1:2:abcd::7"]).await;
    assert_code(s, &b, 429, "rate_limited");
    // The neighbouring /64 is another client.
    let (s, _, b) = register_via(&srv, &["2001:db8:1:3::1"]).await;
    assert_ne!(s, StatusCode::TOO_MANY_REQUESTS, "{b}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_past_its_budget_of_the_node_routes_gets_429_and_others_are_not_affected() {
    let srv = TestServer::start_with(Options {
        node_rate_limit: small_budget(3),
        ..Options::default()
    })
    .await;
    let (a, b) = srv.enrol_pair().await;
    for _ in 0..3 {
        let (s, body) = srv.heartbeat(&a).await;
        assert_eq!(s, StatusCode::OK, "{body}");
    }
    let r = srv
        .node_req(reqwest::Method::GET, &a, "/state")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let secs: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=600).contains(&secs), "{secs}");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "rate_limited", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("this node"),
        "{body}"
    );
    // The other node has its own budget.
    let (s, body) = srv.heartbeat(&b).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    // A wrong credential for node a spends nothing of a's budget: it is refused as 401.
    let r = srv
        .client
        .get(srv.url(&format!("/v1/nodes/{}/state", a.node_id)))
        .bearer_auth(format!("pxnk_{}_wrong", a.node_id))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_batch_with_an_over_long_message_or_body_is_refused_with_a_clear_answer() {
    let srv = TestServer::start().await;
    let reg = srv.enrol(LAB_NODES).await;
    let batch = |message: String| {
        serde_json::json!({
            "batch_id": uuid::Uuid::new_v4(),
            "observations": [{"at": 1, "type": "error", "message": message}],
        })
    };
    let send = |body: Value| {
        srv.node_req(reqwest::Method::POST, &reg, "/ingest")
            .json(&body)
            .send()
    };
    let r = send(batch("x".repeat(100))).await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let r = send(batch("x".repeat(5000))).await.unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_code(status, &body, 400, "invalid_request");
    assert!(
        body["message"].as_str().unwrap().contains("at most 4096"),
        "{body}"
    );
    // A body past the node routes' 256 KiB: 413 before anything is parsed.
    let r = send(batch("x".repeat(300 * 1024))).await.unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_code(status, &body, 413, "body_too_large");
    srv.stop().await;
}

/// A Postgres cluster of this test's own (initdb in a temp dir, a Unix socket only), so that
/// stopping it disturbs no other test; None (outside CI) without the binaries or root.
struct OwnPostgres {
    dir: tempfile::TempDir,
    bin: std::path::PathBuf,
}

impl OwnPostgres {
    fn start() -> Option<Self> {
        let bin = std::fs::read_dir("/usr/lib/postgresql").ok().and_then(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path().join("bin")))
                .find(|b| b.join("initdb").exists())
        });
        let Some(bin) = bin.filter(|_| plexsphere_test_support::is_root()) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but this test cannot run its own Postgres (it needs root and postgresql-15)"
            );
            eprintln!("skipping: needs root and the Postgres server binaries (Debian postgresql)");
            return None;
        };
        let dir = tempfile::Builder::new().prefix("lm-pg-").tempdir().unwrap();
        let ok = Command::new("chown")
            .arg("postgres:")
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok);
        let data = dir.path().join("data");
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin.join("initdb"))
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pg = Self { dir, bin };
        pg.ctl_start();
        Some(pg)
    }

    fn url(&self) -> String {
        format!(
            "postgres://postgres@localhost:5444/postgres?host={}",
            self.dir.path().display()
        )
    }

    fn ctl(&self, args: &[String]) {
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn ctl_start(&self) {
        self.ctl(&[
            "-l".into(),
            self.dir.path().join("log").display().to_string(),
            "-w".into(),
            "-o".into(),
            format!(
                "-k {} -c listen_addresses='' -p 5444",
                self.dir.path().display()
            ),
            "start".into(),
        ]);
    }

    fn ctl_stop(&self) {
        self.ctl(&["-m".into(), "fast".into(), "-w".into(), "stop".into()]);
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

/// GETs `path` on `base` (with `token` when given): status, Retry-After and the JSON body.
async fn get(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    token: Option<&str>,
) -> (u16, Option<String>, Value) {
    let mut req = http.get(format!("{base}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = r.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, retry, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_postgres_restarts_a_replica_answers_503_unavailable_then_recovers_by_itself() {
    let Some(pg) = OwnPostgres::start() else {
        return;
    };
    let url = pg.url();
    let store = plexsphere::store::Store::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    let token = plexsphere::operator_tokens::create(&store, "lm", time::OffsetDateTime::now_utc())
        .await
        .unwrap()
        .expose();
    store.close().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let replica = common::replica::Replica::start("pg", &url, &data, dir.path(), &[]);
    plexsphere::tls::install_ring_provider();
    let http = reqwest::Client::new();
    let base = replica.base.clone();
    let (s, _, body) = get(&http, &base, "/v1/nodes", Some(&token)).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(get(&http, &base, "/readyz", None).await.0, 200);

    pg.ctl_stop();
    let (s, retry, body) = get(&http, &base, "/v1/nodes", Some(&token)).await;
    assert_eq!(s, 503, "{body}");
    assert_eq!(body["code"], "unavailable", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("does not answer"),
        "{body}"
    );
    assert_eq!(retry.as_deref(), Some("5"));
    let (s, _, body) = get(&http, &base, "/readyz", None).await;
    assert_eq!(s, 503, "{body}");

    pg.ctl_start();
    // No restart of the replica: its pool reconnects by itself.
    let deadline = Instant::now() + BOUND;
    loop {
        let (s, _, body) = get(&http, &base, "/v1/nodes", Some(&token)).await;
        let (ready, _, _) = get(&http, &base, "/readyz", None).await;
        if s == 200 && ready == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica did not recover after Postgres came back: {s} {body}\n{}",
            replica.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The listen backlog the kernel gives `plexsphere`'s listener (`ss`'s Send-Q of a listening
/// socket): `server::LISTEN_BACKLOG`, capped by `net.core.somaxconn`. std's bind asked for
/// 128, so a reconnect storm of a large fleet overflowed the accept queue.
#[test]
fn the_listener_queues_a_reconnect_storm_not_128_connections() {
    let dir = tempfile::tempdir().unwrap();
    let (child, lines) = common::dev::start_dev(&[], dir.path());
    let listening = lines
        .iter()
        .find_map(|l| l.strip_prefix("listening on "))
        .unwrap_or_else(|| panic!("no listening line: {lines:?}"))
        .to_owned();
    let port = listening.rsplit(':').next().unwrap().to_owned();
    let out = Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    common::dev::stop(child);
    assert!(
        out.status.success(),
        "ss: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // State Recv-Q Send-Q Local Peer: Send-Q is the backlog of a listening socket.
    let backlog: i32 = text
        .split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("ss printed {text:?}"))
        .parse()
        .unwrap();
    let somaxconn: i32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        backlog,
        server::LISTEN_BACKLOG.min(somaxconn),
        "the backlog of {listening}: {text}"
    );
    assert!(backlog > 128, "{text}");
}
