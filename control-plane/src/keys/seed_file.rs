//! The seed files of older versions: a Domain's raw 32-byte Ed25519 seed in
//! `<data-dir>/domain-keys/<domain-slug>.seed`. They are read once, to import the key into the
//! database (sealed); nothing writes them any more.

use std::fs;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SeedFileError {
    #[error("cannot read the Domain key seed {path}: {source}; check that plexsphere may read it")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the Domain key seed {path} is {len} bytes, not 32; restore the original file (nodes trust its key)"
    )]
    BadLength { path: PathBuf, len: usize },
}

/// Where a Domain's seed lived.
pub fn seed_path(data_dir: &Path, domain_slug: &str) -> PathBuf {
    data_dir
        .join("domain-keys")
        .join(format!("{domain_slug}.seed"))
}

/// The seed of the file at [`seed_path`], or None when there is no such file.
pub(crate) fn read(data_dir: &Path, domain_slug: &str) -> Result<Option<[u8; 32]>, SeedFileError> {
    let path = seed_path(data_dir, domain_slug);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(SeedFileError::Io { path, source }),
    };
    let len = bytes.len();
    let seed = bytes
        .try_into()
        .map_err(|_| SeedFileError::BadLength { path, len })?;
    Ok(Some(seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_is_none_and_wrong_size_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path(), "lab").unwrap(), None);
        let path = seed_path(dir.path(), "lab");
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, b"short").unwrap();
        let err = read(dir.path(), "lab").unwrap_err();
        assert!(err.to_string().contains("5 bytes, not 32"), "{err}");
        fs::write(&path, [3u8; 32]).unwrap();
        assert_eq!(read(dir.path(), "lab").unwrap(), Some([3u8; 32]));
    }
}
