//! The files of a rotation: the *pending* WireGuard key (`wireguard.key.pending`, 0600),
//! written before the control plane hears of it and promoted over `wireguard.key` once the
//! interface uses it; and the identity rewritten with a rotated credential.
//!
//! Crash safety, per step of a key rotation (the daemon's core drives them):
//!
//! | crash after                     | on disk                  | what a restarted plexd does |
//! |---------------------------------|--------------------------|-----------------------------|
//! | the pending key was written     | key + pending            | runs with `key`, sends the same rotation again: the control plane takes it (or already has it) |
//! | the control plane took it       | key + pending            | the same: the repeat is answered as done, the interface switches |
//! | the interface switched          | key + pending            | the same (the interface is set up with `key` again first) |
//! | the pending key was promoted    | key (= the new one)      | nothing left to do |
//!
//! A pending key is never thrown away while the control plane might hold it: only when it
//! refuses the rotation for good (the key is taken by another node, or the node's key there
//! is neither the old nor the new one).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::fsutil::{self, FsError};

use super::key::{KeyError, NodeKey};

/// A private key on its way through the daemon's core to the interface (redacted in Debug).
#[derive(Clone, PartialEq, Eq)]
pub struct KeySecret(pub [u8; 32]);

impl std::fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeySecret(<redacted>)")
    }
}

/// The pending key's file name, beside `wireguard.key`.
pub(crate) const PENDING_SUFFIX: &str = ".pending";

/// Where the pending key of `key_file` lives.
pub(crate) fn pending_path(key_file: &Path) -> PathBuf {
    let mut name = key_file.as_os_str().to_owned();
    name.push(PENDING_SUFFIX);
    PathBuf::from(name)
}

/// The pending key, if one was written and not promoted yet.
pub(crate) fn load_pending(key_file: &Path) -> Result<Option<NodeKey>, KeyError> {
    let path = pending_path(key_file);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            fsutil::enforce_private(&path)?;
            NodeKey::from_base64(&text)
                .map(Some)
                .ok_or(KeyError::Malformed { path })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FsError::new("cannot read", &path, e).into()),
    }
}

/// The pending key to rotate to: the one on disk (a rotation that did not finish), or a new
/// one, written (0600, atomically) before this returns.
pub(crate) fn pending_or_generate(key_file: &Path) -> Result<(NodeKey, bool), KeyError> {
    if let Some(k) = load_pending(key_file)? {
        return Ok((k, false));
    }
    let key = NodeKey::generate();
    let text = format!("{}\n", key.private_base64());
    fsutil::write_atomic(&pending_path(key_file), text.as_bytes(), 0o600)?;
    tracing::info!(public_key = %key.public_base64(), "generated a new WireGuard key pair (pending until the control plane and the interface have it)");
    Ok((key, true))
}

/// The interface uses the pending key: it becomes `wireguard.key` (one rename, atomic). When
/// there is no pending file any more (a repeat), nothing happens.
pub fn promote(key_file: &Path) -> Result<(), KeyError> {
    let pending = pending_path(key_file);
    match std::fs::rename(&pending, key_file) {
        Ok(()) => {
            if let Some(dir) = key_file.parent()
                && let Ok(d) = std::fs::File::open(dir)
            {
                let _ = d.sync_all();
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FsError::new("cannot rename into place", key_file, e).into()),
    }
}

/// The control plane refused the pending key for good: remove it (the next rotation makes
/// a fresh one).
pub fn discard(key_file: &Path) -> Result<(), KeyError> {
    fsutil::remove_file_if_present(&pending_path(key_file))
        .map(|_| ())
        .map_err(|e| FsError::new("cannot remove", &pending_path(key_file), e).into())
}

/// When the key in `key_file` was last written (generated or promoted), the age a scheduled
/// rotation counts from.
pub(crate) fn key_written_at(key_file: &Path) -> Option<SystemTime> {
    std::fs::metadata(key_file).and_then(|m| m.modified()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_key_survives_until_promoted_and_then_is_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("wireguard.key");
        let (old, _) = NodeKey::load_or_generate(&key_file).unwrap();
        assert!(load_pending(&key_file).unwrap().is_none());
        let (p1, fresh) = pending_or_generate(&key_file).unwrap();
        assert!(fresh);
        assert_eq!(fsutil::mode_of(&pending_path(&key_file)).unwrap(), 0o600);
        // a crash here: the same pending key is found again, not a new one
        let (p2, fresh) = pending_or_generate(&key_file).unwrap();
        assert!(!fresh);
        assert_eq!(p1.public_base64(), p2.public_base64());
        assert_ne!(p1.public_base64(), old.public_base64());
        // the current key is untouched until the promotion
        let (k, _) = NodeKey::load_or_generate(&key_file).unwrap();
        assert_eq!(k.public_base64(), old.public_base64());
        promote(&key_file).unwrap();
        let (k, created) = NodeKey::load_or_generate(&key_file).unwrap();
        assert!(!created);
        assert_eq!(k.public_base64(), p1.public_base64());
        assert_eq!(fsutil::mode_of(&key_file).unwrap(), 0o600);
        assert!(load_pending(&key_file).unwrap().is_none());
        // promoting again (a repeat after a crash) changes nothing
        promote(&key_file).unwrap();
        let (k, _) = NodeKey::load_or_generate(&key_file).unwrap();
        assert_eq!(k.public_base64(), p1.public_base64());
    }

    #[test]
    fn a_discarded_pending_key_is_gone_and_a_malformed_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("wireguard.key");
        pending_or_generate(&key_file).unwrap();
        discard(&key_file).unwrap();
        assert!(load_pending(&key_file).unwrap().is_none());
        discard(&key_file).unwrap();
        std::fs::write(pending_path(&key_file), "junk").unwrap();
        let e = load_pending(&key_file).unwrap_err().to_string();
        assert!(e.contains("wireguard.key.pending"), "{e}");
    }
}
