//! A backup's manifest, `BACKUP`: the format version, whether secrets were included, every
//! file with its SHA-256 and size, the secret files left out, and an HMAC-SHA256 over all of
//! it under a key derived from the key-encryption key (HKDF-SHA256, label
//! [`MAC_LABEL`]). Whoever rewrites a file and its line cannot make the MAC without the KEK:
//! `restore` finds tampering, not only damage.
//!
//! ```text
//! plexsphere backup 2
//! secrets omitted
//! kek-id 5f0c...            (which KEK keyed it: an HMAC of a second derived key, for messages)
//! file <sha256> <size> plexsphere.db
//! omitted key-encryption-key
//! hmac-sha256 <hex>         (over every byte above this line)
//! ```
//!
//! Format 1 (`plexsphere backup 1`, before this version): `<sha256>  <path>` lines, no MAC.

use std::path::{Path, PathBuf};

use ring::hmac;

use super::super::failure::Failure;
use super::files::plain_relative;
use crate::keys::Kek;

/// The first line of a keyed manifest (format 2).
pub(crate) const HEADER: &str = "plexsphere backup 2";
/// The first line of an older, unkeyed manifest.
pub(crate) const HEADER_V1: &str = "plexsphere backup 1";
/// The HKDF label of the manifest's MAC key.
const MAC_LABEL: &[u8] = b"plexsphere backup manifest v2";
/// The HKDF label of the key whose tag names the KEK in the manifest (`kek-id`).
const KEK_ID_LABEL: &[u8] = b"plexsphere backup kek id v2";
/// A manifest larger than this is not one (read no further).
pub(crate) const MANIFEST_LIMIT: u64 = 1024 * 1024;

/// One file of a backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub path: PathBuf,
    pub sha256: String,
    /// None in a format 1 manifest (it has no sizes).
    pub size: Option<u64>,
}

/// What a manifest says, once parsed.
#[derive(Debug, Default)]
pub struct Manifest {
    pub secrets_included: bool,
    pub files: Vec<Entry>,
    /// Secret files of the data directory the backup left out.
    pub omitted: Vec<PathBuf>,
}

/// A parsed manifest: keyed (to be verified) or of format 1.
pub(crate) enum Parsed {
    Keyed {
        manifest: Manifest,
        body: String,
        kek_id: String,
        mac: Vec<u8>,
    },
    Unkeyed(Manifest),
}

fn kek_id(kek: &Kek) -> String {
    let tag = hmac::sign(&kek.derive_hmac_key(KEK_ID_LABEL), b"kek-id");
    hex::encode(&tag.as_ref()[..16])
}

impl Manifest {
    /// The manifest's text, keyed under `kek`.
    pub(crate) fn render(&self, kek: &Kek) -> String {
        let secrets = if self.secrets_included {
            "included"
        } else {
            "omitted"
        };
        let mut body = format!("{HEADER}\nsecrets {secrets}\nkek-id {}\n", kek_id(kek));
        for e in &self.files {
            body.push_str(&format!(
                "file {} {} {}\n",
                e.sha256,
                e.size.unwrap_or_default(),
                e.path.display()
            ));
        }
        for o in &self.omitted {
            body.push_str(&format!("omitted {}\n", o.display()));
        }
        let mac = hmac::sign(&kek.derive_hmac_key(MAC_LABEL), body.as_bytes());
        format!("{body}hmac-sha256 {}\n", hex::encode(mac.as_ref()))
    }

    /// The entry of `rel`, if the backup holds it.
    pub(crate) fn file(&self, rel: &Path) -> Option<&Entry> {
        self.files.iter().find(|e| e.path == rel)
    }
}

fn malformed(path: &Path, what: impl std::fmt::Display) -> Failure {
    Failure::Runtime(anyhow::anyhow!(
        "{} is not a well-formed plexsphere backup manifest ({what}); the backup was changed or damaged, nothing was written",
        path.display()
    ))
}

/// Parses a manifest's text (read from `path`, for messages). Checks its form only: the MAC
/// is checked by [`verify`].
pub fn parse(text: &str, path: &Path) -> Result<Parsed, Failure> {
    let first = text.lines().next().unwrap_or_default();
    if first == HEADER_V1 {
        return parse_v1(text, path).map(Parsed::Unkeyed);
    }
    if first != HEADER {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "{} is not a plexsphere backup manifest (it starts {first:?}, not {HEADER:?}); pass --from the directory plexsphere backup wrote",
            path.display()
        )));
    }
    let trimmed = text
        .strip_suffix('\n')
        .ok_or_else(|| malformed(path, "no final newline"))?;
    let (body, mac_line) = match trimmed.rfind('\n') {
        Some(i) => (&text[..=i], &trimmed[i + 1..]),
        None => return Err(malformed(path, "no MAC line")),
    };
    let mac = mac_line
        .strip_prefix("hmac-sha256 ")
        .and_then(|h| hex::decode(h).ok())
        .ok_or_else(|| malformed(path, "its last line is not `hmac-sha256 <hex>`"))?;
    let mut manifest = Manifest::default();
    let mut kek_id = None;
    let mut secrets = None;
    for line in body.lines().skip(1) {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "secrets" if secrets.is_none() => {
                secrets = Some(match rest {
                    "included" => true,
                    "omitted" => false,
                    _ => return Err(malformed(path, format!("line {line:?}"))),
                });
            }
            "kek-id" if kek_id.is_none() => kek_id = Some(rest.to_owned()),
            "file" => {
                let mut parts = rest.splitn(3, ' ');
                let (Some(sha256), Some(size), Some(rel)) =
                    (parts.next(), parts.next(), parts.next())
                else {
                    return Err(malformed(path, format!("line {line:?}")));
                };
                let size = size
                    .parse()
                    .map_err(|_| malformed(path, format!("line {line:?}")))?;
                manifest.files.push(Entry {
                    path: relative(rel, path)?,
                    sha256: sha256.to_owned(),
                    size: Some(size),
                });
            }
            "omitted" => manifest.omitted.push(relative(rest, path)?),
            _ => return Err(malformed(path, format!("line {line:?}"))),
        }
    }
    manifest.secrets_included = secrets.ok_or_else(|| malformed(path, "no `secrets` line"))?;
    let kek_id = kek_id.ok_or_else(|| malformed(path, "no `kek-id` line"))?;
    check_unique(&manifest, path)?;
    Ok(Parsed::Keyed {
        manifest,
        body: body.to_owned(),
        kek_id,
        mac,
    })
}

/// Checks the MAC of a keyed manifest under `kek` (in constant time).
pub(crate) fn verify(
    body: &str,
    kek_id_stated: &str,
    mac: &[u8],
    kek: &Kek,
    path: &Path,
) -> Result<(), Failure> {
    if hmac::verify(&kek.derive_hmac_key(MAC_LABEL), body.as_bytes(), mac).is_ok() {
        return Ok(());
    }
    let why = if kek_id_stated == kek_id(kek) {
        "the backup was changed after it was made (a file and its line, or the manifest itself)"
    } else {
        "the backup was made under another key-encryption key, or changed after it was made"
    };
    Err(Failure::Runtime(anyhow::anyhow!(
        "the manifest {} does not verify under the key-encryption key {} (HMAC-SHA256): {why}; nothing was written",
        path.display(),
        kek.origin()
    )))
}

fn relative(text: &str, path: &Path) -> Result<PathBuf, Failure> {
    plain_relative(text).ok_or_else(|| {
        malformed(
            path,
            format!("{text:?} is not a plain relative path inside the backup"),
        )
    })
}

fn check_unique(m: &Manifest, path: &Path) -> Result<(), Failure> {
    let mut all: Vec<&Path> = m.files.iter().map(|e| e.path.as_path()).collect();
    all.extend(m.omitted.iter().map(PathBuf::as_path));
    let n = all.len();
    all.sort();
    all.dedup();
    if all.len() != n {
        return Err(malformed(path, "a path is named twice"));
    }
    Ok(())
}

/// Format 1: `<sha256>  <path>` lines, no sizes, no MAC.
fn parse_v1(text: &str, path: &Path) -> Result<Manifest, Failure> {
    let mut manifest = Manifest::default();
    for line in text.lines().skip(1) {
        let Some((digest, rel)) = line.split_once("  ") else {
            return Err(malformed(path, format!("line {line:?}")));
        };
        manifest.files.push(Entry {
            path: relative(rel, path)?,
            sha256: digest.to_owned(),
            size: None,
        });
    }
    check_unique(&manifest, path)?;
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            secrets_included: false,
            files: vec![Entry {
                path: PathBuf::from("plexsphere.db"),
                sha256: "ab".repeat(32),
                size: Some(4096),
            }],
            omitted: vec![PathBuf::from("key-encryption-key")],
        }
    }

    fn check(text: &str, kek: &Kek) -> Result<Manifest, Failure> {
        let path = Path::new("BACKUP");
        match parse(text, path)? {
            Parsed::Keyed {
                manifest,
                body,
                kek_id,
                mac,
            } => verify(&body, &kek_id, &mac, kek, path).map(|()| manifest),
            Parsed::Unkeyed(_) => panic!("unkeyed"),
        }
    }

    fn message(r: Result<Manifest, Failure>) -> String {
        match r {
            Err(Failure::Runtime(e)) => e.to_string(),
            Err(Failure::Config(m)) => m,
            Ok(m) => panic!("accepted: {m:?}"),
        }
    }

    #[test]
    fn a_keyed_manifest_round_trips_and_any_change_is_refused() {
        let kek = Kek::from_bytes([7; 32], "k");
        let text = sample().render(&kek);
        let back = check(&text, &kek).unwrap();
        assert_eq!(back.files, sample().files);
        assert_eq!(back.omitted, sample().omitted);
        // A digest rewritten (as whoever changed the file would).
        let changed = text.replace(&"ab".repeat(32), &"cd".repeat(32));
        assert!(message(check(&changed, &kek)).contains("changed after it was made"));
        // Secrets said to be included, a size, an omitted line dropped: all covered.
        for changed in [
            text.replace("secrets omitted", "secrets included"),
            text.replace(" 4096 ", " 4097 "),
            text.replace("omitted key-encryption-key\n", ""),
        ] {
            assert!(check(&changed, &kek).is_err(), "{changed}");
        }
        // Another KEK: named as such.
        let other = Kek::from_bytes([8; 32], "other");
        assert!(message(check(&text, &other)).contains("another key-encryption key"));
        // Paths leaving the backup are refused before any MAC.
        let escaping = text.replace(" plexsphere.db", " ../x");
        assert!(message(check(&escaping, &kek)).contains("plain relative path"));
    }
}
