//! The audit pepper: 32 random bytes kept outside the database, like the KEK
//! (`keys/kek.rs`), under which each chain's key is derived (`HMAC(pepper, chain id)`). The
//! chain key keys people's identifiers and MACs the rows and the head, so a database dump
//! alone neither names the people nor lets its holder write rows that verify.
//!
//! Where a replica finds it, first match wins: `--audit-pepper-file` (or
//! `PLEXSPHERE_AUDIT_PEPPER_FILE`), then the systemd credential
//! `$CREDENTIALS_DIRECTORY/plexsphere-audit-pepper`; when neither is there it is derived from
//! the KEK with HKDF-SHA256 under [`KEK_LABEL`] (docs/audit.md says what a KEK rotation then
//! means). `plexsphere dev` keeps one in its data directory ([`DEV_PEPPER_FILE`]). The file is
//! base64 text of 32 bytes (what `plexsphere audit-pepper generate` writes) or the raw bytes.

use std::fmt;
use std::path::{Path, PathBuf};

use ring::hmac;

use crate::keys::kek::{generate_or_read, secret_file};
use crate::keys::{Kek, KekError, Keyring};

/// The systemd credential name a replica looks for in `$CREDENTIALS_DIRECTORY`.
pub const CREDENTIAL_NAME: &str = "plexsphere-audit-pepper";
/// The pepper file `plexsphere dev` keeps in its data directory.
pub const DEV_PEPPER_FILE: &str = "audit-pepper";
/// The HKDF label of the pepper derived from the KEK when none is configured.
pub const KEK_LABEL: &[u8] = b"plexsphere audit pepper v1";

#[derive(Debug, thiserror::Error)]
pub enum PepperError {
    /// A pepper file that cannot be used (the file format is the KEK's).
    #[error("audit pepper: {0}")]
    File(String),
    #[error("the audit pepper is derived from the key-encryption key, which cannot be read: {0}")]
    Kek(String),
}

fn file_error(e: KekError) -> PepperError {
    // The KEK's messages name `plexsphere kek generate`; say the pepper's command instead.
    PepperError::File(
        e.to_string()
            .replace("key-encryption key", "audit pepper")
            .replace(
                "plexsphere kek generate",
                "plexsphere audit-pepper generate",
            )
            .replace("KEK", "pepper"),
    )
}

/// Where this replica's pepper comes from.
#[derive(Clone)]
pub enum Pepper {
    /// Read from a file (the flag, the systemd credential, `plexsphere dev`'s data directory).
    File { key: hmac::Key, origin: String },
    /// Derived from the KEK of the replica's keyring when used.
    FromKek,
}

impl fmt::Debug for Pepper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pepper::File { origin, .. } => {
                f.debug_struct("Pepper").field("origin", origin).finish()
            }
            Pepper::FromKek => f.write_str("Pepper(derived from the KEK)"),
        }
    }
}

impl Pepper {
    fn from_kek_file(kek: Kek) -> Self {
        // The file format and checks are the KEK's; its 32 bytes are the pepper's HMAC key.
        let origin = kek.origin().to_owned();
        Pepper::File {
            key: kek.as_hmac_key(),
            origin,
        }
    }

    /// Reads a pepper file.
    pub fn read(path: &Path) -> Result<Self, PepperError> {
        Kek::read(path).map(Self::from_kek_file).map_err(file_error)
    }

    /// The pepper of a replica: `flag` when given, else the systemd credential in
    /// `credentials_dir`, else derived from the KEK.
    pub fn locate(
        flag: Option<&Path>,
        credentials_dir: Option<&Path>,
    ) -> Result<Self, PepperError> {
        match secret_file(flag, credentials_dir, CREDENTIAL_NAME) {
            Some(path) => Self::read(&path),
            None => Ok(Pepper::FromKek),
        }
    }

    /// `plexsphere dev`'s pepper: `<data-dir>/audit-pepper`, made on first start.
    pub fn dev(data_dir: &Path) -> Result<Self, PepperError> {
        generate_or_read(&data_dir.join(DEV_PEPPER_FILE))
            .map(Self::from_kek_file)
            .map_err(file_error)
    }

    /// Where it comes from (for messages; never the bytes).
    pub fn origin(&self) -> String {
        match self {
            Pepper::File { origin, .. } => origin.clone(),
            Pepper::FromKek => "derived from the key-encryption key".into(),
        }
    }

    /// The pepper as an HMAC-SHA256 key.
    pub fn key(&self, keys: &Keyring) -> Result<hmac::Key, PepperError> {
        match self {
            Pepper::File { key, .. } => Ok(key.clone()),
            Pepper::FromKek => keys
                .derive_hmac_key(KEK_LABEL)
                .map_err(|e| PepperError::Kek(e.to_string())),
        }
    }
}

/// `plexsphere audit-pepper generate --out F`: a fresh pepper in a new file (mode 0600, never
/// overwritten).
pub fn generate(out: &Path) -> Result<PathBuf, PepperError> {
    crate::keys::kek::generate(out).map_err(file_error)?;
    Ok(out.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_wins_then_the_credential_then_the_kek() {
        let creds = tempfile::tempdir().unwrap();
        generate(&creds.path().join(CREDENTIAL_NAME)).unwrap();
        let found = Pepper::locate(None, Some(creds.path())).unwrap();
        assert!(found.origin().contains(CREDENTIAL_NAME), "{found:?}");
        let other = tempfile::tempdir().unwrap();
        let flag = other.path().join("p");
        generate(&flag).unwrap();
        let found = Pepper::locate(Some(&flag), Some(creds.path())).unwrap();
        assert_eq!(found.origin(), flag.display().to_string());
        let none = tempfile::tempdir().unwrap();
        assert!(matches!(
            Pepper::locate(None, Some(none.path())).unwrap(),
            Pepper::FromKek
        ));
    }

    #[test]
    fn dev_keeps_one_and_errors_name_the_pepper() {
        let dir = tempfile::tempdir().unwrap();
        let a = Pepper::dev(dir.path()).unwrap();
        let b = Pepper::dev(dir.path()).unwrap();
        let (Pepper::File { key: ka, .. }, Pepper::File { key: kb, .. }) = (a, b) else {
            panic!("dev reads a file");
        };
        assert_eq!(
            hmac::sign(&ka, b"x").as_ref(),
            hmac::sign(&kb, b"x").as_ref()
        );
        let err = generate(&dir.path().join(DEV_PEPPER_FILE))
            .unwrap_err()
            .to_string();
        assert!(err.contains("audit pepper"), "{err}");
        let short = dir.path().join("short");
        std::fs::write(&short, "c2hvcnQ=").unwrap();
        let err = Pepper::read(&short).unwrap_err().to_string();
        assert!(err.contains("audit-pepper generate"), "{err}");
    }
}
