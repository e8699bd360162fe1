//! The local source: a directory with `plexd-linux-amd64` / `plexd-linux-arm64` (the embedded
//! default serves the plexd built from this workspace). Checksums come from the files: hashed
//! at start, and again whenever a file's `fstat` (inode, size, mtime) changes.
//!
//! A platform without a file answers 404 `unknown_platform` ("no build for this platform on
//! this server") and is left out of `checksums.sha256`; a file appearing later is picked up on
//! the next request. Replace files atomically (copy beside, then rename).

use std::path::{Path, PathBuf};

use tokio::sync::Mutex;

use crate::checksums::Checksums;
use crate::error::DownloadError;
use crate::platform::Platform;
use crate::slot::{OpenedFile, SlotState, hash_file, known_digest, open_stamped};

pub struct LocalSource {
    version: String,
    dir: PathBuf,
    slots: [Mutex<SlotState>; 2],
}

impl LocalSource {
    /// Hashes what the directory holds now and logs it. A missing directory is not fatal (the
    /// server may start before plexd is built); it is logged and every platform answers 404.
    pub async fn open(version: &str, dir: &Path) -> Self {
        let source = Self {
            version: version.to_owned(),
            dir: dir.to_owned(),
            slots: Default::default(),
        };
        match source.checksums().await {
            Ok(c) => {
                for p in c.platforms() {
                    tracing::info!(
                        version,
                        platform = %p,
                        dir = %dir.display(),
                        sha256 = %c.get(p).map(hex::encode).unwrap_or_default(),
                        "serving plexd from the artifacts directory"
                    );
                }
                for p in Platform::ALL.into_iter().filter(|p| c.get(*p).is_none()) {
                    tracing::warn!(version, platform = %p, dir = %dir.display(), file = p.file_name(), "no plexd build for this platform in the artifacts directory; it answers 404 until the file appears");
                }
            }
            Err(e) => tracing::warn!(
                version,
                dir = %dir.display(),
                error = %e,
                "no plexd build is served yet; put plexd-linux-amd64 / plexd-linux-arm64 into the artifacts directory"
            ),
        }
        source
    }

    /// The platform's file, opened, with its current digest.
    pub async fn binary(&self, platform: Platform) -> Result<OpenedFile, DownloadError> {
        let path = self.dir.join(platform.file_name());
        let mut slot = self.slots[slot_index(platform)].lock().await;
        let Some((file, stamp)) = open_stamped(&path).await? else {
            slot.verified = None;
            return Err(DownloadError::NotInRelease {
                version: self.version.clone(),
                platform,
                reason: format!(
                    "the server's artifacts directory has no {}",
                    platform.file_name()
                ),
            });
        };
        let digest = match known_digest(slot.verified.as_ref(), &stamp) {
            Some(d) => d,
            None => {
                let verified = hash_file(&file, &path).await?;
                if slot.verified.is_some() {
                    tracing::info!(
                        platform = %platform,
                        path = %path.display(),
                        sha256 = %hex::encode(verified.digest),
                        "the plexd build changed on disk; serving the new one"
                    );
                }
                slot.verified = Some(verified);
                verified.digest
            }
        };
        Ok(OpenedFile {
            file,
            len: stamp.len,
            digest,
        })
    }

    /// The digests of every platform that has a file now.
    pub async fn checksums(&self) -> Result<Checksums, DownloadError> {
        let mut out = Checksums::new();
        for p in Platform::ALL {
            match self.binary(p).await {
                Ok(f) => out.insert(p, f.digest),
                Err(DownloadError::NotInRelease { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if out.is_empty() {
            return Err(DownloadError::NothingAvailable {
                version: self.version.clone(),
                reason: "the server's artifacts directory holds no plexd-linux-<arch> file"
                    .to_owned(),
            });
        }
        Ok(out)
    }
}

pub(crate) fn slot_index(platform: Platform) -> usize {
    match platform {
        Platform::LinuxAmd64 => 0,
        Platform::LinuxArm64 => 1,
    }
}
