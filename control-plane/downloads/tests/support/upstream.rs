//! A fake upstream release server for the mirror source: it serves a fake release, counts
//! its hits and holds its answers while told to; and the downloads server in front of it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use plexsphere_downloads::{Downloads, DownloadsConfig, MirrorConfig, PinnedChecksums, router};
use tokio::sync::watch;

use super::{Server, fake_binary, get, sha256_hex};

pub const VERSION: &str = "1.2.3";

/// A fake upstream release server.
pub struct Upstream {
    files: Mutex<HashMap<String, Vec<u8>>>,
    hits: Mutex<HashMap<String, usize>>,
    /// Answers wait until this is true.
    open: watch::Receiver<bool>,
}

impl Upstream {
    pub fn hits(&self, file: &str) -> usize {
        let path = format!("/plexd/{VERSION}/{file}");
        self.hits.lock().unwrap().get(&path).copied().unwrap_or(0)
    }

    pub fn put(&self, file: &str, bytes: Vec<u8>) {
        let path = format!("/plexd/{VERSION}/{file}");
        self.files.lock().unwrap().insert(path, bytes);
    }
}

async fn upstream_handler(State(u): State<Arc<Upstream>>, uri: Uri) -> Response {
    let path = uri.path().to_owned();
    *u.hits.lock().unwrap().entry(path.clone()).or_default() += 1;
    let mut open = u.open.clone();
    let _ = open.wait_for(|o| *o).await;
    let body = u.files.lock().unwrap().get(&path).cloned();
    match body {
        Some(b) => b.into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

pub struct Release {
    pub amd64: Vec<u8>,
    pub arm64: Vec<u8>,
    pub checksums: String,
}

pub fn release() -> Release {
    let amd64 = fake_binary(11, 400_000);
    let arm64 = fake_binary(12, 150_001);
    let checksums = format!(
        "{}  plexd-linux-amd64\n{}  plexd-linux-arm64\n",
        sha256_hex(&amd64),
        sha256_hex(&arm64)
    );
    Release {
        amd64,
        arm64,
        checksums,
    }
}

/// Starts an upstream serving `r`; the sender holds answers while it is false.
pub async fn upstream(r: &Release, open: bool) -> (Server, Arc<Upstream>, watch::Sender<bool>) {
    let (tx, rx) = watch::channel(open);
    let u = Arc::new(Upstream {
        files: Mutex::new(HashMap::new()),
        hits: Mutex::new(HashMap::new()),
        open: rx,
    });
    u.put("plexd-linux-amd64", r.amd64.clone());
    u.put("plexd-linux-arm64", r.arm64.clone());
    u.put("checksums.sha256", r.checksums.clone().into_bytes());
    let app = Router::new()
        .fallback(upstream_handler)
        .with_state(u.clone());
    (Server::start(app).await, u, tx)
}

pub fn mirror_config(
    upstream: SocketAddr,
    pinned: PinnedChecksums,
    cache: &Path,
) -> DownloadsConfig {
    DownloadsConfig::mirror(
        VERSION,
        MirrorConfig::new(
            format!("http://{upstream}/plexd/{{version}}/plexd-linux-{{arch}}"),
            pinned,
            cache,
        ),
    )
}

/// The downloads server, with a count of requests that reached it.
pub async fn downloads(config: DownloadsConfig) -> (Server, Arc<AtomicUsize>) {
    let d = Downloads::open(config, None).await.unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let app = router(Arc::new(d)).layer(middleware::from_fn(move |req: Request, next: Next| {
        counter.fetch_add(1, Ordering::SeqCst);
        next.run(req)
    }));
    (Server::start(app).await, seen)
}

pub fn cached_names(cache: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(cache.join(VERSION))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The body of a 200 answer; anything else fails with the answer in the message.
pub async fn ok_text(url: &str) -> String {
    let resp = get(url).await;
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert_eq!(status, 200, "GET {url}: {text}");
    text
}
