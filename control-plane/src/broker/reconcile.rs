//! The reconcile loop: one task that wakes when a resource is created or deleted or a node
//! registers, and every few seconds anyway. Each pass gathers, for every resource still
//! driven (all but Failed and Deleted), what is true now — the substrate's view and whether a
//! node registered with the resource's token — and offers it all to the phase machine, which
//! ignores what does not apply. Each transition is persisted with what was observed and when.
//!
//! Only the replica holding the broker lease reconciles (`crate::leader`), and each of its
//! writes of a resource is fenced by that lease (`resources::update_as`): a paused old leader
//! writes nothing once another replica holds the lease.

use std::sync::{Arc, Weak};
use std::time::Instant;

use plexsphere_broker::composite::Composite;
use plexsphere_broker::{Blueprint, Class, Observation, Outcome, Phase, Resource};

use super::BrokerHost;
use super::provision::{self, PendingStep};
use super::substrate::{Substrate, SubstrateError, Target};
use crate::audit;
use crate::error::Error;
use crate::leader::Fence;
use crate::store::resources::{self, ResourceRow};
use crate::store::{self, StoreError, credentials, projects, tokens};

/// Starts the loop; it ends by itself once the state is gone (the server stopped).
pub fn spawn<S: BrokerHost + 'static>(state: &Arc<S>) -> tokio::task::JoinHandle<()> {
    let weak: Weak<S> = Arc::downgrade(state);
    let every = state.broker().config.reconcile_every;
    tokio::spawn(async move {
        loop {
            let Some(st) = weak.upgrade() else { return };
            let woken = st.broker().woken();
            if let Err(e) = pass(&*st).await {
                tracing::warn!(error = %e, "the broker's reconcile pass failed; retrying at the next round");
            }
            tokio::select! {
                _ = woken => {},
                _ = tokio::time::sleep(every) => {},
            }
        }
    })
}

/// One pass over every resource still driven; nothing unless this replica leads.
pub async fn pass(st: &(impl BrokerHost + ?Sized)) -> Result<(), Error> {
    if st.leadership().acting(Instant::now()).is_none() {
        return Ok(());
    }
    let rows = {
        let mut conn = st.store().acquire().await?;
        resources::list_active(&mut conn).await?
    };
    for row in rows {
        let id = row.resource.id;
        if let Err(e) = reconcile_one(st, row).await {
            tracing::warn!(resource_id = %id, error = %e, "cannot reconcile the resource; retrying at the next round");
        }
    }
    Ok(())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SubstrateError> + Send + 'static,
) -> Result<T, SubstrateError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(SubstrateError::Failed(format!(
            "the substrate call panicked: {e}"
        )))
    })
}

/// A pass that stops because the substrate cannot be asked now: the phase stays, the loop
/// logs the reason and the next pass asks again.
fn unreachable(e: &SubstrateError) -> Error {
    Error::Unavailable(format!("the substrate cannot be asked now: {e}"))
}

/// A provision or deprovision call's outcome: a failure becomes a fact of this pass, an
/// unreachable substrate ends the pass (the phase stays).
fn failed_into(
    done: Result<(), SubstrateError>,
    facts: &mut Vec<Observation>,
) -> Result<(), Error> {
    match done {
        Ok(()) => Ok(()),
        Err(e @ SubstrateError::Unreachable(_)) => Err(unreachable(&e)),
        Err(SubstrateError::Failed(reason)) => {
            facts.push(Observation::SubstrateFailed { reason });
            Ok(())
        }
    }
}

/// What the substrate calls of this pass are about: the resource and its cloud credential,
/// opened. The inner `Err` is why the resource fails: the credential is gone or does not
/// open, or it was revoked and the resource has no server yet (a revoked credential still
/// watches and deletes what it made, so a revoke never strands a server).
async fn target(
    st: &(impl BrokerHost + ?Sized),
    resource: &Resource,
    phase: Phase,
) -> Result<Result<Target, String>, Error> {
    let id = resource.cloud_credential_id;
    let row = {
        let mut conn = st.store().acquire().await?;
        credentials::get(&mut conn, id).await?
    };
    let Some(row) = row else {
        return Ok(Err(format!(
            "its cloud credential {id} no longer exists; delete the resource and create it again with another credential"
        )));
    };
    if row.revoked_at.is_some() && phase == Phase::Pending {
        return Ok(Err(format!(
            "its cloud credential {id} was revoked before anything was made with it; create the resource again with another credential"
        )));
    }
    match st.broker().open_credential(st.keys(), &row) {
        Ok(credential) => Ok(Ok(Target {
            resource: resource.clone(),
            credential,
        })),
        Err(e) => Ok(Err(e.to_string())),
    }
}

/// Drives one resource as far as the current facts take it (nothing unless this replica leads).
pub async fn reconcile_one(
    st: &(impl BrokerHost + ?Sized),
    mut row: ResourceRow,
) -> Result<(), Error> {
    let Some(fence) = st.leadership().acting(Instant::now()) else {
        return Ok(());
    };
    let fence = &fence;
    let broker = st.broker();
    let Some(entry) = broker
        .config
        .catalog
        .get(&row.resource.blueprint_version_id)
    else {
        let reason = format!(
            "blueprint version {} is no longer in this server's catalog",
            row.resource.blueprint_version_id
        );
        return apply(
            st,
            fence,
            &mut row,
            Class::Standalone,
            vec![Observation::SubstrateFailed { reason }],
        )
        .await;
    };
    let blueprint: &Blueprint = &entry.blueprint;
    let class = blueprint.class;
    let phase = row.resource.provisioning.phase;
    let ready = match broker.substrate(blueprint) {
        Ok(s) => target(st, &row.resource, phase)
            .await?
            .map(|t| (s, Arc::new(t))),
        Err(e) => Err(e.to_string()),
    };
    let (substrate, target): (Arc<dyn Substrate>, Arc<Target>) = match ready {
        Ok(ready) => ready,
        Err(reason) => {
            return apply(
                st,
                fence,
                &mut row,
                class,
                vec![Observation::SubstrateFailed { reason }],
            )
            .await;
        }
    };
    let mut facts = Vec::new();

    if phase == Phase::Pending {
        match pending(st, fence, blueprint, &substrate, &target, &mut row).await {
            Ok(Some(composite)) => {
                if !still_leading(st, &row) {
                    return Ok(());
                }
                let (s, t) = (substrate.clone(), target.clone());
                failed_into(
                    blocking(move || s.provision(&t, &composite)).await,
                    &mut facts,
                )?;
            }
            Ok(None) => {}
            Err(Pending::Stop) => return Ok(()),
            Err(Pending::Fail(reason)) => {
                return apply(
                    st,
                    fence,
                    &mut row,
                    class,
                    vec![Observation::SubstrateFailed { reason }],
                )
                .await;
            }
            Err(Pending::Error(e)) => return Err(e),
        }
    }
    if phase == Phase::Deprovisioning {
        if !still_leading(st, &row) {
            return Ok(());
        }
        deprovision_extras(st, &row).await?;
        let (s, t) = (substrate.clone(), target.clone());
        failed_into(blocking(move || s.deprovision(&t)).await, &mut facts)?;
    }

    let (s, t) = (substrate.clone(), target.clone());
    match blocking(move || {
        let mut seen = s.observe(&t)?;
        if s.gone(&t)? {
            seen.push(Observation::SubstrateGone);
        }
        Ok(seen)
    })
    .await
    {
        Ok(seen) => facts.extend(seen),
        Err(e @ SubstrateError::Unreachable(_)) => {
            // What was decided so far (a failed create) still counts.
            if facts.is_empty() {
                return Err(unreachable(&e));
            }
            tracing::warn!(resource_id = %row.resource.id, error = %e, "cannot observe the resource now; the next pass asks again");
        }
        Err(SubstrateError::Failed(reason)) => facts.push(Observation::SubstrateFailed { reason }),
    }
    if class == Class::Machine
        && let Some(token_id) = &row.token_id
    {
        let mut conn = st.store().acquire().await?;
        if let Some(node_id) = tokens::get(&mut conn, token_id)
            .await?
            .and_then(|t| t.consumed_by_node)
        {
            facts.push(Observation::NodeRegistered { node_id });
        }
    }
    apply(st, fence, &mut row, class, facts).await
}

/// Whether this replica still leads right before a call the database cannot fence (the
/// substrate's provision and deprovision, the token revoke and node removal of a delete): a
/// pass that began as leader may outlast its lease (slow substrate calls, a paused process),
/// and then the new leader does the work instead of both.
fn still_leading(st: &(impl BrokerHost + ?Sized), row: &ResourceRow) -> bool {
    let leads = st.leadership().acting(Instant::now()).is_some();
    if !leads {
        tracing::warn!(resource_id = %row.resource.id, "this replica stopped leading during a reconcile pass; it leaves the resource to the new leader");
    }
    leads
}

/// Why a `Pending` pass hands the substrate nothing.
enum Pending {
    /// Another writer moved the resource (a delete): the next pass decides.
    Stop,
    /// Provisioning cannot start: the resource fails with this reason.
    Fail(String),
    Error(Error),
}

impl From<Error> for Pending {
    fn from(e: Error) -> Self {
        Pending::Error(e)
    }
}

impl From<StoreError> for Pending {
    fn from(e: StoreError) -> Self {
        Pending::Error(e.into())
    }
}

/// The composite to hand the substrate this pass, if any (see `provision::pending_step`).
/// A freshly prepared composite is stored redacted before the real one is handed over.
async fn pending(
    st: &(impl BrokerHost + ?Sized),
    fence: &Fence,
    blueprint: &Blueprint,
    substrate: &Arc<dyn Substrate>,
    target: &Arc<Target>,
    row: &mut ResourceRow,
) -> Result<Option<Composite>, Pending> {
    let mut holds = Ok(true);
    if blueprint.class == Class::Machine && row.composite.is_some() {
        let (s, t) = (substrate.clone(), target.clone());
        holds = blocking(move || s.gone(&t).map(|gone| !gone)).await;
    }
    let step = match holds {
        Ok(h) => provision::pending_step(blueprint.class, row.composite.is_some(), || h),
        Err(e @ SubstrateError::Unreachable(_)) => return Err(Pending::Error(unreachable(&e))),
        Err(SubstrateError::Failed(reason)) => return Err(Pending::Fail(reason)),
    };
    let now = st.now();
    match step {
        PendingStep::AlreadyHanded => return Ok(None),
        PendingStep::HandStored => {
            let yaml = row.composite.as_deref().unwrap_or_default();
            return Ok(Some(provision::parse_composite(yaml)?));
        }
        PendingStep::Remint => {
            if let Some(t) = &row.token_id {
                let mut conn = st.store().acquire().await?;
                tokens::revoke(&mut conn, t, store::unix(now)).await?;
                tracing::info!(resource_id = %row.resource.id, token_id = %t, "the resource's machine was never handed its document; its token is revoked and a new one minted");
            }
        }
        PendingStep::Prepare => {}
    }
    let p = match provision::prepare(st, blueprint, &row.resource, now).await {
        Ok(p) => p,
        Err(e @ (Error::Invalid(_) | Error::Unavailable(_))) => {
            return Err(Pending::Fail(e.to_string()));
        }
        Err(e) => return Err(e.into()),
    };
    row.token_id = p.token_id.clone();
    row.composite = Some(p.composite_yaml);
    row.provisioned_at = Some(store::unix(now));
    let mut conn = st.store().acquire().await?;
    if !resources::update_as(&mut conn, row, store::unix(now), fence.at_now()).await? {
        // Someone else moved it (or another replica took the lease) (a delete): the token must not outlive this.
        if let Some(t) = &p.token_id {
            tokens::revoke(&mut conn, t, store::unix(now)).await?;
        }
        return Err(Pending::Stop);
    }
    Ok(Some(p.delivered))
}

/// A machine being deleted: its unused token is revoked and its node removed (peers hear
/// `peer_removed`). Both are idempotent.
async fn deprovision_extras(
    st: &(impl BrokerHost + ?Sized),
    row: &ResourceRow,
) -> Result<(), Error> {
    let now = store::unix(st.now());
    if let Some(t) = &row.token_id {
        let mut conn = st.store().acquire().await?;
        tokens::revoke(&mut conn, t, now).await?;
    }
    if let Some(node_id) = row.resource.node_id
        && st.node_ops().leave(node_id, now).await?
    {
        tracing::info!(resource_id = %row.resource.id, node_id = %node_id, "the resource's node was removed");
    }
    Ok(())
}

/// Offers `facts` in order and persists the resource when its phase moved.
async fn apply(
    st: &(impl BrokerHost + ?Sized),
    fence: &Fence,
    row: &mut ResourceRow,
    class: Class,
    facts: Vec<Observation>,
) -> Result<(), Error> {
    let now = st.now();
    let mut moves = Vec::new();
    for obs in &facts {
        if let Outcome::Moved { from, to } = row.resource.observe(class, obs, now) {
            moves.push(serde_json::json!({"from": from.as_str(), "to": to.as_str(), "observed": obs.describe().to_string()}));
            st.metrics().transition(from.as_str(), to.as_str());
            tracing::info!(
                resource_id = %row.resource.id,
                phase = %row.resource.provisioning.phase,
                observed = %obs.describe(),
                "resource phase changed"
            );
        }
    }
    if moves.is_empty() {
        return Ok(());
    }
    // The phase change and its audit rows commit together.
    let mut tx = st.store().begin().await?;
    if !resources::update_as(&mut tx, row, store::unix(now), fence.at_now()).await? {
        tracing::debug!(resource_id = %row.resource.id, "resource changed meanwhile (or this replica lost the broker lease); the next pass decides again");
        return Ok(());
    }
    if let Some(pepper) = st.audit_pepper() {
        let domain = projects::get(&mut tx, row.resource.project_id)
            .await?
            .map(|p| p.domain_id);
        for detail in moves {
            let entry = audit::AuditEntry {
                domain_id: domain,
                actor: audit::Actor::broker(),
                action: "resource.phase",
                target: format!("resource/{}", row.resource.id),
                detail,
            };
            audit::record(&mut tx, &pepper, &entry, store::unix(now)).await?;
        }
    }
    tx.commit().await.map_err(StoreError::from)?;
    Ok(())
}
