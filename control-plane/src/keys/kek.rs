//! The key-encryption key (KEK): 32 random bytes every replica reads, under which the Domain
//! keys are sealed in the database. It never goes into the database, so a database dump alone
//! does not hold a usable Domain key.
//!
//! Where a replica finds it, first match wins: `--key-encryption-key-file` (or
//! `PLEXSPHERE_KEY_ENCRYPTION_KEY_FILE`), then the systemd credential
//! `$CREDENTIALS_DIRECTORY/plexsphere-kek` (`LoadCredential=plexsphere-kek:...`). `plexsphere
//! dev` keeps one in its data directory ([`DEV_KEK_FILE`]). The file holds the key as base64
//! text (what `plexsphere kek generate` writes) or as the 32 raw bytes.

use std::fmt;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::rand::{SecureRandom as _, SystemRandom};
use ring::{hkdf, hmac};

/// Bytes of a KEK.
pub const KEK_LEN: usize = 32;
/// The systemd credential name a replica looks for in `$CREDENTIALS_DIRECTORY`.
pub const CREDENTIAL_NAME: &str = "plexsphere-kek";
/// The KEK file `plexsphere dev` keeps in its data directory.
pub const DEV_KEK_FILE: &str = "key-encryption-key";
/// A KEK file larger than this is not a KEK (read no further).
const MAX_FILE_BYTES: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum KekError {
    #[error(
        "no key-encryption key: pass --key-encryption-key-file (or PLEXSPHERE_KEY_ENCRYPTION_KEY_FILE), or give the unit LoadCredential={CREDENTIAL_NAME}:<file>; make one with `plexsphere kek generate --out <file>` (every replica needs the same one)"
    )]
    Missing,
    #[error(
        "cannot {action} the key-encryption key {path}: {source}; check the path and that plexsphere may read it"
    )]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the key-encryption key {path} is {len} bytes, not {KEK_LEN} (raw) or their base64 text; use the file `plexsphere kek generate` wrote"
    )]
    WrongSize { path: PathBuf, len: usize },
    #[error("{0} already exists; a KEK is never overwritten (the Domain keys are sealed under it)")]
    Exists(PathBuf),
    #[error("the system random generator failed while making a key-encryption key")]
    Random,
}

/// A key-encryption key. Its bytes are never printed (`Debug` shows where it came from).
#[derive(Clone)]
pub struct Kek {
    bytes: [u8; KEK_LEN],
    origin: String,
}

impl fmt::Debug for Kek {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kek").field("origin", &self.origin).finish()
    }
}

impl Kek {
    pub fn from_bytes(bytes: [u8; KEK_LEN], origin: impl Into<String>) -> Self {
        Self {
            bytes,
            origin: origin.into(),
        }
    }

    pub(super) fn bytes(&self) -> &[u8; KEK_LEN] {
        &self.bytes
    }

    /// An HMAC-SHA256 key derived from this KEK for one purpose (HKDF-SHA256, `label` as its
    /// info): keys of different labels are independent of each other and of the sealing key,
    /// and none of them gives the KEK back.
    pub fn derive_hmac_key(&self, label: &[u8]) -> hmac::Key {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(&self.bytes);
        let info = [label];
        let okm = prk.expand(&info, hmac::HMAC_SHA256).unwrap_or_else(|_| {
            unreachable!("HKDF-SHA256 gives up to 8160 bytes; an HMAC-SHA256 key is 32")
        });
        hmac::Key::from(okm)
    }

    /// 32 key bytes derived from this KEK for one purpose (HKDF-SHA256, `label` as its info),
    /// for a symmetric key that is not an HMAC key (the cloud credentials' sealing key):
    /// independent of every other label's key, and none gives the KEK back.
    pub fn derive_key_bytes(&self, label: &[u8]) -> [u8; 32] {
        struct Len32;
        impl hkdf::KeyType for Len32 {
            fn len(&self) -> usize {
                32
            }
        }
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(&self.bytes);
        let info = [label];
        let mut out = [0u8; 32];
        prk.expand(&info, Len32)
            .and_then(|okm| okm.fill(&mut out))
            .unwrap_or_else(|_| unreachable!("HKDF-SHA256 gives up to 8160 bytes; 32 are asked"));
        out
    }

    /// These 32 bytes themselves as an HMAC-SHA256 key: for a file of the KEK's format that
    /// holds another secret (the audit pepper, `crate::audit::pepper`), never for the KEK.
    pub(crate) fn as_hmac_key(&self) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &self.bytes)
    }

    /// Writes this KEK to a new file `out` as base64 text, mode 0600 (what [`generate`] writes);
    /// never overwrites, never follows a symlink at `out`.
    pub fn write_new(&self, out: &Path) -> Result<(), KekError> {
        write_new(out, &self.bytes)
    }

    /// Where the key was read from (for messages).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Reads a KEK file: base64 text of 32 bytes (surrounding whitespace ignored) or 32 raw bytes.
    pub fn read(path: &Path) -> Result<Self, KekError> {
        let io = |action| {
            let path = path.to_owned();
            move |source| KekError::Io {
                action,
                path,
                source,
            }
        };
        let len = fs::metadata(path).map_err(io("read"))?.len();
        if len > MAX_FILE_BYTES {
            return Err(KekError::WrongSize {
                path: path.to_owned(),
                len: usize::try_from(len).unwrap_or(usize::MAX),
            });
        }
        let raw = fs::read(path).map_err(io("read"))?;
        let decoded = std::str::from_utf8(&raw)
            .ok()
            .and_then(|text| STANDARD.decode(text.trim()).ok());
        let bytes = match decoded {
            Some(d) if d.len() == KEK_LEN => d,
            _ => raw,
        };
        let len = bytes.len();
        let bytes: [u8; KEK_LEN] = bytes.try_into().map_err(|_| KekError::WrongSize {
            path: path.to_owned(),
            len,
        })?;
        Ok(Self::from_bytes(bytes, path.display().to_string()))
    }

    /// The KEK of a replica: `flag` (the file option) when given, else the systemd credential
    /// in `credentials_dir` (`$CREDENTIALS_DIRECTORY`), else [`KekError::Missing`].
    pub fn locate(flag: Option<&Path>, credentials_dir: Option<&Path>) -> Result<Self, KekError> {
        match secret_file(flag, credentials_dir, CREDENTIAL_NAME) {
            Some(path) => Self::read(&path),
            None => Err(KekError::Missing),
        }
    }

    /// `plexsphere dev`'s KEK: `<data-dir>/key-encryption-key`, made on first start.
    pub fn dev(data_dir: &Path) -> Result<Self, KekError> {
        generate_or_read(&data_dir.join(DEV_KEK_FILE))
    }
}

/// Where a replica's secret file is (the KEK, the audit pepper), first match wins: the file
/// option when given, else the systemd credential `credential` in `credentials_dir`
/// (`$CREDENTIALS_DIRECTORY`) when it is there; `None` when neither names one.
pub fn secret_file(
    flag: Option<&Path>,
    credentials_dir: Option<&Path>,
    credential: &str,
) -> Option<PathBuf> {
    if let Some(path) = flag {
        return Some(path.to_owned());
    }
    credentials_dir
        .map(|dir| dir.join(credential))
        .filter(|path| path.exists())
}

/// A secret file `plexsphere dev` keeps in its data directory: made on first start, read after.
pub fn generate_or_read(path: &Path) -> Result<Kek, KekError> {
    match generate(path) {
        Ok(kek) => Ok(kek),
        Err(KekError::Exists(_)) => Kek::read(path),
        Err(e) => Err(e),
    }
}

/// Makes a fresh KEK and writes it to `out` as base64 text, mode 0600; never overwrites.
pub fn generate(out: &Path) -> Result<Kek, KekError> {
    let mut bytes = [0u8; KEK_LEN];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| KekError::Random)?;
    write_new(out, &bytes)?;
    Ok(Kek::from_bytes(bytes, out.display().to_string()))
}

/// Writes `bytes` to a new file `out` as base64 text, mode 0600 (`create_new`: an existing
/// file or symlink at `out` is refused, never followed).
fn write_new(out: &Path, bytes: &[u8; KEK_LEN]) -> Result<(), KekError> {
    let io = |action| {
        let path = out.to_owned();
        move |source| KekError::Io {
            action,
            path,
            source,
        }
    };
    let mut f = match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(KekError::Exists(out.to_owned()));
        }
        Err(e) => return Err(io("create")(e)),
    };
    f.write_all(format!("{}\n", STANDARD.encode(bytes)).as_bytes())
        .map_err(io("write"))?;
    f.sync_all().map_err(io("sync"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn generated_is_private_read_back_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kek");
        let made = generate(&path).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(Kek::read(&path).unwrap().bytes(), made.bytes());
        assert!(matches!(generate(&path), Err(KekError::Exists(_))));
        assert_eq!(Kek::read(&path).unwrap().bytes(), made.bytes());
        // The raw form is read too.
        let raw = dir.path().join("raw");
        fs::write(&raw, made.bytes()).unwrap();
        assert_eq!(Kek::read(&raw).unwrap().bytes(), made.bytes());
        assert!(!format!("{made:?}").contains(&STANDARD.encode(made.bytes())));
    }

    #[test]
    fn missing_and_wrong_size_are_clear() {
        let dir = tempfile::tempdir().unwrap();
        let err = Kek::locate(None, Some(dir.path())).unwrap_err();
        assert!(matches!(err, KekError::Missing), "{err}");
        assert!(err.to_string().contains("plexsphere kek generate"), "{err}");
        let short = dir.path().join("short");
        fs::write(&short, STANDARD.encode([1u8; 16])).unwrap();
        let err = Kek::read(&short).unwrap_err().to_string();
        assert!(err.contains("not 32"), "{err}");
        let gone = Kek::locate(Some(&dir.path().join("nope")), None).unwrap_err();
        assert!(gone.to_string().contains("cannot read"), "{gone}");
    }

    #[test]
    fn the_flag_wins_over_the_systemd_credential() {
        let creds = tempfile::tempdir().unwrap();
        let cred = generate(&creds.path().join(CREDENTIAL_NAME)).unwrap();
        let found = Kek::locate(None, Some(creds.path())).unwrap();
        assert_eq!(found.bytes(), cred.bytes());
        let other = tempfile::tempdir().unwrap();
        let flag = generate(&other.path().join("k")).unwrap();
        let found = Kek::locate(Some(&other.path().join("k")), Some(creds.path())).unwrap();
        assert_eq!(found.bytes(), flag.bytes());
        assert_ne!(flag.bytes(), cred.bytes());
    }

    #[test]
    fn derived_keys_depend_on_the_kek_and_the_label() {
        let a = Kek::from_bytes([1; KEK_LEN], "a");
        let b = Kek::from_bytes([2; KEK_LEN], "b");
        let tag = |k: &Kek, label: &[u8]| hmac::sign(&k.derive_hmac_key(label), b"m");
        assert_eq!(tag(&a, b"x").as_ref(), tag(&a, b"x").as_ref());
        assert_ne!(tag(&a, b"x").as_ref(), tag(&a, b"y").as_ref());
        assert_ne!(tag(&a, b"x").as_ref(), tag(&b, b"x").as_ref());
        // Written back, the same key reads in.
        let dir = tempfile::tempdir().unwrap();
        a.write_new(&dir.path().join("k")).unwrap();
        assert_eq!(Kek::read(&dir.path().join("k")).unwrap().bytes(), a.bytes());
        assert!(matches!(
            a.write_new(&dir.path().join("k")),
            Err(KekError::Exists(_))
        ));
    }

    #[test]
    fn dev_makes_one_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let a = Kek::dev(dir.path()).unwrap();
        let b = Kek::dev(dir.path()).unwrap();
        assert_eq!(a.bytes(), b.bytes());
    }
}
