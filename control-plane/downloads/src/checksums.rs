//! `checksums.sha256`: the lines `sha256sum -c` reads, rendered and parsed.
//!
//! What we serve is always our own rendering (`<64 hex>  plexd-linux-<arch>\n` per platform, in
//! [`Platform::ALL`] order), never an upstream file passed through, so its bytes (and therefore
//! its signature) depend only on the digests.

use std::collections::BTreeMap;

use crate::platform::Platform;

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// The digests of a release, one per platform it has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checksums(BTreeMap<Platform, Digest>);

/// A checksum list that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChecksumsError {
    #[error("line {line} is not `<64 hex digits>  <file name>` (the sha256sum format): {text:?}")]
    Malformed { line: usize, text: String },
    #[error("{file} is listed twice with different digests (lines {first} and {second})")]
    Conflict {
        file: &'static str,
        first: usize,
        second: usize,
    },
    #[error("it lists none of plexd-linux-amd64 and plexd-linux-arm64")]
    NoPlatform,
}

impl Checksums {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, platform: Platform, digest: Digest) {
        self.0.insert(platform, digest);
    }

    pub fn get(&self, platform: Platform) -> Option<&Digest> {
        self.0.get(&platform)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The platforms listed, in [`Platform::ALL`] order.
    pub fn platforms(&self) -> impl Iterator<Item = Platform> + '_ {
        self.0.keys().copied()
    }

    /// The file `sha256sum -c` checks: `<hex>  plexd-linux-<arch>` per line, two spaces.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (platform, digest) in &self.0 {
            out.push_str(&hex::encode(digest));
            out.push_str("  ");
            out.push_str(platform.file_name());
            out.push('\n');
        }
        out
    }

    /// Reads a sha256sum-style list. Lines for files other than plexd's platforms (a release
    /// may list packages, signatures, other operating systems) are skipped; blank lines and
    /// `#` comments too. The `*` binary-mode marker and a leading `./` are accepted.
    pub fn parse(text: &str) -> Result<Self, ChecksumsError> {
        let mut out = Checksums::new();
        let mut seen: BTreeMap<Platform, usize> = BTreeMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let malformed = || ChecksumsError::Malformed {
                line,
                text: raw.chars().take(120).collect(),
            };
            let (hex_part, rest) = trimmed
                .split_once(char::is_whitespace)
                .ok_or_else(malformed)?;
            let digest = parse_digest(hex_part).ok_or_else(malformed)?;
            let name = rest.trim_start();
            let name = name.strip_prefix('*').unwrap_or(name);
            let name = name.strip_prefix("./").unwrap_or(name);
            if name.is_empty() {
                return Err(malformed());
            }
            let Some(platform) = Platform::from_file_name(name) else {
                continue;
            };
            if let Some(&first) = seen.get(&platform) {
                if out.get(platform) != Some(&digest) {
                    return Err(ChecksumsError::Conflict {
                        file: platform.file_name(),
                        first,
                        second: line,
                    });
                }
                continue;
            }
            seen.insert(platform, line);
            out.insert(platform, digest);
        }
        if out.is_empty() {
            return Err(ChecksumsError::NoPlatform);
        }
        Ok(out)
    }
}

/// 64 hex digits (either case) as a digest.
pub fn parse_digest(text: &str) -> Option<Digest> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

/// The SHA-256 of some bytes.
pub fn sha256(bytes: &[u8]) -> Digest {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    const B: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

    #[test]
    fn renders_sha256sum_lines_in_platform_order() {
        let mut c = Checksums::new();
        c.insert(Platform::LinuxArm64, parse_digest(B).unwrap());
        c.insert(Platform::LinuxAmd64, parse_digest(A).unwrap());
        assert_eq!(
            c.render(),
            format!("{A}  plexd-linux-amd64\n{B}  plexd-linux-arm64\n")
        );
        assert_eq!(Checksums::parse(&c.render()).unwrap(), c);
    }

    #[test]
    fn parses_what_release_tools_write() {
        let text = format!(
            "# plexd 1.2.3\n\n{}  plexd-linux-amd64\n{B} *./plexd-linux-arm64\n{A}  plexd_1.2.3_amd64.deb\n{A}  plexd-linux-amd64\n",
            A.to_uppercase()
        );
        let c = Checksums::parse(&text).unwrap();
        assert_eq!(c.get(Platform::LinuxAmd64), Some(&parse_digest(A).unwrap()));
        assert_eq!(c.get(Platform::LinuxArm64), Some(&parse_digest(B).unwrap()));
        assert_eq!(c.platforms().count(), 2);
    }

    #[test]
    fn refuses_bad_lists() {
        assert_eq!(
            Checksums::parse(&format!("{A}  plexd-linux-amd64\nnot a line\n")),
            Err(ChecksumsError::Malformed {
                line: 2,
                text: "not a line".into()
            })
        );
        assert!(matches!(
            Checksums::parse(&format!("{}  plexd-linux-amd64\n", &A[..63])),
            Err(ChecksumsError::Malformed { line: 1, .. })
        ));
        assert!(matches!(
            Checksums::parse(&format!("{A}\n")),
            Err(ChecksumsError::Malformed { line: 1, .. })
        ));
        assert_eq!(
            Checksums::parse(&format!("{A}  plexd-linux-amd64\n{B}  plexd-linux-amd64\n")),
            Err(ChecksumsError::Conflict {
                file: "plexd-linux-amd64",
                first: 1,
                second: 2
            })
        );
        assert_eq!(
            Checksums::parse(&format!("{A}  plexd-darwin-arm64\n")),
            Err(ChecksumsError::NoPlatform)
        );
        assert_eq!(Checksums::parse(""), Err(ChecksumsError::NoPlatform));
    }

    #[test]
    fn sha256_of_known_input() {
        assert_eq!(hex::encode(sha256(b"")), A);
        assert_eq!(hex::encode(sha256(b"hello")), B);
    }
}
