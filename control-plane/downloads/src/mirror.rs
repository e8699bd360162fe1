//! The mirror source: on the first request per platform the binary is fetched from the
//! upstream URL template, its SHA-256 checked against the pinned checksums while it streams to
//! a temporary file in the cache, and only a match is renamed into place. Later requests (and
//! later processes: the cache is on disk) are served from the cache, also while the upstream is
//! down. A cached file is re-hashed once per process and whenever its `fstat` changes; one that
//! no longer matches is discarded and fetched again.

use std::path::{Path, PathBuf};
use std::time::Instant;

use tokio::io::AsyncWriteExt as _;
use tokio::sync::Mutex;

use crate::atomic::TempFile;
use crate::checksums::{Checksums, Digest};
use crate::config::{ConfigError, MirrorConfig, PinnedChecksums, expand, redact};
use crate::error::DownloadError;
use crate::local::slot_index;
use crate::mirror_client::{describe, http_client, redact_template};
use crate::platform::Platform;
use crate::slot::{OpenedFile, SlotState, hash_file, known_digest, open_stamped, shared_failure};

/// The most a checksum list may weigh.
const MAX_CHECKSUMS_BYTES: u64 = 1024 * 1024;
/// Where a checksum list fetched from a URL is kept, beside the binaries.
const CHECKSUMS_FILE: &str = "checksums.sha256";

pub struct MirrorSource {
    version: String,
    config: MirrorConfig,
    /// `<cache_dir>/<version>`.
    dir: PathBuf,
    client: reqwest::Client,
    pinned: Mutex<PinnedState>,
    slots: [Mutex<SlotState>; 2],
}

#[derive(Default)]
struct PinnedState {
    checksums: Option<Checksums>,
    last_failure: Option<(Instant, DownloadError)>,
}

impl MirrorSource {
    /// Creates the cache directory and the HTTP client; `inline` are the pinned checksums when
    /// the configuration carries them. Fetches nothing.
    pub async fn open(
        version: &str,
        config: MirrorConfig,
        inline: Option<Checksums>,
    ) -> Result<Self, ConfigError> {
        let dir = config.cache_dir.join(version);
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|source| ConfigError::CacheDir {
                path: dir.clone(),
                source,
            })?;
        let client = http_client(&config)?;
        let mut pinned = PinnedState {
            checksums: inline,
            last_failure: None,
        };
        if pinned.checksums.is_none() {
            pinned.checksums = load_cached_checksums(&dir.join(CHECKSUMS_FILE)).await;
        }
        tracing::info!(
            version,
            template = %redact_template(&config.url_template),
            cache = %dir.display(),
            pinned = pinned.checksums.is_some(),
            "serving plexd from a mirror, fetched on first request and cached"
        );
        Ok(Self {
            version: version.to_owned(),
            config,
            dir,
            client,
            pinned: Mutex::new(pinned),
            slots: Default::default(),
        })
    }

    /// The pinned checksums; fetched once from the checksums URL when not given inline.
    pub async fn checksums(&self, arrived: Instant) -> Result<Checksums, DownloadError> {
        let mut state = self.pinned.lock().await;
        if let Some(c) = &state.checksums {
            return Ok(c.clone());
        }
        if let Some(e) = shared_failure(state.last_failure.as_ref(), arrived) {
            return Err(e);
        }
        let PinnedChecksums::Url(template) = &self.config.checksums else {
            return Err(DownloadError::NothingAvailable {
                version: self.version.clone(),
                reason: "no pinned checksums are configured".to_owned(),
            });
        };
        match self.fetch_checksums(template).await {
            Ok(c) => {
                state.checksums = Some(c.clone());
                state.last_failure = None;
                Ok(c)
            }
            Err(e) => {
                state.last_failure = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    /// The platform's verified binary from the cache, fetched first when it is not there.
    pub async fn binary(
        &self,
        platform: Platform,
        arrived: Instant,
    ) -> Result<OpenedFile, DownloadError> {
        let pinned = self.checksums(arrived).await?;
        let expected = *pinned
            .get(platform)
            .ok_or_else(|| DownloadError::NotInRelease {
                version: self.version.clone(),
                platform,
                reason: format!(
                    "the checksums pinned for this release list no {}",
                    platform.file_name()
                ),
            })?;
        let path = self.dir.join(platform.file_name());
        let mut slot = self.slots[slot_index(platform)].lock().await;
        if let Some(opened) = cached(&mut slot, platform, &path, &expected).await? {
            return Ok(opened);
        }
        if let Some(e) = shared_failure(slot.last_failure.as_ref(), arrived) {
            return Err(e);
        }
        if let Err(e) = self.fetch_binary(platform, &expected, &path).await {
            slot.last_failure = Some((Instant::now(), e.clone()));
            return Err(e);
        }
        slot.last_failure = None;
        cached(&mut slot, platform, &path, &expected)
            .await?
            .ok_or_else(|| {
                DownloadError::io(
                    "the verified download vanished from the cache at",
                    &path,
                    &std::io::Error::other("removed right after it was stored"),
                )
            })
    }

    async fn fetch_binary(
        &self,
        platform: Platform,
        expected: &Digest,
        path: &Path,
    ) -> Result<(), DownloadError> {
        let url =
            expand(&self.config.url_template, &self.version, Some(platform)).map_err(|e| {
                DownloadError::UpstreamUnavailable {
                    url: redact_template(&self.config.url_template),
                    reason: e.to_string(),
                }
            })?;
        let shown = redact(&url);
        tracing::info!(platform = %platform, url = %shown, "fetching plexd from the mirror");
        let mut tmp = TempFile::create(&self.dir, platform.file_name()).await?;
        let (len, actual) = self
            .stream_to(&url, &shown, &mut tmp, self.config.max_binary_bytes)
            .await?;
        if actual != *expected {
            let e = DownloadError::ChecksumMismatch {
                version: self.version.clone(),
                file: platform.file_name(),
                url: shown,
                expected: hex::encode(expected),
                actual: hex::encode(actual),
            };
            tracing::error!(platform = %platform, error = %e, "refusing a plexd download from the mirror");
            return Err(e);
        }
        tmp.persist(path).await?;
        tracing::info!(platform = %platform, url = %shown, bytes = len, sha256 = %hex::encode(actual), path = %path.display(), "cached plexd from the mirror after checking its pinned checksum");
        Ok(())
    }

    async fn fetch_checksums(&self, template: &str) -> Result<Checksums, DownloadError> {
        let url = expand(template, &self.version, None).map_err(|e| {
            DownloadError::UpstreamUnavailable {
                url: redact_template(template),
                reason: e.to_string(),
            }
        })?;
        let shown = redact(&url);
        let mut tmp = TempFile::create(&self.dir, CHECKSUMS_FILE).await?;
        self.stream_to(&url, &shown, &mut tmp, MAX_CHECKSUMS_BYTES)
            .await?;
        let text = tokio::fs::read_to_string(tmp.path())
            .await
            .map_err(|e| DownloadError::io("cannot read back", tmp.path(), &e))?;
        let parsed = Checksums::parse(&text).map_err(|e| {
            let e = DownloadError::UpstreamUnavailable {
                url: shown.clone(),
                reason: format!("its checksum list is unusable: {e}"),
            };
            tracing::error!(error = %e, "refusing the pinned checksums from the mirror");
            e
        })?;
        tmp.persist(&self.dir.join(CHECKSUMS_FILE)).await?;
        tracing::info!(url = %shown, platforms = parsed.platforms().count(), "pinned the plexd checksums fetched from the mirror");
        Ok(parsed)
    }

    /// GETs `url` into `tmp`, hashing as it goes; at most `max` bytes.
    async fn stream_to(
        &self,
        url: &str,
        shown: &str,
        tmp: &mut TempFile,
        max: u64,
    ) -> Result<(u64, Digest), DownloadError> {
        let unavailable = |reason: String| {
            let e = DownloadError::UpstreamUnavailable {
                url: shown.to_owned(),
                reason,
            };
            tracing::warn!(error = %e, "the plexd mirror failed");
            e
        };
        let mut resp = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|e| unavailable(describe(&e)))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(unavailable(format!("it answered HTTP {status}")));
        }
        if let Some(n) = resp.content_length()
            && n > max
        {
            return Err(unavailable(format!(
                "it announces {n} bytes, more than the {max} allowed"
            )));
        }
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        let mut total: u64 = 0;
        loop {
            let chunk = resp.chunk().await.map_err(|e| {
                unavailable(format!(
                    "the transfer broke off after {total} bytes: {}",
                    describe(&e)
                ))
            })?;
            let Some(chunk) = chunk else { break };
            total += chunk.len() as u64;
            if total > max {
                return Err(unavailable(format!(
                    "it sent more than the {max} bytes allowed"
                )));
            }
            ctx.update(&chunk);
            tmp.file()
                .write_all(&chunk)
                .await
                .map_err(|e| DownloadError::io("cannot write", tmp.path(), &e))?;
        }
        let mut digest = [0u8; 32];
        digest.copy_from_slice(ctx.finish().as_ref());
        Ok((total, digest))
    }
}

/// The cached file when it is there and matches `expected`; a mismatching one is removed.
async fn cached(
    slot: &mut SlotState,
    platform: Platform,
    path: &Path,
    expected: &Digest,
) -> Result<Option<OpenedFile>, DownloadError> {
    let Some((file, stamp)) = open_stamped(path).await? else {
        slot.verified = None;
        return Ok(None);
    };
    let digest = match known_digest(slot.verified.as_ref(), &stamp) {
        Some(d) => d,
        None => {
            let v = hash_file(&file, path).await?;
            slot.verified = Some(v);
            v.digest
        }
    };
    if digest == *expected {
        return Ok(Some(OpenedFile {
            file,
            len: stamp.len,
            digest,
        }));
    }
    tracing::warn!(
        platform = %platform,
        path = %path.display(),
        expected = %hex::encode(expected),
        actual = %hex::encode(digest),
        "the cached plexd does not match its pinned checksum; discarding it and fetching again"
    );
    slot.verified = None;
    match tokio::fs::remove_file(path).await {
        Ok(()) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(DownloadError::io(
            "cannot remove the stale cached file",
            path,
            &e,
        )),
    }
}

async fn load_cached_checksums(path: &Path) -> Option<Checksums> {
    let text = match tokio::fs::read_to_string(path).await {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the cached plexd checksums; they are fetched again");
            return None;
        }
    };
    match Checksums::parse(&text) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the cached plexd checksums are unusable; they are fetched again");
            None
        }
    }
}
