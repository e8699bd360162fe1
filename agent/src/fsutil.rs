//! Small file-system helpers: private directories, atomic private writes, mode checks.

use std::fs::{self, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A file-system failure with the path it happened on.
#[derive(Debug, thiserror::Error)]
#[error("{action} {path}: {source}")]
pub struct FsError {
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl FsError {
    pub fn new(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Removes the file at `path`; true when it was there, false when there was nothing to remove.
pub(crate) fn remove_file_if_present(path: &Path) -> std::io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Creates `dir` (and its parents) and sets its mode to `mode` when plexd creates it. An
/// existing directory keeps its mode unless it is looser than `mode` for group/other.
pub(crate) fn ensure_dir(dir: &Path, mode: u32) -> Result<(), FsError> {
    if !dir.exists() {
        fs::create_dir_all(dir).map_err(|e| FsError::new("cannot create directory", dir, e))?;
        fs::set_permissions(dir, Permissions::from_mode(mode))
            .map_err(|e| FsError::new("cannot set the mode of", dir, e))?;
        return Ok(());
    }
    let meta = fs::metadata(dir).map_err(|e| FsError::new("cannot read", dir, e))?;
    let current = meta.permissions().mode() & 0o777;
    if current & !mode != 0 {
        tracing::warn!(path = %dir.display(), mode = format!("{current:o}"), want = format!("{mode:o}"), "directory mode is looser than expected; tightening it");
        fs::set_permissions(dir, Permissions::from_mode(current & mode))
            .map_err(|e| FsError::new("cannot set the mode of", dir, e))?;
    }
    Ok(())
}

/// `value` as pretty JSON ending with a newline: how plexd's own files are written.
pub(crate) fn pretty_json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut json = serde_json::to_vec_pretty(value)?;
    json.push(b'\n');
    Ok(json)
}

/// Writes `data` to `path` atomically with `mode`: a temp file in the same directory, fsync,
/// rename, fsync of the directory. A reader sees the old file or the new one, never half.
pub(crate) fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), FsError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".to_owned());
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .map_err(|e| FsError::new("cannot create", &tmp, e))?;
        // The umask may have narrowed the mode, and an old temp file may carry another one.
        f.set_permissions(Permissions::from_mode(mode))
            .map_err(|e| FsError::new("cannot set the mode of", &tmp, e))?;
        f.write_all(data)
            .map_err(|e| FsError::new("cannot write", &tmp, e))?;
        f.sync_all()
            .map_err(|e| FsError::new("cannot sync", &tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| FsError::new("cannot rename into place", path, e))?;
        if let Ok(d) = fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The permission bits of a file (`0o600`...).
pub(crate) fn mode_of(path: &Path) -> Result<u32, FsError> {
    fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o777)
        .map_err(|e| FsError::new("cannot read", path, e))
}

/// Forces a secret file to 0600 when it has looser bits, with a warning.
pub(crate) fn enforce_private(path: &Path) -> Result<(), FsError> {
    let mode = mode_of(path)?;
    if mode & 0o077 != 0 {
        tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "secret file was readable by others; setting it to 0600");
        fs::set_permissions(path, Permissions::from_mode(0o600))
            .map_err(|e| FsError::new("cannot set the mode of", path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_sets_mode_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        write_atomic(&p, b"one", 0o600).unwrap();
        assert_eq!(mode_of(&p).unwrap(), 0o600);
        write_atomic(&p, b"two", 0o644).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(mode_of(&p).unwrap(), 0o644);
        // no temp file is left behind
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn ensure_dir_creates_private_and_tightens_loose() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("a/b");
        ensure_dir(&d, 0o700).unwrap();
        assert_eq!(mode_of(&d).unwrap(), 0o700);
        fs::set_permissions(&d, Permissions::from_mode(0o755)).unwrap();
        ensure_dir(&d, 0o700).unwrap();
        assert_eq!(mode_of(&d).unwrap(), 0o700);
    }

    #[test]
    fn enforce_private_tightens() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        fs::write(&p, "x").unwrap();
        fs::set_permissions(&p, Permissions::from_mode(0o644)).unwrap();
        enforce_private(&p).unwrap();
        assert_eq!(mode_of(&p).unwrap(), 0o600);
    }
}
