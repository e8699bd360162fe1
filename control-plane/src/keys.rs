//! Each Domain's Ed25519 signing key, kept as a raw 32-byte seed in
//! `<data-dir>/domain-keys/<domain-slug>.seed` (0600, directory 0700), created on first need.

use std::collections::HashMap;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use plexsphere_wire::signed::DomainSigner;
use ring::rand::{SecureRandom as _, SystemRandom};

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "cannot {action} {path}: {source}; check that the data directory exists and is writable by plexsphere"
    )]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the Domain key seed {path} is {len} bytes, not 32; restore the original file (nodes trust its key) or move it away to make a new one"
    )]
    BadLength { path: PathBuf, len: usize },
    #[error("the system random generator failed while creating {0}")]
    Random(PathBuf),
    #[error("the Domain key seed {0} is not a usable Ed25519 seed")]
    BadSeed(PathBuf),
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> KeyError {
    let path = path.to_owned();
    move |source| KeyError::Io {
        action,
        path,
        source,
    }
}

/// Where a Domain's seed lives.
pub fn seed_path(data_dir: &Path, domain_slug: &str) -> PathBuf {
    data_dir
        .join("domain-keys")
        .join(format!("{domain_slug}.seed"))
}

/// Loads the Domain's signer, generating and saving a fresh seed when none exists yet.
pub fn load_or_create(data_dir: &Path, domain_slug: &str) -> Result<DomainSigner, KeyError> {
    let path = seed_path(data_dir, domain_slug);
    let seed = match fs::read(&path) {
        Ok(bytes) => to_seed(&path, bytes)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(&path)?,
        Err(e) => return Err(io("read", &path)(e)),
    };
    DomainSigner::from_seed(&seed).map_err(|_| KeyError::BadSeed(path))
}

fn to_seed(path: &Path, bytes: Vec<u8>) -> Result<[u8; 32], KeyError> {
    let len = bytes.len();
    bytes.try_into().map_err(|_| KeyError::BadLength {
        path: path.to_owned(),
        len,
    })
}

fn create(path: &Path) -> Result<[u8; 32], KeyError> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(io("create", dir))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(io("set the mode of", dir))?;
    }
    let mut seed = [0u8; 32];
    SystemRandom::new()
        .fill(&mut seed)
        .map_err(|_| KeyError::Random(path.to_owned()))?;
    // create_new: two processes starting at once never overwrite each other's key.
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut f) => {
            f.write_all(&seed).map_err(io("write", path))?;
            f.sync_all().map_err(io("sync", path))?;
            tracing::info!(path = %path.display(), "created a new Domain signing key");
            Ok(seed)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let bytes = fs::read(path).map_err(io("read", path))?;
            to_seed(path, bytes)
        }
        Err(e) => Err(io("create", path)(e)),
    }
}

/// The Domain signers of one data directory, loaded (or created) once and then cached.
pub struct Keyring {
    data_dir: PathBuf,
    cache: Mutex<HashMap<String, Arc<DomainSigner>>>,
}

impl Keyring {
    pub fn new(data_dir: &Path) -> Self {
        Self {
            data_dir: data_dir.to_owned(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The signer of the Domain `slug`, creating its seed on first need.
    pub fn signer(&self, slug: &str) -> Result<Arc<DomainSigner>, KeyError> {
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(s) = cache.get(slug) {
            return Ok(s.clone());
        }
        let signer = Arc::new(load_or_create(&self.data_dir, slug)?);
        cache.insert(slug.to_owned(), signer.clone());
        Ok(signer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_then_reused_with_private_modes() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path(), "lab").unwrap();
        let b = load_or_create(dir.path(), "lab").unwrap();
        assert_eq!(a.public_key_b64(), b.public_key_b64());
        let path = seed_path(dir.path(), "lab");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let dmode = fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dmode, 0o700);
        let other = load_or_create(dir.path(), "prod").unwrap();
        assert_ne!(other.public_key_b64(), a.public_key_b64());
    }

    #[test]
    fn wrong_size_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = seed_path(dir.path(), "lab");
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, b"short").unwrap();
        let err = load_or_create(dir.path(), "lab").err().unwrap();
        assert!(err.to_string().contains("5 bytes, not 32"), "{err}");
    }
}
