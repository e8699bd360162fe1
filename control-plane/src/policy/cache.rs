//! One compiled policy per Domain, shared by every state build and event stream of this
//! process (`Arc<CompiledPolicy>`).
//!
//! The key is the policy version and the inventory the compile used (node ids, names,
//! Projects, tags, mesh IPs: [`CompiledPolicy::is_for`] compares them with the rows the
//! caller read). A hit costs that comparison; a miss compiles once per key: the first caller
//! compiles (on the blocking pool) while the others of the Domain wait for it, then take
//! the same `Arc` (no thundering herd after a policy change, when every node pulls its
//! state at once). The previous entry is kept too, for a stream deciding a `peer_removed`
//! of a node the new compile no longer knows ([`crate::policy::view::unknown_verdict`]).
//! Metrics: `plexsphere_policy_compiles_total`, `plexsphere_policy_compile_seconds`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use uuid::Uuid;

use crate::error::Error;
use crate::policy::view::{self, CompiledPolicy, DEFAULT_POLICY_VERSION, Verdict, inventory};
use crate::store::nodes::NodeRow;
use crate::store::projects::{self, Project};
use crate::store::{Store, StoreError, events, nodes, policies};
use plexsphere_policy::{Policy, RouteInventory};
use plexsphere_wire::node::EventKind;
use sqlx::Row as _;

/// The version of the Domain's current policy ([`DEFAULT_POLICY_VERSION`] when none is
/// stored: `store::policies`' module doc): one small read per state build; the document
/// itself is read only when the cache has no compile of that version.
pub(crate) async fn policy_version(
    conn: &mut sqlx::AnyConnection,
    domain_id: Uuid,
) -> Result<u64, Error> {
    let row = sqlx::query("SELECT MAX(version) AS v FROM policies WHERE domain_id = $1")
        .bind(domain_id.to_string())
        .fetch_one(&mut *conn)
        .await
        .map_err(StoreError::from)?;
    let v: Option<i64> = row.try_get("v").map_err(StoreError::from)?;
    match v {
        None => Ok(DEFAULT_POLICY_VERSION),
        Some(v) => {
            u64::try_from(v).map_err(|_| Error::from(StoreError::corrupt("policies.version", v)))
        }
    }
}

/// The document of version `version` (the default document for [`DEFAULT_POLICY_VERSION`]).
async fn policy_document(store: &Store, domain_id: Uuid, version: u64) -> Result<Policy, Error> {
    if version == DEFAULT_POLICY_VERSION {
        return Ok(plexsphere_policy::default_document());
    }
    let mut conn = store.acquire().await?;
    let row = policies::get(&mut conn, domain_id, version)
        .await?
        .ok_or_else(|| {
            Error::Internal(format!(
                "the Domain's policy version {version} is missing from the store"
            ))
        })?;
    plexsphere_policy::parse(&row.document).map_err(|e| {
        Error::Internal(format!(
            "the Domain's policy version {version} no longer parses ({e}); the nodes keep enforcing the state they have; set the policy again (plexctl policy set)"
        ))
    })
}

#[derive(Default)]
struct Slot {
    entries: Mutex<Entries>,
    /// Held by the one caller compiling for this Domain.
    compiling: tokio::sync::Mutex<()>,
}

#[derive(Default, Clone)]
struct Entries {
    current: Option<Arc<CompiledPolicy>>,
    previous: Option<Arc<CompiledPolicy>>,
}

/// The compiled policies of this process, one per Domain.
pub struct PolicyCache {
    slots: Mutex<HashMap<Uuid, Arc<Slot>>>,
    compiles: Counter,
    compile_seconds: Histogram,
}

impl PolicyCache {
    /// A cache that counts its compiles into these series (`Metrics::policy_compiles`...).
    pub fn new(compiles: Counter, compile_seconds: Histogram) -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
            compiles,
            compile_seconds,
        }
    }

    /// How many compiles this cache made (observable by tests).
    pub fn compiles(&self) -> u64 {
        self.compiles.get()
    }

    fn slot(&self, domain_id: Uuid) -> Arc<Slot> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.entry(domain_id).or_default().clone()
    }

    fn entries(slot: &Slot) -> Entries {
        slot.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The Domain's current compile, if any.
    pub fn current(&self, domain_id: Uuid) -> Option<Arc<CompiledPolicy>> {
        Self::entries(&self.slot(domain_id)).current
    }

    /// The compile the current one replaced, if any.
    pub(crate) fn previous(&self, domain_id: Uuid) -> Option<Arc<CompiledPolicy>> {
        Self::entries(&self.slot(domain_id)).previous
    }

    /// The compile of `source` over `live`, `projects` and `routes`, read at event seq
    /// `as_of` (the head read before the rows): the cached one when its key matches, else
    /// compiled once.
    #[allow(clippy::too_many_arguments)]
    pub async fn get(
        &self,
        store: &Store,
        domain_id: Uuid,
        version: u64,
        live: &[NodeRow],
        projects: &[Project],
        routes: &RouteInventory,
        as_of: u64,
    ) -> Result<Arc<CompiledPolicy>, Error> {
        let slot = self.slot(domain_id);
        if let Some(hit) = Self::hit(&slot, version, live, projects, routes, as_of) {
            return Ok(hit);
        }
        let _compiling = slot.compiling.lock().await;
        self.get_locked(
            store, domain_id, &slot, version, live, projects, routes, as_of,
        )
        .await
    }

    /// [`PolicyCache::get`] with the slot's `compiling` lock held.
    #[allow(clippy::too_many_arguments)]
    async fn get_locked(
        &self,
        store: &Store,
        domain_id: Uuid,
        slot: &Slot,
        version: u64,
        live: &[NodeRow],
        projects: &[Project],
        routes: &RouteInventory,
        as_of: u64,
    ) -> Result<Arc<CompiledPolicy>, Error> {
        if let Some(hit) = Self::hit(slot, version, live, projects, routes, as_of) {
            return Ok(hit);
        }
        let policy = policy_document(store, domain_id, version).await?;
        let compiled = self
            .compile(version, policy, live, projects, routes, as_of)
            .await?;
        let mut entries = slot.entries.lock().unwrap_or_else(|p| p.into_inner());
        // A caller that read the rows before the current entry's does not replace it.
        let newer = entries.current.as_ref().is_none_or(|c| as_of >= c.as_of());
        if newer {
            entries.previous = entries.current.replace(compiled.clone());
        }
        Ok(compiled)
    }

    fn hit(
        slot: &Slot,
        version: u64,
        live: &[NodeRow],
        projects: &[Project],
        routes: &RouteInventory,
        as_of: u64,
    ) -> Option<Arc<CompiledPolicy>> {
        let current = Self::entries(slot).current?;
        if !current.is_for(version, live, projects) || current.routes != *routes {
            return None;
        }
        current.seen_at(as_of);
        Some(current)
    }

    async fn compile(
        &self,
        version: u64,
        policy: Policy,
        live: &[NodeRow],
        projects: &[Project],
        routes: &RouteInventory,
        as_of: u64,
    ) -> Result<Arc<CompiledPolicy>, Error> {
        let inv = inventory(live, projects);
        let routes = routes.clone();
        let started = Instant::now();
        let compiled = tokio::task::spawn_blocking(move || {
            Arc::new(CompiledPolicy::with_routes(
                version, &policy, &inv, &routes, as_of,
            ))
        })
        .await
        .map_err(|e| Error::Internal(format!("the policy compile failed: {e}")))?;
        let secs = started.elapsed().as_secs_f64();
        self.compiles.inc();
        self.compile_seconds.observe(secs);
        tracing::info!(version, nodes = live.len(), as_of, secs, "policy compiled");
        Ok(compiled)
    }

    /// Reads the Domain's policy, Projects and live nodes from the store and answers their
    /// compile, unless the current one already includes every change through `at_least`
    /// (one read for all the streams that ask at once: the others wait and find it).
    pub(crate) async fn refresh(
        &self,
        store: &Store,
        domain_id: Uuid,
        at_least: u64,
    ) -> Result<Arc<CompiledPolicy>, Error> {
        let slot = self.slot(domain_id);
        let fresh = |slot: &Slot| {
            Self::entries(slot)
                .current
                .filter(|c| c.as_of() >= at_least)
        };
        if let Some(c) = fresh(&slot) {
            return Ok(c);
        }
        // One store read for all the streams that ask at once: the others wait here and
        // find the answer fresh.
        let _compiling = slot.compiling.lock().await;
        if let Some(c) = fresh(&slot) {
            return Ok(c);
        }
        let mut conn = store.acquire().await?;
        let head = events::head(&mut conn, domain_id).await?.seq;
        let live = nodes::live_in_domain(&mut conn, domain_id).await?;
        let projects = projects::in_domain(&mut conn, domain_id).await?;
        let version = policy_version(&mut conn, domain_id).await?;
        let routes = crate::routes::ops::route_inventory(&mut conn, domain_id).await?;
        drop(conn);
        self.get_locked(
            store, domain_id, &slot, version, &live, &projects, &routes, head,
        )
        .await
    }

    /// Whether node `me`'s stream sends the event `kind` at `seq`: a peer event only when the
    /// policy connects `me` to its subject, decided by a compile that includes every change
    /// through `floor` (the stream's start, or the last `resync` it passed: a policy or tag
    /// change appends one); when that compile does not know `me` or the subject, by one read
    /// from the store after the event (never "allow because unknown"); when that does not
    /// know them either, [`view::unknown_verdict`] (a `peer_removed` goes to the nodes
    /// the previous compile connected to the gone node, or to all when none knew it).
    pub(crate) async fn may_send(
        &self,
        store: &Store,
        domain_id: Uuid,
        me: Uuid,
        floor: u64,
        seq: u64,
        kind: &EventKind,
    ) -> Result<bool, Error> {
        if view::peer_subject(kind).is_none() {
            return Ok(true);
        }
        let policy = match self.current(domain_id).filter(|p| p.as_of() >= floor) {
            Some(p) => p,
            None => self.refresh(store, domain_id, floor).await?,
        };
        let mut verdict = view::verdict(&policy, me, kind);
        if verdict == Verdict::Unknown {
            let policy = self.refresh(store, domain_id, floor.max(seq)).await?;
            verdict = view::verdict(&policy, me, kind);
        }
        if verdict == Verdict::Unknown {
            let prev = self.previous(domain_id);
            verdict = match prev {
                Some(prev) if matches!(kind, EventKind::PeerRemoved { .. }) => {
                    match view::verdict(&prev, me, kind) {
                        Verdict::Unknown => view::unknown_verdict(kind),
                        v => v,
                    }
                }
                _ => view::unknown_verdict(kind),
            };
        }
        Ok(verdict == Verdict::Send)
    }
}
