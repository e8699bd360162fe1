//! The host fingerprint a node sends with every authenticated request, so the control plane
//! notices one credential used from two hosts (a state directory copied into a golden image).
//!
//! plexd derives it from the host's machine id keyed by its node id (see plexd's
//! `identity::host`): 32 bytes, sent as 64 lowercase hex characters in the [`HOST_HEADER`]
//! header. The raw machine id never leaves the host, and one host enrolled twice has two
//! unrelated fingerprints.

/// The header that carries the fingerprint (`Plexd-Host: <64 hex>`).
pub const HOST_HEADER: &str = "plexd-host";

/// The length of a fingerprint in bytes (an HMAC-SHA256 output).
pub const FINGERPRINT_LEN: usize = 32;

/// One host's fingerprint for one node.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostFingerprint([u8; FINGERPRINT_LEN]);

/// A header value that is not 64 lowercase hex characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the {HOST_HEADER} header must be {} lowercase hex characters",
    FINGERPRINT_LEN * 2
)]
pub struct BadFingerprint;

impl HostFingerprint {
    pub fn from_bytes(bytes: [u8; FINGERPRINT_LEN]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; FINGERPRINT_LEN] {
        &self.0
    }

    /// Parses the header's text: exactly 64 lowercase hex characters.
    pub fn parse(text: &str) -> Result<Self, BadFingerprint> {
        let raw = text.as_bytes();
        if raw.len() != FINGERPRINT_LEN * 2 {
            return Err(BadFingerprint);
        }
        let mut out = [0u8; FINGERPRINT_LEN];
        for (byte, pair) in out.iter_mut().zip(raw.chunks_exact(2)) {
            *byte = (nibble(pair[0])? << 4) | nibble(pair[1])?;
        }
        Ok(Self(out))
    }

    /// The header's text.
    pub fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(FINGERPRINT_LEN * 2);
        for b in self.0 {
            s.push(char::from(DIGITS[usize::from(b >> 4)]));
            s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
        }
        s
    }
}

fn nibble(c: u8) -> Result<u8, BadFingerprint> {
    match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        _ => Err(BadFingerprint),
    }
}

impl std::fmt::Display for HostFingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl std::fmt::Debug for HostFingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostFingerprint({})", self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_only_lowercase_hex_of_the_right_length_parses() {
        let mut bytes = [0u8; FINGERPRINT_LEN];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::try_from(i * 9 % 256).unwrap();
        }
        let fp = HostFingerprint::from_bytes(bytes);
        let hex = fp.to_hex();
        assert_eq!(hex.len(), 64);
        assert!(hex.starts_with("0009121b"), "{hex}");
        assert_eq!(HostFingerprint::parse(&hex), Ok(fp));
        assert_eq!(HostFingerprint::parse(&hex[..62]), Err(BadFingerprint));
        assert_eq!(
            HostFingerprint::parse(&format!("{hex}00")),
            Err(BadFingerprint)
        );
        assert_eq!(
            HostFingerprint::parse(&hex.to_uppercase()),
            Err(BadFingerprint)
        );
        assert_eq!(HostFingerprint::parse(&"g".repeat(64)), Err(BadFingerprint));
        assert_eq!(HostFingerprint::parse(""), Err(BadFingerprint));
    }
}
