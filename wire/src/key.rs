//! A Curve25519 (WireGuard) public key: the one type the agent, the data plane and the wire
//! codecs share. Public, so it may be logged: `Display` is the base64 form `wg` prints.
//! Private and preshared keys are not here; they stay secrets of the data plane
//! (`plexd_dataplane::SecretKey`).

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// Why a key's text was refused (or a key could not be made). The message never echoes the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("a key must be 64 hexadecimal characters (UAPI form)")]
    Hex,
    #[error("a key must be 44 characters of base64 (wg form)")]
    Base64,
    #[error("the system random generator failed")]
    Random,
}

/// 32 bytes from 64 hexadecimal characters (WireGuard's UAPI form).
pub fn decode_hex(s: &str) -> Result<[u8; 32], KeyError> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out).map_err(|_| KeyError::Hex)?;
    Ok(out)
}

/// 32 bytes from standard base64 (what `wg` prints), surrounding white space ignored.
pub fn decode_base64(s: &str) -> Result<[u8; 32], KeyError> {
    let bytes = STANDARD.decode(s.trim()).map_err(|_| KeyError::Base64)?;
    bytes.try_into().map_err(|_| KeyError::Base64)
}

/// A node's or a peer's WireGuard public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey(pub [u8; 32]);

impl PublicKey {
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        decode_base64(text).map(Self)
    }

    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }

    pub fn from_hex(text: &str) -> Result<Self, KeyError> {
        decode_hex(text).map(Self)
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_text_forms_round_trip_and_bad_text_is_refused_without_echo() {
        let k = PublicKey([7; 32]);
        assert_eq!(PublicKey::from_base64(&k.to_base64()), Ok(k));
        assert_eq!(PublicKey::from_base64(&format!(" {k}\n")), Ok(k));
        assert_eq!(PublicKey::from_hex(&k.to_hex()), Ok(k));
        assert_eq!(format!("{k:?}"), format!("PublicKey({k})"));
        assert_eq!(PublicKey::from_base64("AAAA"), Err(KeyError::Base64));
        assert_eq!(PublicKey::from_hex("zz"), Err(KeyError::Hex));
        let wrong = "not a key at all";
        let message = PublicKey::from_base64(wrong).unwrap_err().to_string();
        assert!(!message.contains(wrong), "{message}");
    }
}
