//! `plexsphere kek rotate`: every stored Domain key opened with the old KEK and sealed again
//! under the new one, in the caller's transaction (the command seals the cloud credentials
//! again in the same one, so a failure or a crash leaves both under the old KEK).
//!
//! Every row must open (with the old KEK, or already with the new one) and match its public
//! key before anything is written, so a wrong old KEK changes nothing. A row that already opens
//! with the new KEK is left as it is, so running the command again says there is nothing to do.
//! Each row is replaced only if it still holds what was read (a key written meanwhile by a
//! replica fails the whole transaction instead of being lost).

use std::collections::HashMap;

use plexsphere_wire::signed::DomainSigner;
use sqlx::AnyConnection;

use super::{Kek, KeyError, open_seed, seal};
use crate::store::domains::{self, Domain};
use crate::store::{StoreError, domain_keys};

/// What a KEK rotation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resealed {
    /// Keys sealed again under the new KEK.
    pub resealed: usize,
    /// Keys the new KEK opened already (left as they are).
    pub already: usize,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ResealError {
    #[error(
        "the Domain key of {slug} (generation {generation}) opens with neither the old key-encryption key ({old}) nor the new one ({new}): {source}; nothing was changed. Give --old-key-encryption-key-file the KEK the replicas use now"
    )]
    Opens {
        slug: String,
        generation: i64,
        old: String,
        new: String,
        source: KeyError,
    },
    #[error(
        "the Domain key of {slug} (generation {generation}) changed while it was sealed again (a replica wrote it); nothing was changed. Stop the replicas (or keep them from rotating keys) and run the command again"
    )]
    Changed { slug: String, generation: i64 },
    #[error(
        "the old and the new key-encryption key are the same key; make a new one with `plexsphere kek generate --out <file>`"
    )]
    SameKek,
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Seals every Domain key under `new` in the transaction `tx`, opening it with `old`; see the
/// module comment. The caller commits.
pub(crate) async fn reseal_in(
    tx: &mut AnyConnection,
    old: &Kek,
    new: &Kek,
) -> Result<Resealed, ResealError> {
    if old.bytes() == new.bytes() {
        return Err(ResealError::SameKek);
    }
    let by_id: HashMap<_, Domain> = domains::list(tx)
        .await?
        .into_iter()
        .map(|d| (d.id, d))
        .collect();
    let rows = domain_keys::list_all(tx).await?;
    let mut work = Vec::new();
    let mut already = 0;
    for row in &rows {
        let domain = by_id.get(&row.domain_id).ok_or_else(|| {
            StoreError::corrupt("domain_keys.domain_id (no such Domain)", row.domain_id)
        })?;
        if opened(new, domain, row).is_ok() {
            already += 1;
            continue;
        }
        let seed = opened(old, domain, row).map_err(|source| ResealError::Opens {
            slug: domain.slug.clone(),
            generation: row.generation,
            old: old.origin().to_owned(),
            new: new.origin().to_owned(),
            source,
        })?;
        let id = seal::KeyId {
            domain_id: domain.id,
            generation: row.generation,
            public_key: &row.public_key,
        };
        work.push((
            row,
            domain,
            seal::seal(new, id, &seed).map_err(KeyError::from)?,
        ));
    }
    for (row, domain, sealed) in &work {
        if !domain_keys::reseal(tx, row, sealed).await? {
            return Err(ResealError::Changed {
                slug: domain.slug.clone(),
                generation: row.generation,
            });
        }
    }
    Ok(Resealed {
        resealed: work.len(),
        already,
    })
}

/// The seed of `row` opened with `kek`, checked against the row's public key.
fn opened(kek: &Kek, domain: &Domain, row: &domain_keys::StoredKey) -> Result<[u8; 32], KeyError> {
    let seed = open_seed(kek, domain, row)?;
    let matches =
        DomainSigner::from_seed(&seed).is_ok_and(|s| s.public_key_b64() == row.public_key);
    if !matches {
        return Err(KeyError::Mismatch {
            slug: domain.slug.clone(),
            generation: row.generation,
        });
    }
    Ok(seed)
}
