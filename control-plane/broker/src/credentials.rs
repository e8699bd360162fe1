//! Cloud credentials sealed at rest with ChaCha20-Poly1305 (ring).
//!
//! The server keeps one 32-byte key in a 0600 file and stores only sealed payloads. A sealed
//! blob is `version (1 byte, 0x01) || nonce (12 random bytes) || ciphertext || tag (16 bytes)`.
//! The associated data binds the blob to its credential id, so a blob copied onto another
//! credential's row does not open. The plaintext never shows in `Debug` or `Display`.

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use uuid::Uuid;

/// The length of a sealing key.
pub const KEY_LEN: usize = 32;
const VERSION: u8 = 1;
const TAG_LEN: usize = 16;
const AAD_CONTEXT: &[u8] = b"plexsphere cloud credential v1\0";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("the credential key must be exactly {KEY_LEN} bytes, not {0}; generate a new key file")]
    KeyLength(usize),
    #[error("the system random generator failed")]
    Random,
    #[error(
        "the sealed credential {0} is truncated or of an unknown format; re-create the credential"
    )]
    Malformed(Uuid),
    #[error(
        "the sealed credential {0} does not open with this key (a different key file, or a blob moved from another credential); re-create the credential or restore the key file"
    )]
    Open(Uuid),
}

/// The key payloads are sealed with. `Debug` never shows it.
pub struct CredentialKey(LessSafeKey);

impl CredentialKey {
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CredentialError> {
        if bytes.len() != KEY_LEN {
            return Err(CredentialError::KeyLength(bytes.len()));
        }
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, bytes)
            .map_err(|_| CredentialError::KeyLength(bytes.len()))?;
        Ok(Self(LessSafeKey::new(unbound)))
    }

    /// Fresh random key bytes, for the server to write to its 0600 key file.
    pub fn generate_bytes() -> Result<[u8; KEY_LEN], CredentialError> {
        let mut k = [0u8; KEY_LEN];
        SystemRandom::new()
            .fill(&mut k)
            .map_err(|_| CredentialError::Random)?;
        Ok(k)
    }
}

impl std::fmt::Debug for CredentialKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialKey(<redacted>)")
    }
}

/// An opened credential payload. `Debug` shows only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct CredentialPayload(Vec<u8>);

impl CredentialPayload {
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for CredentialPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CredentialPayload(<{} bytes redacted>)", self.0.len())
    }
}

fn aad(id: Uuid) -> Vec<u8> {
    let mut a = AAD_CONTEXT.to_vec();
    a.extend_from_slice(id.as_bytes());
    a
}

/// Seals `payload` for the credential `id` under a fresh random nonce.
pub fn seal(
    key: &CredentialKey,
    id: Uuid,
    payload: &CredentialPayload,
) -> Result<Vec<u8>, CredentialError> {
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| CredentialError::Random)?;
    let mut in_out = payload.0.clone();
    key.0
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad(id)),
            &mut in_out,
        )
        .map_err(|_| CredentialError::Random)?;
    let mut blob = Vec::with_capacity(1 + NONCE_LEN + in_out.len());
    blob.push(VERSION);
    blob.extend_from_slice(&nonce);
    blob.extend_from_slice(&in_out);
    Ok(blob)
}

/// Opens a blob sealed for the credential `id`.
pub fn open(
    key: &CredentialKey,
    id: Uuid,
    blob: &[u8],
) -> Result<CredentialPayload, CredentialError> {
    if blob.len() < 1 + NONCE_LEN + TAG_LEN || blob[0] != VERSION {
        return Err(CredentialError::Malformed(id));
    }
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&blob[1..1 + NONCE_LEN]);
    let mut in_out = blob[1 + NONCE_LEN..].to_vec();
    let plain = key
        .0
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad(id)),
            &mut in_out,
        )
        .map_err(|_| CredentialError::Open(id))?;
    Ok(CredentialPayload(plain.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> CredentialKey {
        CredentialKey::from_bytes(&[b; KEY_LEN]).unwrap()
    }

    fn payload() -> CredentialPayload {
        CredentialPayload::new(br#"{"auth_url":"https://keystone.example:5000/v3","application_credential_secret":"s3cr3t"}"#.to_vec())
    }

    #[test]
    fn round_trip_with_a_fresh_nonce_each_time() {
        let k = CredentialKey::from_bytes(&CredentialKey::generate_bytes().unwrap()).unwrap();
        let id = Uuid::now_v7();
        let a = seal(&k, id, &payload()).unwrap();
        let b = seal(&k, id, &payload()).unwrap();
        assert_ne!(a, b, "the nonce must differ between seals");
        assert_eq!(a.len(), 1 + NONCE_LEN + payload().expose().len() + TAG_LEN);
        assert_eq!(open(&k, id, &a).unwrap(), payload());
        assert_eq!(open(&k, id, &b).unwrap(), payload());
        // The plaintext is not in the blob.
        assert!(!a.windows(6).any(|w| w == b"s3cr3t"));
    }

    #[test]
    fn a_wrong_key_does_not_open() {
        let id = Uuid::now_v7();
        let blob = seal(&key(1), id, &payload()).unwrap();
        assert_eq!(open(&key(2), id, &blob), Err(CredentialError::Open(id)));
    }

    #[test]
    fn a_blob_moved_to_another_id_does_not_open() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let blob = seal(&key(1), a, &payload()).unwrap();
        let e = open(&key(1), b, &blob).unwrap_err();
        assert_eq!(e, CredentialError::Open(b));
        assert!(
            e.to_string().contains("moved from another credential"),
            "{e}"
        );
    }

    #[test]
    fn truncated_flipped_or_unknown_blobs_are_refused() {
        let id = Uuid::now_v7();
        let blob = seal(&key(1), id, &payload()).unwrap();
        assert_eq!(
            open(&key(1), id, &blob[..20]),
            Err(CredentialError::Malformed(id))
        );
        assert_eq!(open(&key(1), id, &[]), Err(CredentialError::Malformed(id)));
        // One byte short: long enough to parse, but the tag no longer checks.
        assert_eq!(
            open(&key(1), id, &blob[..blob.len() - 1]),
            Err(CredentialError::Open(id))
        );
        let mut flipped = blob.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(open(&key(1), id, &flipped), Err(CredentialError::Open(id)));
        let mut v2 = blob;
        v2[0] = 2;
        assert_eq!(open(&key(1), id, &v2), Err(CredentialError::Malformed(id)));
    }

    #[test]
    fn keys_and_payloads_never_show_in_debug() {
        assert_eq!(
            CredentialKey::from_bytes(&[7; 31]).unwrap_err(),
            CredentialError::KeyLength(31)
        );
        assert_eq!(format!("{:?}", key(1)), "CredentialKey(<redacted>)");
        let dbg = format!("{:?}", payload());
        assert!(!dbg.contains("s3cr3t") && dbg.contains("redacted"), "{dbg}");
    }
}
