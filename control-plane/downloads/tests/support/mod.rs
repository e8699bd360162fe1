//! Test helpers: servers on 127.0.0.1:0 with graceful stop, fake release bytes, an HTTP client,
//! and running the real command-line tools.
#![allow(dead_code, clippy::unwrap_used)] // test-only helpers: a failure here is a test failure

pub mod local;
pub mod tls;
pub mod upstream;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use axum::Router;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct Server {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Server {
    pub async fn start(app: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        Self {
            addr,
            stop: Some(tx),
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops accepting and waits until the listener is closed.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        (&mut self.task).await.unwrap();
    }
}

/// Deterministic bytes that look like nothing in particular (xorshift).
pub fn fake_binary(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(plexsphere_downloads::checksums::sha256(bytes))
}

pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// Runs a shell command in `dir` (blocking, off the runtime's workers).
pub async fn sh(dir: &Path, script: &str) -> Output {
    let dir = dir.to_owned();
    let script = script.to_owned();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .current_dir(&dir)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

pub fn show(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Polls `cond` until it holds, at most 10 s; panics with `what` otherwise.
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The `code` of a JSON `ApiError` answer, with its status.
pub async fn api_error(resp: reqwest::Response) -> (u16, String, String) {
    let status = resp.status().as_u16();
    let body: serde_json::Value = resp.json().await.unwrap();
    (
        status,
        body["code"].as_str().unwrap_or_default().to_owned(),
        body["message"].as_str().unwrap_or_default().to_owned(),
    )
}

/// `GET url` with the test client.
pub async fn get(url: &str) -> reqwest::Response {
    client().get(url).send().await.unwrap()
}
