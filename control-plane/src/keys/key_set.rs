//! What the keyring answers: one unsealed key of a Domain ([`DomainKey`]), a Domain's keys at
//! one moment with the one that signs and the one announced ([`KeySet`]), and why the keyring
//! could not answer ([`KeyError`]).

use std::path::PathBuf;
use std::sync::Arc;

use plexsphere_wire::signed::DomainSigner;
use plexsphere_wire::signing_keys::SigningKey;

use crate::keys::kek::KekError;
use crate::keys::seal::SealError;
use crate::keys::seed_file::SeedFileError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(transparent)]
    Kek(#[from] KekError),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error(transparent)]
    SeedFile(#[from] SeedFileError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "the Domain {slug} has nodes but no signing key: none in the database and no seed file {}; its nodes trust only that key, so no new one is made; restore the database (or that seed file) from a backup",
        path.display()
    )]
    NoKey { slug: String, path: PathBuf },
    #[error(
        "the sealed key of Domain {slug} (generation {generation}) opens to a key other than its stored public key; the database row is damaged: restore it from a backup"
    )]
    Mismatch { slug: String, generation: i64 },
    #[error("the system random generator failed while making a Domain key")]
    Random,
    #[error(
        "the Domain {slug} is in the overlap of a rotation: its generation {generation} signs from {active_from} (unix seconds); rotate again once it signs (`plexctl domain signing-keys {slug}` shows it)"
    )]
    RotationUnderWay {
        slug: String,
        generation: i64,
        active_from: i64,
    },
    #[error(
        "another rotation of Domain {slug} made generation {generation} at the same moment; this one changed nothing (`plexctl domain signing-keys {slug}` shows the new key)"
    )]
    RotationRaced { slug: String, generation: i64 },
}

/// One unsealed key of a Domain.
#[derive(Clone)]
pub struct DomainKey {
    pub generation: i64,
    pub active_from: i64,
    pub signer: Arc<DomainSigner>,
}

impl DomainKey {
    /// The key as nodes learn it.
    pub(crate) fn wire(&self) -> SigningKey {
        SigningKey {
            generation: u64::try_from(self.generation).unwrap_or(0),
            public_key: self.signer.public_key_b64(),
            active_from: self.active_from,
        }
    }
}

/// A Domain's keys at one moment: which signs, which is announced next.
#[derive(Clone)]
pub struct KeySet {
    /// Oldest generation first; never empty.
    pub(super) keys: Vec<DomainKey>,
}

impl KeySet {
    /// The key that signs at `now`: the highest generation whose overlap has ended.
    pub fn current(&self, now: i64) -> &DomainKey {
        self.keys
            .iter()
            .rev()
            .find(|k| k.active_from <= now)
            .unwrap_or(&self.keys[0])
    }

    /// The key a rotation announced that signs after `now` (the one after the current key,
    /// while its overlap lasts); None outside an overlap.
    pub fn next(&self, now: i64) -> Option<&DomainKey> {
        let current = self.current(now).generation;
        self.keys
            .iter()
            .find(|k| k.generation > current && k.active_from > now)
    }

    /// Every key, oldest generation first.
    pub fn all(&self) -> &[DomainKey] {
        &self.keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(generation: i64, active_from: i64) -> DomainKey {
        let seed = [u8::try_from(generation).unwrap(); 32];
        DomainKey {
            generation,
            active_from,
            signer: Arc::new(DomainSigner::from_seed(&seed).unwrap()),
        }
    }

    #[test]
    fn the_newest_generation_whose_time_has_come_signs() {
        let set = KeySet {
            keys: vec![key(1, 0), key(2, 100)],
        };
        assert_eq!(set.current(99).generation, 1);
        assert_eq!(set.current(100).generation, 2);
        assert_eq!(set.current(5_000).generation, 2);
        // A clock before every key's start still signs with the first.
        let later = KeySet {
            keys: vec![key(1, 50)],
        };
        assert_eq!(later.current(0).generation, 1);
    }

    #[test]
    fn the_next_key_is_announced_only_while_its_overlap_lasts() {
        let set = KeySet {
            keys: vec![key(1, 0), key(2, 100)],
        };
        assert_eq!(set.next(99).map(|k| k.generation), Some(2));
        assert!(set.next(100).is_none());
        let settled = KeySet {
            keys: vec![key(1, 0)],
        };
        assert!(settled.next(5).is_none());
    }
}
