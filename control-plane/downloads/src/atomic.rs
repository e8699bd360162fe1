//! Files that appear whole or not at all: written to a unique temporary name in the target's
//! directory, flushed to disk, then renamed over the target. A temporary file that is dropped
//! before [`TempFile::persist`] (an error, a cancelled request) is removed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::AsyncWriteExt as _;

use crate::error::DownloadError;

static COUNTER: AtomicU64 = AtomicU64::new(0);

pub struct TempFile {
    path: PathBuf,
    file: tokio::fs::File,
    persisted: bool,
}

impl TempFile {
    /// `<dir>/.<name>.<pid>.<n>.part`, created exclusively.
    pub async fn create(dir: &Path, name: &str) -> Result<Self, DownloadError> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".{name}.{}.{n}.part", std::process::id()));
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .await
            .map_err(|e| DownloadError::io("cannot create", &path, &e))?;
        Ok(Self {
            path,
            file,
            persisted: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file(&mut self) -> &mut tokio::fs::File {
        &mut self.file
    }

    /// Flushes, syncs and renames the file to `target`, then syncs the directory.
    pub async fn persist(mut self, target: &Path) -> Result<(), DownloadError> {
        let io = |what, e: std::io::Error| DownloadError::io(what, &self.path, &e);
        self.file.flush().await.map_err(|e| io("cannot flush", e))?;
        self.file
            .sync_all()
            .await
            .map_err(|e| io("cannot sync", e))?;
        tokio::fs::rename(&self.path, target)
            .await
            .map_err(|e| DownloadError::io("cannot move the download into place at", target, &e))?;
        self.persisted = true;
        if let Some(dir) = target.parent()
            && let Ok(d) = tokio::fs::File::open(dir).await
            && let Err(e) = d.sync_all().await
        {
            tracing::debug!(dir = %dir.display(), error = %e, "cannot sync the cache directory");
        }
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.persisted
            && let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove a temporary download");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn persisted_or_gone() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = TempFile::create(dir.path(), "x").await.unwrap();
        t.file().write_all(b"data").await.unwrap();
        let tmp_path = t.path().to_owned();
        t.persist(&dir.path().join("x")).await.unwrap();
        assert_eq!(std::fs::read(dir.path().join("x")).unwrap(), b"data");
        assert!(!tmp_path.exists());

        let mut t = TempFile::create(dir.path(), "y").await.unwrap();
        t.file().write_all(b"half").await.unwrap();
        let tmp_path = t.path().to_owned();
        drop(t);
        assert!(!tmp_path.exists());
        assert!(!dir.path().join("y").exists());
    }
}
