//! The real `plexsphere dev` binary with a node's event stream open: the journal lines an
//! operator relies on (`sse: stream opened` with the node id, `sse: stream closed`), and
//! SIGTERM ends the open stream and exits 0 instead of waiting for it.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::nodes::BOUND;
use common::{LAB_NODES, client_for, register_body, wg_key};
use plexsphere_wire::RegisterResponse;
use plexsphere_wire::admin::IssuedToken;

const BIN: &str = env!("CARGO_BIN_EXE_plexsphere");

fn wait_for_text(path: &std::path::Path, needles: &[&str]) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().any(|l| needles.iter().all(|n| l.contains(n))) {
            return text;
        }
        assert!(
            start.elapsed() < BOUND,
            "no line with {needles:?} in:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_logs_stream_open_and_close_and_sigterm_ends_open_streams() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let mut child = Command::new(BIN)
        .env("PLEXSPHERE_NO_LOCAL_MACHINES", "1")
        .args([
            "dev",
            "--listen",
            "127.0.0.1:0",
            "--sse-keepalive-secs",
            "1",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .env("PLEXSPHERE_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let listening = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map(Result::unwrap)
            .find(|l| l.starts_with("listening on "))
    })
    .await
    .unwrap()
    .expect("no listening line");
    let base = listening
        .strip_prefix("listening on ")
        .unwrap()
        .replace("127.0.0.1", "localhost");
    let ca = std::fs::read_to_string(dir.path().join("tls/ca.crt")).unwrap();
    let op = std::fs::read_to_string(dir.path().join("operator-token")).unwrap();
    let client = client_for(&ca);

    let issued: IssuedToken = client
        .post(format!("{base}/v1/projects/{LAB_NODES}/bootstrap-tokens"))
        .bearer_auth(op.trim())
        .json(&serde_json::json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 3600}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let body =
        common::prove::prove_body(&client, &base, &register_body(&issued.token, &wg_key(1))).await;
    let reg: RegisterResponse = client
        .post(format!("{base}/v1/register"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut stream = client
        .get(format!("{base}/v1/nodes/{}/events", reg.node_id))
        .bearer_auth(&reg.node_credential)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), reqwest::StatusCode::OK);
    let id = reg.node_id.to_string();
    wait_for_text(&log, &["sse: stream opened", &id]);
    // A keep-alive arrives within the configured interval (bounded wait, no timing claim).
    let chunk = tokio::time::timeout(BOUND, stream.chunk())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(chunk.as_deref(), Some(&b": keep-alive\n\n"[..]));

    assert!(
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    // The server ends the stream (not the 10 s drain deadline) and exits 0.
    loop {
        match tokio::time::timeout(BOUND, stream.chunk()).await.unwrap() {
            Ok(Some(_)) => continue,
            Ok(None) => break,
            Err(e) => panic!("the stream was cut, not ended: {e}"),
        }
    }
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    let text = wait_for_text(&log, &["sse: stream closed", &id]);
    assert!(text.contains("shutting down"), "{text}");
}
