//! A fake upstream release server for the mirror source, over HTTPS with a test CA: it serves a
//! fake release (binaries, a sha256sum list and a signed release manifest), counts its hits and
//! holds its answers while told to; and the downloads server in front of it.

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
use plexsphere_downloads::manifest::{self, ReleaseFile, ReleaseKey};
use plexsphere_downloads::{
    Downloads, DownloadsConfig, MirrorConfig, PinnedChecksums, Platform, router,
};
use ring::signature::{Ed25519KeyPair, KeyPair as _};
use tokio::sync::watch;

use super::tls::{TestCa, TlsServer};
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
    /// `plexd-release.json`: the manifest of the two binaries, signed by [`release_key`].
    pub envelope: Vec<u8>,
}

/// The release-signing key the tests' servers trust.
pub fn release_pair() -> Ed25519KeyPair {
    Ed25519KeyPair::from_seed_unchecked(&[77; 32]).unwrap()
}

/// A key nobody trusts: an attacker's.
pub fn attacker_pair() -> Ed25519KeyPair {
    Ed25519KeyPair::from_seed_unchecked(&[66; 32]).unwrap()
}

pub fn release_key() -> ReleaseKey {
    release_pair().public_key().as_ref().try_into().unwrap()
}

/// A signed manifest envelope of these binaries for `version`.
pub fn envelope_of(version: &str, amd64: &[u8], arm64: &[u8], keys: &[&Ed25519KeyPair]) -> Vec<u8> {
    let file = |b: &[u8]| ReleaseFile {
        sha256: plexsphere_downloads::checksums::sha256(b),
        size: b.len() as u64,
    };
    let files = [
        (Platform::LinuxAmd64, file(amd64)),
        (Platform::LinuxArm64, file(arm64)),
    ]
    .into_iter()
    .collect();
    manifest::envelope(&manifest::manifest_bytes(version, &files), keys)
}

pub fn checksums_of(amd64: &[u8], arm64: &[u8]) -> String {
    format!(
        "{}  plexd-linux-amd64\n{}  plexd-linux-arm64\n",
        sha256_hex(amd64),
        sha256_hex(arm64)
    )
}

pub fn release() -> Release {
    let amd64 = fake_binary(11, 400_000);
    let arm64 = fake_binary(12, 150_001);
    let checksums = checksums_of(&amd64, &arm64);
    let envelope = envelope_of(VERSION, &amd64, &arm64, &[&release_pair()]);
    Release {
        amd64,
        arm64,
        checksums,
        envelope,
    }
}

/// Starts an HTTPS upstream serving `r`; the sender holds answers while it is false.
pub async fn upstream(r: &Release, open: bool) -> (TlsServer, Arc<Upstream>, watch::Sender<bool>) {
    let (tx, rx) = watch::channel(open);
    let u = Arc::new(Upstream {
        files: Mutex::new(HashMap::new()),
        hits: Mutex::new(HashMap::new()),
        open: rx,
    });
    u.put("plexd-linux-amd64", r.amd64.clone());
    u.put("plexd-linux-arm64", r.arm64.clone());
    u.put("checksums.sha256", r.checksums.clone().into_bytes());
    u.put(manifest::ENVELOPE_FILE, r.envelope.clone());
    let app = Router::new()
        .fallback(upstream_handler)
        .with_state(u.clone());
    (TlsServer::start(app, Arc::new(TestCa::new())).await, u, tx)
}

/// The address and CA of an upstream, kept to configure a server after it stopped.
#[derive(Clone)]
pub struct Mirror {
    pub addr: SocketAddr,
    pub ca: Arc<TestCa>,
}

impl From<&TlsServer> for Mirror {
    fn from(s: &TlsServer) -> Self {
        Self {
            addr: s.addr,
            ca: s.ca.clone(),
        }
    }
}

/// Pins checksums in the configuration. The mirror's CA is copied beside the cache (outside
/// `<cache>/<version>`), so the configuration outlives the upstream.
pub fn mirror_config(
    upstream: impl Into<Mirror>,
    pinned: PinnedChecksums,
    cache: &Path,
) -> DownloadsConfig {
    let m: Mirror = upstream.into();
    std::fs::create_dir_all(cache).unwrap();
    let ca_file = cache.join("mirror-ca.pem");
    std::fs::copy(m.ca.file(), &ca_file).unwrap();
    let mut mirror = MirrorConfig::new(
        format!("https://{}/plexd/{{version}}/plexd-linux-{{arch}}", m.addr),
        pinned,
        cache,
    );
    mirror.ca_file = Some(ca_file);
    DownloadsConfig::mirror(VERSION, mirror)
}

/// Trusts the mirror's signed manifest when [`release_key`] signed it.
pub fn manifest_config(upstream: impl Into<Mirror>, cache: &Path) -> DownloadsConfig {
    let m: Mirror = upstream.into();
    let url = format!(
        "https://{}/plexd/{{version}}/{}",
        m.addr,
        manifest::ENVELOPE_FILE
    );
    mirror_config(
        m,
        PinnedChecksums::SignedManifest {
            url,
            keys: vec![release_key()],
        },
        cache,
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
