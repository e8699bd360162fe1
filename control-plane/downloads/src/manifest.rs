//! The signed release manifest: what a release-signing key vouches for (per platform: the
//! file, its SHA-256 and its size, for one version), and the envelope that carries it.
//!
//! `plexd-release.json`, the one file a release publishes beside its binaries:
//!
//! ```json
//! {"manifest":"<base64 of the manifest's JSON bytes>",
//!  "signatures":[{"key":"<base64 raw Ed25519 public key>","signature":"<base64, 64 bytes>"}]}
//! ```
//!
//! and the manifest inside:
//!
//! ```json
//! {"format":"plexsphere-release-manifest/v1","name":"plexd","version":"1.4.2",
//!  "platforms":{"linux-amd64":{"file":"plexd-linux-amd64","sha256":"<64 hex>","size":123}}}
//! ```
//!
//! Each signature is Ed25519 over [`SIGN_PREFIX`] followed by the manifest's exact bytes. The
//! prefix is distinct from every tag a Domain key signs with (`plexsphere/v1/node-state\0`,
//! `.../event\0`, `.../relay-token\0`, and the empty tag of `checksums.sha256`, whose text
//! starts with a hex digit), so no Domain signature is ever a manifest signature, even if an
//! operator reused a key. Several signatures (an old and a new key while a key rotates) are
//! allowed; one by a trusted key is enough. Signatures by keys the server does not trust are
//! ignored.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::signature::{ED25519, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

use crate::checksums::{Checksums, Digest, parse_digest};
use crate::platform::Platform;

/// The `format` of a manifest this server reads.
pub const FORMAT: &str = "plexsphere-release-manifest/v1";
/// What every manifest signature signs before the manifest's bytes (domain separation).
pub const SIGN_PREFIX: &[u8] = b"plexsphere/v1/release-manifest\0";
/// The file name `plexsphere release sign` writes and mirrors publish.
pub const ENVELOPE_FILE: &str = "plexd-release.json";
/// The most signatures an envelope may carry (a rotation needs two).
pub const MAX_SIGNATURES: usize = 8;
/// The most an envelope may weigh when fetched or read.
pub const MAX_ENVELOPE_BYTES: u64 = 64 * 1024;

/// A raw Ed25519 public key of a release-signing key.
pub type ReleaseKey = [u8; 32];

/// One platform's entry in a manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseFile {
    pub sha256: Digest,
    pub size: u64,
}

/// A manifest whose signature was checked: the version and, per platform, digest and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub version: String,
    pub files: BTreeMap<Platform, ReleaseFile>,
    /// The trusted key whose signature was accepted.
    pub signed_by: ReleaseKey,
}

impl Release {
    /// The digests, as `checksums.sha256` lists them.
    pub fn checksums(&self) -> Checksums {
        let mut c = Checksums::new();
        for (p, f) in &self.files {
            c.insert(*p, f.sha256);
        }
        c
    }

    pub fn size(&self, platform: Platform) -> Option<u64> {
        self.files.get(&platform).map(|f| f.size)
    }
}

/// Why a manifest is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("it is larger than the {MAX_ENVELOPE_BYTES} bytes a release manifest may have")]
    TooLarge,
    #[error("it is not a release manifest envelope ({0})")]
    Envelope(String),
    #[error("it carries {0} signatures; at most {MAX_SIGNATURES} are read")]
    TooManySignatures(usize),
    #[error(
        "it is not signed by a trusted release key (signed by: {found}); sign it with a key the server trusts (--plexd-release-key) or add the release's public key there"
    )]
    Untrusted { found: String },
    #[error("its manifest is malformed: {0}")]
    Malformed(String),
    #[error("it is the manifest of plexd {found}, but this server pins plexd {pinned}")]
    OtherVersion { found: String, pinned: String },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    manifest: String,
    signatures: Vec<EnvelopeSignature>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvelopeSignature {
    key: String,
    signature: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: String,
    name: String,
    version: String,
    platforms: BTreeMap<String, ManifestFile>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestFile {
    file: String,
    sha256: String,
    size: u64,
}

/// Checks an envelope: its size, a signature by one of `trusted` over the manifest's bytes,
/// then the manifest itself (format, name, `pinned` version, platforms). Nothing in the
/// manifest is read before its signature verifies.
pub fn verify(
    envelope: &[u8],
    trusted: &[ReleaseKey],
    pinned: &str,
) -> Result<Release, ManifestError> {
    if envelope.len() as u64 > MAX_ENVELOPE_BYTES {
        return Err(ManifestError::TooLarge);
    }
    let env: Envelope =
        serde_json::from_slice(envelope).map_err(|e| ManifestError::Envelope(e.to_string()))?;
    if env.signatures.len() > MAX_SIGNATURES {
        return Err(ManifestError::TooManySignatures(env.signatures.len()));
    }
    let bytes = STANDARD
        .decode(&env.manifest)
        .map_err(|_| ManifestError::Envelope("`manifest` is not base64".into()))?;
    let mut message = Vec::with_capacity(SIGN_PREFIX.len() + bytes.len());
    message.extend_from_slice(SIGN_PREFIX);
    message.extend_from_slice(&bytes);
    let mut found = Vec::new();
    let mut signed_by = None;
    for s in &env.signatures {
        let Some(key) = decode_key(&s.key) else {
            found.push("<not a key>".to_owned());
            continue;
        };
        let sig_ok = STANDARD.decode(&s.signature).is_ok_and(|sig| {
            UnparsedPublicKey::new(&ED25519, &key)
                .verify(&message, &sig)
                .is_ok()
        });
        if trusted.contains(&key) && sig_ok {
            signed_by = Some(key);
            break;
        }
        found.push(if trusted.contains(&key) {
            format!("{} (the signature does not verify)", s.key)
        } else {
            s.key.clone()
        });
    }
    let Some(signed_by) = signed_by else {
        return Err(ManifestError::Untrusted {
            found: if found.is_empty() {
                "no signature".to_owned()
            } else {
                found.join(", ")
            },
        });
    };
    let m: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| ManifestError::Malformed(e.to_string()))?;
    let files = check_manifest(&m)?;
    if m.version != pinned {
        return Err(ManifestError::OtherVersion {
            found: m.version,
            pinned: pinned.to_owned(),
        });
    }
    Ok(Release {
        version: m.version,
        files,
        signed_by,
    })
}

fn check_manifest(m: &Manifest) -> Result<BTreeMap<Platform, ReleaseFile>, ManifestError> {
    let bad = |what: String| Err(ManifestError::Malformed(what));
    if m.format != FORMAT {
        return bad(format!("format {:?} is not {FORMAT:?}", m.format));
    }
    if m.name != "plexd" {
        return bad(format!("name {:?} is not \"plexd\"", m.name));
    }
    if !plexsphere_wire::version::valid(&m.version) {
        return bad(format!("version {:?} is not a plexd version", m.version));
    }
    let mut files = BTreeMap::new();
    for (slug, f) in &m.platforms {
        // A platform this server does not know (a later release's) is skipped, not refused.
        let Some(platform) = Platform::from_slug(slug) else {
            continue;
        };
        if f.file != platform.file_name() {
            return bad(format!(
                "{slug} names the file {:?}, not {}",
                f.file,
                platform.file_name()
            ));
        }
        let Some(sha256) = parse_digest(&f.sha256) else {
            return bad(format!("{slug}'s sha256 is not 64 hex digits"));
        };
        if f.size == 0 {
            return bad(format!("{slug}'s size is 0"));
        }
        files.insert(
            platform,
            ReleaseFile {
                sha256,
                size: f.size,
            },
        );
    }
    if files.is_empty() {
        return bad("it lists none of linux-amd64 and linux-arm64".into());
    }
    Ok(files)
}

/// A standard-base64 raw Ed25519 public key (what `plexsphere release-key generate` prints).
pub fn decode_key(text: &str) -> Option<ReleaseKey> {
    STANDARD.decode(text.trim()).ok()?.try_into().ok()
}

/// The manifest bytes for a release (what [`sign`] signs).
pub fn manifest_bytes(version: &str, files: &BTreeMap<Platform, ReleaseFile>) -> Vec<u8> {
    let m = Manifest {
        format: FORMAT.to_owned(),
        name: "plexd".to_owned(),
        version: version.to_owned(),
        platforms: files
            .iter()
            .map(|(p, f)| {
                (
                    p.slug().to_owned(),
                    ManifestFile {
                        file: p.file_name().to_owned(),
                        sha256: hex::encode(f.sha256),
                        size: f.size,
                    },
                )
            })
            .collect(),
    };
    // A struct of strings, numbers and string-keyed maps always serializes.
    serde_json::to_vec(&m).unwrap_or_default()
}

/// An envelope around `manifest` with one signature per key pair.
pub fn envelope(manifest: &[u8], keys: &[&ring::signature::Ed25519KeyPair]) -> Vec<u8> {
    use ring::signature::KeyPair as _;
    let mut message = Vec::with_capacity(SIGN_PREFIX.len() + manifest.len());
    message.extend_from_slice(SIGN_PREFIX);
    message.extend_from_slice(manifest);
    let env = Envelope {
        manifest: STANDARD.encode(manifest),
        signatures: keys
            .iter()
            .map(|k| EnvelopeSignature {
                key: STANDARD.encode(k.public_key().as_ref()),
                signature: STANDARD.encode(k.sign(&message).as_ref()),
            })
            .collect(),
    };
    let mut out = serde_json::to_vec_pretty(&env).unwrap_or_default();
    out.push(b'\n');
    out
}

#[cfg(test)]
#[path = "manifest_tests.rs"]
mod tests;
