//! Sealing a Domain key's seed under the KEK: ChaCha20-Poly1305 with a fresh random nonce per
//! seal, and the Domain id, the key's generation and its public key as associated data, so a
//! sealed seed copied onto another Domain's row or another generation does not open.
//!
//! The stored text is `v1:` followed by the base64 of `nonce (12 bytes) || ciphertext || tag`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom as _, SystemRandom};
use uuid::Uuid;

use super::kek::Kek;

const PREFIX: &str = "v1:";

/// Which key a sealed seed belongs to: bound into the seal as associated data.
#[derive(Debug, Clone, Copy)]
pub struct KeyId<'a> {
    pub domain_id: Uuid,
    pub generation: i64,
    pub public_key: &'a str,
}

impl KeyId<'_> {
    fn aad(&self) -> Vec<u8> {
        format!(
            "plexsphere domain key v1\0{}\0{}\0{}",
            self.domain_id, self.generation, self.public_key
        )
        .into_bytes()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error(
        "the sealed Domain key (Domain {domain_id}, generation {generation}) is not in the `v1:` form; the database row is damaged: restore it from a backup"
    )]
    Malformed { domain_id: Uuid, generation: i64 },
    #[error(
        "this KEK ({origin}) did not seal the Domain key of Domain {domain_id} (generation {generation}), or the sealed key was altered; give this replica the KEK the other replicas use"
    )]
    WrongKek {
        origin: String,
        domain_id: Uuid,
        generation: i64,
    },
    #[error("the system random generator failed while sealing a Domain key")]
    Random,
}

fn key(kek: &Kek) -> LessSafeKey {
    // CHACHA20_POLY1305 takes exactly 32 bytes, what a KEK is.
    let unbound = UnboundKey::new(&CHACHA20_POLY1305, kek.bytes())
        .unwrap_or_else(|_| unreachable!("a KEK is 32 bytes, ChaCha20-Poly1305's key length"));
    LessSafeKey::new(unbound)
}

/// Seals `seed` for `id` under `kek`.
pub(crate) fn seal(kek: &Kek, id: KeyId<'_>, seed: &[u8; 32]) -> Result<String, SealError> {
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| SealError::Random)?;
    let mut buf = seed.to_vec();
    key(kek)
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(id.aad()),
            &mut buf,
        )
        .map_err(|_| SealError::Random)?;
    let mut out = nonce.to_vec();
    out.extend_from_slice(&buf);
    Ok(format!("{PREFIX}{}", STANDARD.encode(out)))
}

/// Opens what [`seal`] made for the same `id` under the same `kek`.
pub(crate) fn open(kek: &Kek, id: KeyId<'_>, sealed: &str) -> Result<[u8; 32], SealError> {
    let malformed = || SealError::Malformed {
        domain_id: id.domain_id,
        generation: id.generation,
    };
    let bytes = sealed
        .strip_prefix(PREFIX)
        .and_then(|b| STANDARD.decode(b).ok())
        .ok_or_else(malformed)?;
    if bytes.len() < NONCE_LEN {
        return Err(malformed());
    }
    let (nonce, rest) = bytes.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| malformed())?;
    let mut buf = rest.to_vec();
    let plain = key(kek)
        .open_in_place(nonce, Aad::from(id.aad()), &mut buf)
        .map_err(|_| SealError::WrongKek {
            origin: kek.origin().to_owned(),
            domain_id: id.domain_id,
            generation: id.generation,
        })?;
    <[u8; 32]>::try_from(&*plain).map_err(|_| malformed())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(domain: u128) -> KeyId<'static> {
        KeyId {
            domain_id: Uuid::from_u128(domain),
            generation: 1,
            public_key: "pk",
        }
    }

    #[test]
    fn seals_and_opens_with_a_fresh_nonce_each_time() {
        let kek = Kek::from_bytes([7; 32], "test");
        let a = seal(&kek, id(1), &[9; 32]).unwrap();
        let b = seal(&kek, id(1), &[9; 32]).unwrap();
        assert_ne!(a, b, "a fresh nonce per seal");
        assert_eq!(open(&kek, id(1), &a).unwrap(), [9; 32]);
        assert_eq!(open(&kek, id(1), &b).unwrap(), [9; 32]);
    }

    #[test]
    fn the_wrong_kek_says_so() {
        let sealed = seal(&Kek::from_bytes([7; 32], "a"), id(1), &[9; 32]).unwrap();
        let err = open(&Kek::from_bytes([8; 32], "/etc/other"), id(1), &sealed).unwrap_err();
        assert!(matches!(err, SealError::WrongKek { .. }));
        assert!(
            err.to_string()
                .contains("this KEK (/etc/other) did not seal the Domain key"),
            "{err}"
        );
    }

    #[test]
    fn tampered_ciphertext_does_not_open() {
        let kek = Kek::from_bytes([7; 32], "a");
        let sealed = seal(&kek, id(1), &[9; 32]).unwrap();
        let mut bytes = STANDARD
            .decode(sealed.strip_prefix(PREFIX).unwrap())
            .unwrap();
        bytes[NONCE_LEN + 3] ^= 1;
        let tampered = format!("{PREFIX}{}", STANDARD.encode(&bytes));
        assert!(matches!(
            open(&kek, id(1), &tampered),
            Err(SealError::WrongKek { .. })
        ));
        assert!(matches!(
            open(&kek, id(1), "v1:AAAA"),
            Err(SealError::Malformed { .. })
        ));
        assert!(matches!(
            open(&kek, id(1), "plain"),
            Err(SealError::Malformed { .. })
        ));
    }

    #[test]
    fn another_domain_generation_or_public_key_does_not_open() {
        let kek = Kek::from_bytes([7; 32], "a");
        let sealed = seal(&kek, id(1), &[9; 32]).unwrap();
        assert!(open(&kek, id(2), &sealed).is_err());
        let other_generation = KeyId {
            generation: 2,
            ..id(1)
        };
        assert!(open(&kek, other_generation, &sealed).is_err());
        let other_key = KeyId {
            public_key: "other",
            ..id(1)
        };
        assert!(open(&kek, other_key, &sealed).is_err());
    }
}
