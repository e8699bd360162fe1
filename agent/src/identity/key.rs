//! The node's WireGuard key pair. The private key is generated here, saved 0600 in the state
//! dir before any network call, and never leaves the node.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use boringtun::x25519::{PublicKey, StaticSecret};
use rand_core::OsRng;

use crate::fsutil::{self, FsError};

/// The private key (redacted in Debug) and its public half.
#[derive(Clone)]
pub struct NodeKey {
    secret: StaticSecret,
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NodeKey(public {}, private <redacted>)",
            self.public_base64()
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(
        "the WireGuard key file {path} is not base64 of 32 bytes; move it away to generate a new key (the node must then enrol again)"
    )]
    Malformed { path: PathBuf },
}

impl NodeKey {
    pub fn generate() -> Self {
        Self {
            secret: StaticSecret::random_from_rng(OsRng),
        }
    }

    /// Parses the key file's text: standard base64 of 32 bytes, as `wg genkey` writes it.
    pub fn from_base64(text: &str) -> Option<Self> {
        let bytes = STANDARD.decode(text.trim()).ok()?;
        let arr: [u8; 32] = bytes.try_into().ok()?;
        Some(Self {
            secret: StaticSecret::from(arr),
        })
    }

    pub fn public(&self) -> PublicKey {
        PublicKey::from(&self.secret)
    }

    /// The public key as `wg pubkey` prints it.
    pub(crate) fn public_base64(&self) -> String {
        STANDARD.encode(self.public().as_bytes())
    }

    pub fn secret(&self) -> &StaticSecret {
        &self.secret
    }

    pub(super) fn private_base64(&self) -> String {
        STANDARD.encode(self.secret.to_bytes())
    }

    /// Loads the key from `path`, or generates one and saves it (0600) when there is none.
    /// Returns the key and whether it was generated now.
    pub(crate) fn load_or_generate(path: &Path) -> Result<(Self, bool), KeyError> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                fsutil::enforce_private(path)?;
                let key = Self::from_base64(&text).ok_or_else(|| KeyError::Malformed {
                    path: path.to_path_buf(),
                })?;
                Ok((key, false))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = Self::generate();
                let text = format!("{}\n", key.private_base64());
                fsutil::write_atomic(path, text.as_bytes(), 0o600)?;
                tracing::info!(path = %path.display(), public_key = %key.public_base64(), "generated the WireGuard key pair");
                Ok((key, true))
            }
            Err(e) => Err(FsError::new("cannot read", path, e).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generate_save_and_reload_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("wireguard.key");
        let (k1, created) = NodeKey::load_or_generate(&p).unwrap();
        assert!(created);
        assert_eq!(fsutil::mode_of(&p).unwrap(), 0o600);
        let (k2, created) = NodeKey::load_or_generate(&p).unwrap();
        assert!(!created);
        assert_eq!(k1.public_base64(), k2.public_base64());
        assert_eq!(STANDARD.decode(k1.public_base64()).unwrap().len(), 32);
        let dbg = format!("{k1:?}");
        assert!(!dbg.contains(&k1.private_base64()), "{dbg}");
    }

    #[test]
    fn a_malformed_key_file_is_refused_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("wireguard.key");
        std::fs::write(&p, "not a key").unwrap();
        let e = NodeKey::load_or_generate(&p).unwrap_err().to_string();
        assert!(e.contains("wireguard.key") && e.contains("32 bytes"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "not a key");
    }
}
