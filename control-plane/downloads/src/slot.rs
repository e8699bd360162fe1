//! One platform's file on disk: which version of it was last hashed (so a request costs an
//! `fstat`, not a hash, unless the file changed), and the last failure to produce it (so the
//! requests that queued behind a failing fetch share its answer instead of each retrying).

use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::checksums::Digest;
use crate::error::DownloadError;

/// What `fstat` says about a version of a file: replaced, rewritten or touched files differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
    pub mtime_ns: i128,
}

impl Stamp {
    pub fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

/// A file version and its digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    pub stamp: Stamp,
    pub digest: Digest,
}

/// The mutable state of one platform; callers hold it behind a `tokio::sync::Mutex`, which is
/// what makes concurrent first requests fetch (or hash) once.
#[derive(Debug, Default)]
pub struct SlotState {
    pub verified: Option<Verified>,
    pub last_failure: Option<(Instant, DownloadError)>,
}

/// The digest of this file version, if it is the one last hashed.
pub fn known_digest(memo: Option<&Verified>, stamp: &Stamp) -> Option<Digest> {
    memo.filter(|v| v.stamp == *stamp).map(|v| v.digest)
}

/// The failure a request that arrived at `arrived` should answer with, without trying again:
/// the one of an attempt that ended after it arrived (it queued behind that attempt).
pub fn shared_failure(
    last: Option<&(Instant, DownloadError)>,
    arrived: Instant,
) -> Option<DownloadError> {
    last.filter(|(at, _)| *at >= arrived)
        .map(|(_, e)| e.clone())
}

/// An opened file version ready to stream: the handle, its length and its digest.
#[derive(Debug)]
pub struct OpenedFile {
    pub file: File,
    pub len: u64,
    pub digest: Digest,
}

/// Opens a file and stamps the opened handle (not the path: a rename between the two cannot
/// mix versions). `Ok(None)` when there is no such file.
pub async fn open_stamped(path: &Path) -> Result<Option<(File, Stamp)>, DownloadError> {
    let owned: PathBuf = path.to_owned();
    let joined = tokio::task::spawn_blocking(move || -> std::io::Result<Option<(File, Stamp)>> {
        let file = match File::open(&owned) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(std::io::Error::other("it is not a regular file"));
        }
        Ok(Some((file, Stamp::of(&meta))))
    })
    .await;
    match joined {
        Ok(r) => r.map_err(|e| DownloadError::io("cannot open", path, &e)),
        Err(e) => Err(DownloadError::io(
            "cannot open",
            path,
            &std::io::Error::other(e.to_string()),
        )),
    }
}

/// The digest of an opened file, read from its start, and the stamp it had throughout: a file
/// that changes while it is read is read again (up to three times).
pub async fn hash_file(file: &File, path: &Path) -> Result<Verified, DownloadError> {
    let clone = file
        .try_clone()
        .map_err(|e| DownloadError::io("cannot read", path, &e))?;
    let joined = tokio::task::spawn_blocking(move || hash_stable(clone)).await;
    match joined {
        Ok(r) => r.map_err(|e| DownloadError::io("cannot read", path, &e)),
        Err(e) => Err(DownloadError::io(
            "cannot read",
            path,
            &std::io::Error::other(e.to_string()),
        )),
    }
}

fn hash_stable(mut file: File) -> std::io::Result<Verified> {
    for _ in 0..3 {
        let before = Stamp::of(&file.metadata()?);
        file.seek(SeekFrom::Start(0))?;
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            ctx.update(&buf[..n]);
        }
        let after = Stamp::of(&file.metadata()?);
        if before == after {
            let mut digest = [0u8; 32];
            digest.copy_from_slice(ctx.finish().as_ref());
            return Ok(Verified {
                stamp: after,
                digest,
            });
        }
    }
    Err(std::io::Error::other(
        "the file kept changing while it was read; replace it atomically (write elsewhere, then rename)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn stamp(len: u64, mtime_ns: i128) -> Stamp {
        Stamp {
            dev: 1,
            ino: 2,
            len,
            mtime_ns,
        }
    }

    #[test]
    fn a_digest_is_known_only_for_the_same_version() {
        let memo = Verified {
            stamp: stamp(10, 5),
            digest: [9; 32],
        };
        assert_eq!(known_digest(Some(&memo), &stamp(10, 5)), Some([9; 32]));
        assert_eq!(known_digest(Some(&memo), &stamp(10, 6)), None);
        assert_eq!(known_digest(Some(&memo), &stamp(11, 5)), None);
        let mut other_inode = stamp(10, 5);
        other_inode.ino = 3;
        assert_eq!(known_digest(Some(&memo), &other_inode), None);
        assert_eq!(known_digest(None, &stamp(10, 5)), None);
    }

    #[test]
    fn only_requests_that_waited_for_a_failed_attempt_share_it() {
        let t0 = Instant::now();
        let failed_at = t0 + Duration::from_millis(50);
        let last = (failed_at, DownloadError::NotSigned);
        // Arrived before the attempt ended: it waited for it.
        assert!(shared_failure(Some(&last), t0).is_some());
        assert!(shared_failure(Some(&last), failed_at).is_some());
        // Arrived after: it tries again.
        assert!(shared_failure(Some(&last), failed_at + Duration::from_millis(1)).is_none());
        assert!(shared_failure(None, t0).is_none());
    }

    #[tokio::test]
    async fn hashing_and_stamping_a_real_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"hello").unwrap();
        let (file, st) = open_stamped(&path).await.unwrap().unwrap();
        let v = hash_file(&file, &path).await.unwrap();
        assert_eq!(v.stamp, st);
        assert_eq!(v.digest, crate::checksums::sha256(b"hello"));
        assert!(
            open_stamped(&dir.path().join("missing"))
                .await
                .unwrap()
                .is_none()
        );
        assert!(open_stamped(dir.path()).await.is_err());
    }
}
