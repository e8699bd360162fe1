//! The release tooling behind `plexsphere release-key generate` and `plexsphere release sign`:
//! a release-signing key in a PKCS#8 PEM file (what `openssl genpkey -algorithm ed25519`
//! writes, too), and a signed manifest of the plexd binaries in a directory.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::signature::{Ed25519KeyPair, KeyPair as _};
use rustls_pki_types::PrivatePkcs8KeyDer;
use rustls_pki_types::pem::PemObject as _;

use crate::checksums::sha256;
use crate::manifest::{self, ReleaseFile};
use crate::platform::Platform;

/// The DER of an Ed25519 PKCS#8 v1 private key up to the 32-byte seed (RFC 8410 §7).
const PKCS8_V1_ED25519_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// The largest binary `release sign` reads (the mirror's default cap).
pub const MAX_SIGNED_BINARY_BYTES: u64 = 512 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("{path} already exists; a release key is never overwritten (move it away first)")]
    Exists { path: PathBuf },
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is not an Ed25519 private key in a PKCS#8 PEM (`plexsphere release-key generate` writes one)"
    )]
    BadKey { path: PathBuf },
    #[error("the plexd version {0:?} is not a release version such as 1.4.2")]
    Version(String),
    #[error(
        "{dir} holds neither plexd-linux-amd64 nor plexd-linux-arm64; build the release there first"
    )]
    NoBinaries { dir: PathBuf },
    #[error("{path} is larger than the {MAX_SIGNED_BINARY_BYTES} bytes a plexd binary may have")]
    TooLarge { path: PathBuf },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ReleaseError {
    let path = path.to_owned();
    move |source| ReleaseError::Io { what, path, source }
}

/// Generates a release-signing key into `path` (created 0600, never overwritten) and answers
/// its public key (standard base64, what the server's `--plexd-release-key` takes).
pub fn generate_key(path: &Path) -> Result<String, ReleaseError> {
    use ring::rand::SecureRandom as _;
    let bad = || ReleaseError::BadKey {
        path: path.to_owned(),
    };
    let mut seed = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut seed)
        .map_err(|_| bad())?;
    let pair = Ed25519KeyPair::from_seed_unchecked(&seed).map_err(|_| bad())?;
    // PKCS#8 v1 (RFC 8410), which openssl reads too: the fixed prefix, then the seed.
    let mut pkcs8 = PKCS8_V1_ED25519_PREFIX.to_vec();
    pkcs8.extend_from_slice(&seed);
    let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
    let b64 = STANDARD.encode(&pkcs8);
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END PRIVATE KEY-----\n");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                ReleaseError::Exists {
                    path: path.to_owned(),
                }
            } else {
                io("create", path)(e)
            }
        })?;
    file.write_all(pem.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io("write", path))?;
    Ok(STANDARD.encode(pair.public_key().as_ref()))
}

/// Reads a release-signing key.
pub fn load_key(path: &Path) -> Result<Ed25519KeyPair, ReleaseError> {
    let bad = || ReleaseError::BadKey {
        path: path.to_owned(),
    };
    let pem = std::fs::read(path).map_err(io("read", path))?;
    let der = PrivatePkcs8KeyDer::from_pem_slice(&pem).map_err(|_| bad())?;
    Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der()).map_err(|_| bad())
}

/// The public key of a key pair, standard base64.
pub fn public_key_b64(pair: &Ed25519KeyPair) -> String {
    STANDARD.encode(pair.public_key().as_ref())
}

/// What `release sign` wrote.
#[derive(Debug)]
pub struct Signed {
    pub path: PathBuf,
    pub platforms: Vec<(Platform, ReleaseFile)>,
}

/// Hashes the plexd binaries in `dir` (`plexd-linux-amd64`, `plexd-linux-arm64`; at least
/// one), and writes the envelope of their manifest for `version`, signed by every key, to
/// `out` (written beside, then renamed).
pub fn sign_dir(
    dir: &Path,
    version: &str,
    keys: &[&Ed25519KeyPair],
    out: &Path,
) -> Result<Signed, ReleaseError> {
    if !plexsphere_wire::version::valid(version) {
        return Err(ReleaseError::Version(version.to_owned()));
    }
    let mut files = BTreeMap::new();
    for p in Platform::ALL {
        let path = dir.join(p.file_name());
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("read", &path)(e)),
        };
        if meta.len() > MAX_SIGNED_BINARY_BYTES {
            return Err(ReleaseError::TooLarge { path });
        }
        let bytes = std::fs::read(&path).map_err(io("read", &path))?;
        files.insert(
            p,
            ReleaseFile {
                sha256: sha256(&bytes),
                size: bytes.len() as u64,
            },
        );
    }
    if files.is_empty() {
        return Err(ReleaseError::NoBinaries {
            dir: dir.to_owned(),
        });
    }
    let body = manifest::envelope(&manifest::manifest_bytes(version, &files), keys);
    let tmp = out.with_extension("json.part");
    std::fs::write(&tmp, &body).map_err(io("write", &tmp))?;
    std::fs::rename(&tmp, out).map_err(io("write", out))?;
    Ok(Signed {
        path: out.to_owned(),
        platforms: files.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_signs_a_directory_the_verifier_accepts() {
        let dir = tempfile::tempdir().unwrap();
        let key_path = dir.path().join("release.key");
        let public = generate_key(&key_path).unwrap();
        assert!(matches!(
            generate_key(&key_path),
            Err(ReleaseError::Exists { .. })
        ));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&key_path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        let pair = load_key(&key_path).unwrap();
        assert_eq!(public_key_b64(&pair), public);

        std::fs::write(dir.path().join("plexd-linux-arm64"), b"arm build").unwrap();
        let out = dir.path().join(manifest::ENVELOPE_FILE);
        let signed = sign_dir(dir.path(), "1.2.3", &[&pair], &out).unwrap();
        assert_eq!(signed.platforms.len(), 1);
        let key = manifest::decode_key(&public).unwrap();
        let release = manifest::verify(&std::fs::read(&out).unwrap(), &[key], "1.2.3").unwrap();
        assert_eq!(release.size(Platform::LinuxArm64), Some(9));
        assert_eq!(
            release.checksums().get(Platform::LinuxArm64),
            Some(&sha256(b"arm build"))
        );
        assert!(release.checksums().get(Platform::LinuxAmd64).is_none());
    }

    #[test]
    fn refusals() {
        let dir = tempfile::tempdir().unwrap();
        let key_path = dir.path().join("k");
        std::fs::write(
            &key_path,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        assert!(matches!(
            load_key(&key_path),
            Err(ReleaseError::BadKey { .. })
        ));
        let good = dir.path().join("good");
        generate_key(&good).unwrap();
        let pair = load_key(&good).unwrap();
        let out = dir.path().join("out.json");
        assert!(matches!(
            sign_dir(dir.path(), "1.2.3", &[&pair], &out),
            Err(ReleaseError::NoBinaries { .. })
        ));
        assert!(matches!(
            sign_dir(dir.path(), "../x", &[&pair], &out),
            Err(ReleaseError::Version(_))
        ));
    }
}
