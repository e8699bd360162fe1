//! The broker's I/O shell around the pure `plexsphere-broker` core: the catalog and sealing key
//! the server holds, the substrates behind one trait, the reconcile loop that drives every
//! resource's phase from observations, and the wake-up other parts of the server ring.
//!
//! - [`substrate`]: the `Substrate` trait and its `local-directory` and `crossplane` forms;
//! - `local_machine`: the `local-machine` substrate over `plexsphere-nspawn` (root only);
//! - [`openstack`]: the `openstack` substrate, Nova servers through the cloud's own API;
//! - [`reconcile`]: the loop (one task) and one pass over the active resources;
//! - [`sealing`]: cloud credentials sealed at rest under the key-encryption key;
//! - [`provision`]: what provisioning a resource starts with (the machine's bootstrap token,
//!   its cloud-init document, the composite).

pub(crate) mod local_machine;
pub mod openstack;
pub(crate) mod provision;
pub mod reconcile;
pub(crate) mod sealing;
pub(crate) mod substrate;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plexsphere_broker::credentials::{CredentialKey, CredentialPayload};
use plexsphere_broker::{Blueprint, Catalog, Substrate as SubstrateKind};
use time::OffsetDateTime;
use tokio::sync::Notify;

use crate::error::Error;
use crate::keys::Keyring;
use crate::node::ops::NodeOps;
use crate::store::Store;
use substrate::{Crossplane, LocalDirectory, Substrate};

/// What the reconcile loop works with, from the server it runs in: the store, the Domain keys
/// (a machine's document carries its Domain's signing key), the node operations (a deleted
/// machine's node leaves, its peers hear it), the broker and the clock. The HTTP state
/// implements it; the broker never sees the HTTP state itself.
pub trait BrokerHost: Send + Sync {
    fn store(&self) -> &Store;
    fn keys(&self) -> &Keyring;
    fn node_ops(&self) -> NodeOps<'_>;
    fn broker(&self) -> &Broker;
    fn now(&self) -> OffsetDateTime;
    /// Where phase transitions are counted.
    fn metrics(&self) -> &crate::metrics::Metrics;
    /// Whether this replica leads (holds the broker lease): only the leader reconciles.
    fn leadership(&self) -> &crate::leader::Leadership;
    /// The audit pepper the broker's phase changes are recorded under (docs/audit.md);
    /// `None`: a host that keeps no audit log (tests of the broker alone).
    fn audit_pepper(&self) -> Option<ring::hmac::Key> {
        None
    }
}

impl<T: BrokerHost + ?Sized> BrokerHost for Arc<T> {
    fn store(&self) -> &Store {
        (**self).store()
    }
    fn keys(&self) -> &Keyring {
        (**self).keys()
    }
    fn node_ops(&self) -> NodeOps<'_> {
        (**self).node_ops()
    }
    fn broker(&self) -> &Broker {
        (**self).broker()
    }
    fn now(&self) -> OffsetDateTime {
        (**self).now()
    }
    fn metrics(&self) -> &crate::metrics::Metrics {
        (**self).metrics()
    }
    fn leadership(&self) -> &crate::leader::Leadership {
        (**self).leadership()
    }
    fn audit_pepper(&self) -> Option<ring::hmac::Key> {
        (**self).audit_pepper()
    }
}

/// The broker's knobs.
#[derive(Clone)]
pub struct BrokerConfig {
    pub catalog: Arc<Catalog>,
    /// The URL machines reach the API at (`https://host:port`), put in cloud-init documents.
    pub public_url: Option<String>,
    /// The lab CA machines must trust (PEM).
    pub ca_pem: Option<String>,
    /// How often the reconcile loop re-checks without being woken.
    pub reconcile_every: Duration,
    /// The lifetime of a machine's bootstrap token.
    pub token_ttl: Duration,
    /// The env prefix of a machine's bootstrap token.
    pub token_env_prefix: String,
    /// The `local-machine` substrate, or why this server cannot offer it.
    pub local_machine: Result<Arc<dyn Substrate>, String>,
}

impl BrokerConfig {
    /// The built-in catalog, a 3 s re-check, 1 h tokens, and no local machines.
    pub fn new(catalog: Catalog) -> Self {
        Self {
            catalog: Arc::new(catalog),
            public_url: None,
            ca_pem: None,
            reconcile_every: Duration::from_secs(3),
            token_ttl: Duration::from_secs(3600),
            token_env_prefix: "lab".to_owned(),
            local_machine: Err(
                "the local-machine substrate is not enabled on this server (it needs root and systemd-nspawn; start `plexsphere dev` as root)".to_owned(),
            ),
        }
    }
}

impl Default for BrokerConfig {
    fn default() -> Self {
        let catalog = Catalog::builtin().unwrap_or_else(|e| {
            tracing::error!(error = %e, "the built-in blueprints do not load; the catalog is empty");
            Catalog::empty()
        });
        Self::new(catalog)
    }
}

/// The broker's state, shared by the API and the reconcile loop.
pub struct Broker {
    pub config: BrokerConfig,
    data_dir: PathBuf,
    /// The credentials' sealing key derived from this replica's KEK, once derived (`sealing`).
    /// Kept for the life of the process: a replica's KEK does not change while it runs (the
    /// keyring is given it at start, or reads the data directory's once and keeps it), and a
    /// KEK rotation is done with the replicas stopped.
    kek_key: Mutex<Option<Arc<CredentialKey>>>,
    /// An earlier version's `credentials.key`, once looked for (`sealing`).
    legacy_key: Mutex<Option<Option<Arc<CredentialKey>>>>,
    wake: Notify,
    local_directory: Arc<dyn Substrate>,
    crossplane: Arc<dyn Substrate>,
    openstack: Arc<dyn Substrate>,
}

impl Broker {
    pub fn new(data_dir: &Path, config: BrokerConfig) -> Self {
        Self {
            config,
            data_dir: data_dir.to_owned(),
            kek_key: Mutex::new(None),
            legacy_key: Mutex::new(None),
            wake: Notify::new(),
            local_directory: Arc::new(LocalDirectory::new(data_dir.join("buckets"))),
            crossplane: Arc::new(Crossplane),
            openstack: Arc::new(openstack::OpenStack::new()),
        }
    }

    /// Wakes the reconcile loop (a resource was created or deleted, a node registered).
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    pub(crate) fn woken(&self) -> tokio::sync::futures::Notified<'_> {
        self.wake.notified()
    }

    /// The substrate of a blueprint, or why this server cannot offer it (503).
    pub(crate) fn substrate(&self, blueprint: &Blueprint) -> Result<Arc<dyn Substrate>, Error> {
        match blueprint.substrate {
            SubstrateKind::LocalDirectory => Ok(self.local_directory.clone()),
            SubstrateKind::Crossplane => Ok(self.crossplane.clone()),
            SubstrateKind::OpenStack => Ok(self.openstack.clone()),
            SubstrateKind::LocalMachine => match &self.config.local_machine {
                Ok(s) => Ok(s.clone()),
                Err(why) => Err(Error::Unavailable(format!(
                    "blueprint {} needs the local-machine substrate, which this server cannot offer: {why}",
                    blueprint.label()
                ))),
            },
        }
    }

    /// A stored cloud credential, opened with this replica's KEK (or an earlier version's
    /// `credentials.key`); the error says what the operator can do.
    pub(crate) fn open_credential(
        &self,
        keys: &Keyring,
        row: &crate::store::credentials::CredentialRow,
    ) -> Result<CredentialPayload, Error> {
        let kek = self.kek_key(keys)?;
        let legacy = self.legacy_key()?;
        let mut candidates = vec![kek.as_ref()];
        candidates.extend(legacy.as_deref());
        sealing::open(&candidates, row)
    }

    /// `payload` sealed for the credential `id` under this replica's KEK, as stored.
    pub(crate) fn seal_credential(
        &self,
        keys: &Keyring,
        id: uuid::Uuid,
        payload: &CredentialPayload,
    ) -> Result<String, Error> {
        sealing::seal(self.kek_key(keys)?.as_ref(), id, payload)
    }

    /// The sealing key of this replica's KEK, derived (HKDF) the first time it is needed and
    /// kept; a failure to derive it is not kept, so the next call tries again.
    fn kek_key(&self, keys: &Keyring) -> Result<Arc<CredentialKey>, Error> {
        let mut slot = self.kek_key.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = slot.as_ref() {
            return Ok(k.clone());
        }
        let key = Arc::new(sealing::replica_key(keys)?);
        *slot = Some(key.clone());
        Ok(key)
    }

    fn legacy_key(&self) -> Result<Option<Arc<CredentialKey>>, Error> {
        let mut slot = self.legacy_key.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = slot.as_ref() {
            return Ok(k.clone());
        }
        let key = sealing::legacy_key(&self.data_dir)?.map(Arc::new);
        *slot = Some(key.clone());
        Ok(key)
    }
}

/// The provider a blueprint's substrate takes credentials of.
pub(crate) fn provider_for(substrate: SubstrateKind) -> &'static str {
    match substrate {
        SubstrateKind::LocalDirectory | SubstrateKind::LocalMachine => "local",
        SubstrateKind::Crossplane | SubstrateKind::OpenStack => "openstack",
    }
}
