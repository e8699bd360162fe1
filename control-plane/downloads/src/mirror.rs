//! The mirror source: on the first request per platform the binary is fetched from the
//! upstream URL template, its SHA-256 (and, from a signed manifest, its size) checked against
//! the trusted checksums while it streams to a temporary file in the cache, and only a match is
//! renamed into place. The checksums are the server's own (pinned inline in its configuration)
//! or those of a release manifest signed by a trusted release key; never the mirror's on
//! first use. Later requests (and
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
use crate::manifest::{self, ENVELOPE_FILE, MAX_ENVELOPE_BYTES, Release, ReleaseKey};
use crate::mirror_client::{describe, http_client, redact_template};
use crate::platform::Platform;
use crate::slot::{OpenedFile, SlotState, hash_file, known_digest, open_stamped, shared_failure};

pub struct MirrorSource {
    version: String,
    config: MirrorConfig,
    /// `<cache_dir>/<version>`.
    dir: PathBuf,
    client: reqwest::Client,
    pinned: Mutex<PinnedState>,
    slots: [Mutex<SlotState>; 2],
}

/// What the binaries are checked against, once known.
#[derive(Clone)]
struct Trusted {
    checksums: Checksums,
    /// From a signed manifest: the exact size of each binary.
    release: Option<Release>,
}

#[derive(Default)]
struct PinnedState {
    trusted: Option<Trusted>,
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
            trusted: inline.map(|checksums| Trusted {
                checksums,
                release: None,
            }),
            last_failure: None,
        };
        if let PinnedChecksums::SignedManifest { keys, .. } = &config.checksums {
            pinned.trusted = load_cached_manifest(&dir.join(ENVELOPE_FILE), keys, version)
                .await
                .map(|release| Trusted {
                    checksums: release.checksums(),
                    release: Some(release),
                });
        }
        tracing::info!(
            version,
            template = %redact_template(&config.url_template),
            cache = %dir.display(),
            trusted = pinned.trusted.is_some(),
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

    /// The trusted checksums.
    pub async fn checksums(&self, arrived: Instant) -> Result<Checksums, DownloadError> {
        Ok(self.trusted(arrived).await?.checksums)
    }

    /// The trusted checksums (and manifest); the signed manifest is fetched once when it is
    /// neither inline nor verified in the cache.
    async fn trusted(&self, arrived: Instant) -> Result<Trusted, DownloadError> {
        let mut state = self.pinned.lock().await;
        if let Some(t) = &state.trusted {
            return Ok(t.clone());
        }
        if let Some(e) = shared_failure(state.last_failure.as_ref(), arrived) {
            return Err(e);
        }
        let PinnedChecksums::SignedManifest { url, keys } = &self.config.checksums else {
            return Err(DownloadError::NothingAvailable {
                version: self.version.clone(),
                reason: "no pinned checksums are configured".to_owned(),
            });
        };
        match self.fetch_manifest(url, keys).await {
            Ok(release) => {
                let t = Trusted {
                    checksums: release.checksums(),
                    release: Some(release),
                };
                state.trusted = Some(t.clone());
                state.last_failure = None;
                Ok(t)
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
        let trusted = self.trusted(arrived).await?;
        let size = trusted.release.as_ref().and_then(|r| r.size(platform));
        let expected =
            *trusted
                .checksums
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
        if let Err(e) = self.fetch_binary(platform, &expected, size, &path).await {
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
        size: Option<u64>,
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
        // A signed size is the cap: a longer answer is cut off as soon as it is longer.
        let max = size.map_or(self.config.max_binary_bytes, |s| {
            s.min(self.config.max_binary_bytes)
        });
        let (len, actual) = self.stream_to(&url, &shown, &mut tmp, max).await?;
        if actual != *expected || size.is_some_and(|s| s != len) {
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

    /// Fetches the release manifest envelope, verifies it, and only then keeps it in the
    /// cache. A refused manifest replaces nothing.
    async fn fetch_manifest(
        &self,
        template: &str,
        keys: &[ReleaseKey],
    ) -> Result<Release, DownloadError> {
        let url = expand(template, &self.version, None).map_err(|e| {
            DownloadError::UpstreamUnavailable {
                url: redact_template(template),
                reason: e.to_string(),
            }
        })?;
        let shown = redact(&url);
        let mut tmp = TempFile::create(&self.dir, ENVELOPE_FILE).await?;
        self.stream_to(&url, &shown, &mut tmp, MAX_ENVELOPE_BYTES)
            .await?;
        let bytes = tokio::fs::read(tmp.path())
            .await
            .map_err(|e| DownloadError::io("cannot read back", tmp.path(), &e))?;
        let release = manifest::verify(&bytes, keys, &self.version).map_err(|e| {
            let e = DownloadError::ReleaseUnverified {
                version: self.version.clone(),
                url: shown.clone(),
                reason: e.to_string(),
            };
            tracing::error!(error = %e, "refusing the plexd release manifest from the mirror");
            e
        })?;
        tmp.persist(&self.dir.join(ENVELOPE_FILE)).await?;
        tracing::info!(
            url = %shown,
            platforms = release.files.len(),
            signed_by = %base64::Engine::encode(&base64::engine::general_purpose::STANDARD, release.signed_by),
            "verified the signed plexd release manifest from the mirror"
        );
        Ok(release)
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

/// The verified manifest kept in the cache, checked again with today's keys and version; an
/// unreadable or no longer trusted one is ignored (and fetched again).
async fn load_cached_manifest(path: &Path, keys: &[ReleaseKey], version: &str) -> Option<Release> {
    let bytes = match tokio::fs::read(path).await {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the cached plexd release manifest; it is fetched again");
            return None;
        }
    };
    match manifest::verify(&bytes, keys, version) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the cached plexd release manifest is no longer trusted; it is fetched again");
            None
        }
    }
}
