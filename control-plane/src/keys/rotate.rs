//! Domain signing-key rotation: the next generation, its transition statement, and telling
//! the Domain's nodes twice, when it is announced and when it starts to sign.
//!
//! A rotation is one transaction: the new generation (a fresh seed sealed under the KEK,
//! `active_from = now + overlap`) with the [`KeyTransition`] the current key signs for it,
//! inserted if absent on `(domain_id, generation)`, and a Domain-wide `resync` event. The
//! event moves the Domain's state version, so every node pulls (its stream wakes it within
//! seconds) the state that announces the next key. Two replicas rotating at once make one
//! generation; the other answers [`KeyError::RotationRaced`]. While an overlap lasts a further
//! rotation is refused ([`KeyError::RotationUnderWay`]): each key is vouched for by a key that
//! has signed, so the chain never skips one.
//!
//! When `active_from` passes, the state documents are signed by the new key (the clock decides
//! it, `KeySet::current`), but their version would not move and a node asking with its ETag
//! would keep the document it has. [`announce_due`] therefore appends one more `resync` per
//! new generation, marked in the row (`activated_at`) by a conditional update so that of
//! several replicas one alone does it. The rotating replica runs it at `active_from`, the
//! maintenance task on the leader every round (in case that replica is gone by then).

use plexsphere_wire::node::EventKind;
use plexsphere_wire::signing_keys::{KeyTransition, SigningKey};
use uuid::Uuid;

use super::{DomainKey, KeyError, Keyring, random_seed, sealed_row, unix_now, unseal};
use crate::bus::EventBus;
use crate::store::domains::{self, Domain};
use crate::store::{self, Store, StoreError, domain_keys, events};

/// The reason every node's stream gives for the pull that brings the announcement.
pub const ANNOUNCED_RESYNC: &str =
    "the Domain's signing key is being rotated: the next key is announced";
/// The reason every node's stream gives for the pull once the new key signs.
pub const ACTIVE_RESYNC: &str = "the Domain's next signing key signs from now on";

/// The subject of the Domain-wide events a rotation appends: no node has this id, so every
/// node of the Domain receives them (events go to every node but their subject).
const NO_NODE: Uuid = Uuid::nil();

/// What a rotation made.
pub struct Rotated {
    /// The new generation.
    pub key: DomainKey,
    pub created_at: i64,
    /// The seq of the `resync` that announces it (tell the bus).
    pub seq: u64,
}

fn retryable(e: &KeyError) -> bool {
    matches!(e, KeyError::Store(s) if s.is_busy())
}

impl Keyring {
    /// Adds the Domain's next generation, which signs `overlap_secs` from now; see the module
    /// comment. The caller tells the bus of [`Rotated::seq`].
    pub async fn rotate(&self, domain: &Domain, overlap_secs: u64) -> Result<Rotated, KeyError> {
        // The Domain's first key exists before it is rotated (made or imported as usual).
        self.keys(domain).await?;
        let kek = self.kek()?;
        let overlap = i64::try_from(overlap_secs).unwrap_or(i64::MAX);
        let kek = &kek;
        let done = store::retry("rotate a Domain key", retryable, || async move {
            let now = unix_now();
            let mut tx = self.store.begin().await?;
            let rows = domain_keys::list(&mut tx, domain.id).await?;
            let newest = rows.last().ok_or_else(|| KeyError::NoKey {
                slug: domain.slug.clone(),
                path: super::seed_path(&self.data_dir, &domain.slug),
            })?;
            if newest.active_from > now {
                return Err(KeyError::RotationUnderWay {
                    slug: domain.slug.clone(),
                    generation: newest.generation,
                    active_from: newest.active_from,
                });
            }
            let previous = unseal(kek, domain, newest)?;
            let generation = newest.generation + 1;
            let active_from = now.saturating_add(overlap);
            let mut row = sealed_row(kek, domain, generation, &random_seed()?, active_from, now)?;
            let statement = KeyTransition::sign(
                &previous.signer,
                domain.id,
                SigningKey {
                    generation: u64::try_from(generation).unwrap_or(0),
                    public_key: row.public_key.clone(),
                    active_from,
                },
            );
            row.transition = Some(
                serde_json::to_string(&statement)
                    .map_err(|e| StoreError::corrupt("domain_keys.transition (serializing)", e))?,
            );
            if !domain_keys::insert_if_absent(&mut tx, &row).await? {
                return Err(KeyError::RotationRaced {
                    slug: domain.slug.clone(),
                    generation,
                });
            }
            let resync = EventKind::Resync {
                reason: ANNOUNCED_RESYNC.to_owned(),
            };
            let seq = events::append(&mut tx, domain.id, None, NO_NODE, &resync, now).await?;
            tx.commit().await.map_err(StoreError::from)?;
            Ok((row, seq))
        })
        .await?;
        let (row, seq) = done;
        // This replica signs with what it just stored at once; the others read it within
        // KEY_REFRESH.
        self.forget(domain.id);
        let key = unseal(kek, domain, &row)?;
        tracing::info!(
            domain = %domain.slug, generation = row.generation, public_key = %row.public_key,
            active_from = row.active_from, seq,
            "Domain signing key rotated: the next key is announced and signs from active_from"
        );
        Ok(Rotated {
            key,
            created_at: row.created_at,
            seq,
        })
    }
}

/// Tells the nodes of every Domain whose new generation started to sign and was not announced
/// as active yet: one `resync` each, once across all replicas. Answers how many it announced.
pub(crate) async fn announce_due(store: &Store, bus: &dyn EventBus) -> Result<usize, StoreError> {
    let now = unix_now();
    let due = {
        let mut conn = store.acquire().await?;
        domain_keys::due_activation(&mut conn, now).await?
    };
    let mut announced = 0;
    for (domain_id, generation) in due {
        let seq = store::retry("announce a Domain key", StoreError::is_busy, || {
            announce_attempt(store, domain_id, generation, now)
        })
        .await?;
        if let Some(seq) = seq {
            tracing::info!(%domain_id, generation, seq, "the Domain's new signing key signs now; its nodes pull their state");
            bus.notify(domain_id, seq);
            announced += 1;
        }
    }
    Ok(announced)
}

async fn announce_attempt(
    store: &Store,
    domain_id: Uuid,
    generation: i64,
    now: i64,
) -> Result<Option<u64>, StoreError> {
    let mut tx = store.begin().await?;
    if domains::get(&mut tx, domain_id).await?.is_none()
        || !domain_keys::mark_activated(&mut tx, domain_id, generation, now).await?
    {
        return Ok(None);
    }
    let resync = EventKind::Resync {
        reason: ACTIVE_RESYNC.to_owned(),
    };
    let seq = events::append(&mut tx, domain_id, None, NO_NODE, &resync, now).await?;
    tx.commit().await?;
    Ok(Some(seq))
}
