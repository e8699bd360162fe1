//! Each Domain's Ed25519 signing keys, kept in the database (`domain_keys`) sealed under the
//! key-encryption key (`kek.rs`, `seal.rs`), so every replica with the same KEK signs with the
//! same key and a replica never makes its own.
//!
//! When a Domain has no key in the database, [`Keyring`] takes, in this order: the seed file an
//! older version left in the data directory (imported, sealed); nothing, when the Domain has
//! nodes (they trust a key that is gone: [`KeyError::NoKey`], never a silent new key); else a
//! fresh key. Creation is insert-if-absent, and every replica then uses the row that won.
//!
//! A Domain's keys are numbered by generation; the one that signs is the highest generation
//! whose `active_from` has passed ([`KeySet::current`]). A rotation (`rotate.rs`) adds the
//! next generation with `active_from` at the end of an overlap, and the transition statement
//! the current key signs for it; until then it is announced ([`KeySet::next`]). A KEK rotation
//! (`reseal.rs`) seals every stored key again under a new KEK.
//!
//! This folder owns the keys and their sealing: it may import the store (the `domain_keys`
//! and `domains` rows) and the bus (a rotation tells the Domain's nodes); the node API, the
//! error type and the CLI import it.

pub(crate) mod kek;
mod key_set;
pub(crate) mod reseal;
pub mod rotate;
pub(crate) mod seal;
pub(crate) mod seed_file;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plexsphere_wire::signed::DomainSigner;
use plexsphere_wire::signing_keys::SigningKey;
use ring::rand::{SecureRandom as _, SystemRandom};
use uuid::Uuid;

use crate::store::Store;
use crate::store::domain_keys::{self, StoredKey};
use crate::store::domains::{self, Domain};

pub use kek::{Kek, KekError};
pub use key_set::{DomainKey, KeyError, KeySet};
pub use seal::{KeyId, SealError};
pub use seed_file::{SeedFileError, seed_path};

/// How long a replica uses the keys it read before it reads them again (a key another replica
/// stored is seen within this).
pub(crate) const KEY_REFRESH: Duration = Duration::from_secs(2);

enum KekSource {
    Given(Kek),
    /// `<data-dir>/key-encryption-key`, made on first need (dev, tests), then kept.
    DataDir(Mutex<Option<Kek>>),
}

struct Cached {
    set: KeySet,
    fetched: Instant,
}

/// The Domain keys of one replica: read from the store, unsealed with the KEK, cached for
/// [`KEY_REFRESH`].
pub struct Keyring {
    store: Store,
    data_dir: PathBuf,
    kek: KekSource,
    cache: Mutex<HashMap<Uuid, Cached>>,
}

impl Keyring {
    /// A keyring over `store` whose KEK is `kek`; `data_dir` is where older seed files are
    /// looked for to import.
    pub fn new(store: Store, kek: Kek, data_dir: &Path) -> Self {
        Self::with_source(store, KekSource::Given(kek), data_dir)
    }

    /// A keyring whose KEK is the data directory's own (`plexsphere dev`, the tests).
    pub fn with_data_dir_kek(store: Store, data_dir: &Path) -> Self {
        Self::with_source(store, KekSource::DataDir(Mutex::new(None)), data_dir)
    }

    fn with_source(store: Store, kek: KekSource, data_dir: &Path) -> Self {
        Self {
            store,
            data_dir: data_dir.to_owned(),
            kek,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn kek(&self) -> Result<Kek, KeyError> {
        match &self.kek {
            KekSource::Given(k) => Ok(k.clone()),
            KekSource::DataDir(kept) => {
                let mut kept = kept.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(k) = kept.as_ref() {
                    return Ok(k.clone());
                }
                let k = Kek::dev(&self.data_dir)?;
                *kept = Some(k.clone());
                Ok(k)
            }
        }
    }

    /// An HMAC key derived from this replica's KEK for one purpose ([`Kek::derive_hmac_key`]).
    pub(crate) fn derive_hmac_key(&self, label: &[u8]) -> Result<ring::hmac::Key, KeyError> {
        Ok(self.kek()?.derive_hmac_key(label))
    }

    /// 32 key bytes derived from this replica's KEK for one purpose ([`Kek::derive_key_bytes`]).
    pub(crate) fn derive_key_bytes(&self, label: &[u8]) -> Result<[u8; 32], KeyError> {
        Ok(self.kek()?.derive_key_bytes(label))
    }

    /// The key that signs the Domain's documents now.
    pub async fn signer(&self, domain: &Domain) -> Result<Arc<DomainSigner>, KeyError> {
        let set = self.keys(domain).await?;
        Ok(set.current(unix_now()).signer.clone())
    }

    /// The key that signs now and the one a rotation announced (None outside an overlap),
    /// decided at one instant, so a document never names as next the key that signs it.
    pub(crate) async fn signing(
        &self,
        domain: &Domain,
    ) -> Result<(Arc<DomainSigner>, Option<SigningKey>), KeyError> {
        let set = self.keys(domain).await?;
        let now = unix_now();
        Ok((
            set.current(now).signer.clone(),
            set.next(now).map(DomainKey::wire),
        ))
    }

    /// The Domain's keys (read again once older than [`KEY_REFRESH`]), its first key made or
    /// imported when it has none.
    ///
    /// Keys already read are read again only on a connection that is free at once: callers
    /// hold a connection (or a transaction) while they sign, and waiting for a second one
    /// could starve the pool. Until then the keys read before serve; which of them signs is
    /// decided by the clock (`active_from`), so the end of an overlap is kept even so.
    pub async fn keys(&self, domain: &Domain) -> Result<KeySet, KeyError> {
        let cached = self
            .lock()
            .get(&domain.id)
            .map(|c| (c.set.clone(), c.fetched.elapsed() < KEY_REFRESH));
        let set = match cached {
            Some((set, true)) => return Ok(set),
            Some((set, false)) => {
                let Some(mut conn) = self.store.pool().try_acquire() else {
                    return Ok(set);
                };
                match self.read(&mut conn, &self.kek()?, domain).await {
                    Ok(Some(fresh)) => fresh,
                    Ok(None) => set,
                    Err(e) => {
                        tracing::warn!(domain = %domain.slug, error = %e, "cannot read the Domain keys again; signing with the ones read before");
                        return Ok(set);
                    }
                }
            }
            None => self.load(domain).await?,
        };
        self.lock().insert(
            domain.id,
            Cached {
                set: set.clone(),
                fetched: Instant::now(),
            },
        );
        Ok(set)
    }

    /// Forgets what was read of the Domain's keys (after this replica changed them).
    pub(crate) fn forget(&self, domain_id: Uuid) {
        self.lock().remove(&domain_id);
    }

    /// Reads (or makes) the keys of every Domain: a Domain whose key is missing, or a KEK that
    /// did not seal them, fails here, at start, instead of at the first request.
    pub async fn prepare_all(&self) -> Result<usize, KeyError> {
        let all = {
            let mut conn = self.store.acquire().await?;
            domains::list(&mut conn).await?
        };
        for d in &all {
            self.keys(d).await?;
        }
        Ok(all.len())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Cached>> {
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn load(&self, domain: &Domain) -> Result<KeySet, KeyError> {
        let kek = self.kek()?;
        let mut conn = self.store.acquire().await?;
        if let Some(set) = self.read(&mut conn, &kek, domain).await? {
            return Ok(set);
        }
        drop(conn);
        self.create_first(&kek, domain).await?;
        let mut conn = self.store.acquire().await?;
        self.read(&mut conn, &kek, domain)
            .await?
            .ok_or_else(|| KeyError::NoKey {
                slug: domain.slug.clone(),
                path: seed_path(&self.data_dir, &domain.slug),
            })
    }

    /// The Domain's stored keys, unsealed; None when it has none.
    async fn read(
        &self,
        conn: &mut sqlx::AnyConnection,
        kek: &Kek,
        domain: &Domain,
    ) -> Result<Option<KeySet>, KeyError> {
        let rows = domain_keys::list(conn, domain.id).await?;
        if rows.is_empty() {
            return Ok(None);
        }
        let keys = rows
            .iter()
            .map(|row| unseal(kek, domain, row))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(KeySet { keys }))
    }

    /// The Domain's first key: its old seed file imported, else a fresh one when the Domain
    /// has no nodes, else [`KeyError::NoKey`]. Stored if absent; the caller reads back.
    async fn create_first(&self, kek: &Kek, domain: &Domain) -> Result<(), KeyError> {
        let (seed, how) = match seed_file::read(&self.data_dir, &domain.slug)? {
            Some(seed) => (seed, "imported the Domain key from its seed file"),
            None => {
                let mut conn = self.store.acquire().await?;
                if domains::has_nodes(&mut conn, domain.id).await? {
                    // A registration that raced this one may have made the first key and then
                    // its node since `read` found none: the key was stored before that node,
                    // so it is seen here, and it is the one to use.
                    if !domain_keys::list(&mut conn, domain.id).await?.is_empty() {
                        return Ok(());
                    }
                    return Err(KeyError::NoKey {
                        slug: domain.slug.clone(),
                        path: seed_path(&self.data_dir, &domain.slug),
                    });
                }
                (random_seed()?, "created a new Domain signing key")
            }
        };
        let row = sealed_row(kek, domain, 1, &seed, 0, unix_now())?;
        let mut conn = self.store.acquire().await?;
        if domain_keys::insert_if_absent(&mut conn, &row).await? {
            tracing::info!(domain = %domain.slug, public_key = %row.public_key, "{how}");
        }
        Ok(())
    }
}

/// A fresh Ed25519 seed.
pub(crate) fn random_seed() -> Result<[u8; 32], KeyError> {
    let mut seed = [0u8; 32];
    SystemRandom::new()
        .fill(&mut seed)
        .map_err(|_| KeyError::Random)?;
    Ok(seed)
}

/// The row of `seed` as generation `generation` of `domain`, sealed under `kek` (no
/// transition statement: the caller adds one after generation 1).
pub(crate) fn sealed_row(
    kek: &Kek,
    domain: &Domain,
    generation: i64,
    seed: &[u8; 32],
    active_from: i64,
    now: i64,
) -> Result<StoredKey, KeyError> {
    let public_key = DomainSigner::from_seed(seed)
        .map_err(|_| KeyError::Random)?
        .public_key_b64();
    let id = KeyId {
        domain_id: domain.id,
        generation,
        public_key: &public_key,
    };
    let sealed_seed = seal::seal(kek, id, seed)?;
    Ok(StoredKey {
        domain_id: domain.id,
        generation,
        public_key,
        sealed_seed,
        created_at: now,
        active_from,
        transition: None,
        activated_at: None,
    })
}

/// Opens every stored key of `domain` with `kek` (what a restore checks before it trusts a KEK).
pub(crate) fn open_all(kek: &Kek, domain: &Domain, rows: &[StoredKey]) -> Result<(), KeyError> {
    for row in rows {
        unseal(kek, domain, row)?;
    }
    Ok(())
}

fn unseal(kek: &Kek, domain: &Domain, row: &StoredKey) -> Result<DomainKey, KeyError> {
    let seed = open_seed(kek, domain, row)?;
    let mismatch = || KeyError::Mismatch {
        slug: domain.slug.clone(),
        generation: row.generation,
    };
    let signer = DomainSigner::from_seed(&seed).map_err(|_| mismatch())?;
    if signer.public_key_b64() != row.public_key {
        return Err(mismatch());
    }
    Ok(DomainKey {
        generation: row.generation,
        active_from: row.active_from,
        signer: Arc::new(signer),
    })
}

/// The seed of one stored key, opened with `kek` (checked against its public key by
/// [`unseal`]; a KEK rotation checks it too before it seals it again).
fn open_seed(kek: &Kek, domain: &Domain, row: &StoredKey) -> Result<[u8; 32], KeyError> {
    let id = KeyId {
        domain_id: domain.id,
        generation: row.generation,
        public_key: &row.public_key,
    };
    Ok(seal::open(kek, id, &row.sealed_seed)?)
}

/// The wall clock in unix seconds (which key signs is decided by it on every replica alike).
pub(crate) fn unix_now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}
