//! A Domain's signing keys: `GET /v1/domains/{domain}/signing-keys` (scope `read-only`), `POST`
//! to it (scope `admin`: a rotation, `crate::keys::rotate`), and the node route
//! `GET /v1/nodes/{id}/signing-keys`, the transition chain a node follows from the key it
//! pinned when it was offline for a whole overlap.

use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use plexsphere_wire::admin::List;
use plexsphere_wire::signing_keys::{KeyTransition, MAX_KEY_CHAIN, SigningKeyChain};
use plexsphere_wire::signing_keys_admin::{
    DEFAULT_OVERLAP_SECS, MAX_OVERLAP_SECS, RotateSigningKeyRequest, SigningKeyStatus,
    SigningKeyView,
};
use uuid::Uuid;

use super::extract::{ApiJson, NodeAuth, Operator};
use super::state::AppState;
use crate::error::Error;
use crate::keys::{self, KeyError};
use crate::store::domain_keys::{self, StoredKey};
use crate::store::domains::{self, Domain};
use crate::store::{StoreError, from_unix};

/// `GET /v1/domains/{domain}/signing-keys`: every generation, oldest first.
pub async fn list(
    State(st): State<Arc<AppState>>,
    op: Operator,
    Path(domain): Path<String>,
) -> Result<Json<List<SigningKeyView>>, Error> {
    let domain = visible_domain(&st, &op, &domain).await?;
    // The Domain's first key is made (or imported) on first need, as for every other read.
    st.keys.keys(&domain).await?;
    let rows = domain_keys::list(&mut *st.store.acquire().await?, domain.id).await?;
    let now = keys::unix_now();
    let current = current_generation(&rows, now);
    let items = rows
        .iter()
        .map(|r| view(r, current, now))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(List { items }))
}

/// `POST /v1/domains/{domain}/signing-keys`: 201 with the new key, announced to every node of
/// the Domain at once; 409 while a previous rotation's overlap lasts or when another replica
/// rotated at the same moment.
pub async fn rotate(
    State(st): State<Arc<AppState>>,
    op: Operator,
    Path(domain): Path<String>,
    ApiJson(req): ApiJson<RotateSigningKeyRequest>,
) -> Result<(StatusCode, Json<SigningKeyView>), Error> {
    let overlap = req.overlap_secs.unwrap_or(DEFAULT_OVERLAP_SECS);
    if overlap > MAX_OVERLAP_SECS {
        return Err(Error::BadRequest(format!(
            "overlap_secs {overlap} is longer than the {MAX_OVERLAP_SECS} s (30 days) a rotation may last; give 0 to {MAX_OVERLAP_SECS} (default {DEFAULT_OVERLAP_SECS})"
        )));
    }
    let domain = visible_domain(&st, &op, &domain).await?;
    op.domain_wide(
        domain.id,
        "a Domain's signing key signs for every project of the Domain",
    )?;
    let rotated = st
        .keys
        .rotate(&domain, overlap)
        .await
        .map_err(|e| match e {
            KeyError::RotationUnderWay { .. } | KeyError::RotationRaced { .. } => {
                Error::Conflict(e.to_string())
            }
            other => Error::from(other),
        })?;
    st.bus.notify(domain.id, rotated.seq);
    tracing::info!(domain = %domain.slug, operator = %op.id, generation = rotated.key.generation, overlap_secs = overlap, "Domain signing key rotated by an operator");
    let detail = serde_json::json!({"generation": rotated.key.generation, "overlap_secs": overlap, "active_from": rotated.key.active_from});
    st.audit(super::audit_record::by(
        &op,
        Some(domain.id),
        "domain.signing-key-rotate",
        format!("domain/{}", domain.id),
        detail,
    ))
    .await;
    announce_when_active(&st, rotated.key.active_from);
    let now = keys::unix_now();
    let status = if rotated.key.active_from > now {
        SigningKeyStatus::Next
    } else {
        SigningKeyStatus::Current
    };
    let key = rotated.key.wire();
    let view = SigningKeyView {
        generation: key.generation,
        public_key: key.public_key,
        active_from: from_unix("domain_keys.active_from", key.active_from)?,
        created_at: from_unix("domain_keys.created_at", rotated.created_at)?,
        status,
    };
    Ok((StatusCode::CREATED, Json(view)))
}

/// `GET /v1/nodes/{id}/signing-keys`: the transitions of the node's Domain, oldest first, the
/// newest [`MAX_KEY_CHAIN`] of them, the announced next key's included.
pub(crate) async fn chain(
    State(st): State<Arc<AppState>>,
    NodeAuth { node }: NodeAuth,
) -> Result<Json<SigningKeyChain>, Error> {
    let rows = domain_keys::list(&mut *st.store.acquire().await?, node.domain_id).await?;
    let mut transitions = rows
        .iter()
        .filter(|r| r.generation > 1)
        .map(transition)
        .collect::<Result<Vec<_>, _>>()?;
    let skip = transitions.len().saturating_sub(MAX_KEY_CHAIN);
    transitions.drain(..skip);
    Ok(Json(SigningKeyChain { transitions }))
}

fn transition(row: &StoredKey) -> Result<KeyTransition, StoreError> {
    let text = row.transition.as_deref().ok_or_else(|| {
        StoreError::corrupt(
            "domain_keys.transition (missing after generation 1)",
            row.generation,
        )
    })?;
    serde_json::from_str(text).map_err(|e| StoreError::corrupt("domain_keys.transition", e))
}

/// After the new key's `active_from`, tells the Domain's nodes that it signs
/// (`keys::rotate::announce_due`); the maintenance task does it too if this replica is gone
/// by then. The task ends with the server.
fn announce_when_active(st: &Arc<AppState>, active_from: i64) {
    let weak: Weak<AppState> = Arc::downgrade(st);
    let wait = u64::try_from(active_from.saturating_sub(keys::unix_now())).unwrap_or(0);
    tokio::spawn(async move {
        // One second past `active_from`: the clock's seconds then count it as passed.
        tokio::time::sleep(Duration::from_secs(wait.saturating_add(1))).await;
        let Some(st) = weak.upgrade() else { return };
        if let Err(e) = keys::rotate::announce_due(&st.store, st.bus.as_ref()).await {
            tracing::warn!(error = %e, "cannot announce the Domain's new signing key; the maintenance task retries");
        }
    });
}

/// The Domain named by `name` (its id or slug), if the token may see it: a project-bound token
/// sees its project's Domain only (another one answers 404, as a missing one does).
pub(super) async fn visible_domain(
    st: &AppState,
    op: &Operator,
    name: &str,
) -> Result<Domain, Error> {
    let mut conn = st.store.acquire().await?;
    let found = match Uuid::parse_str(name) {
        Ok(id) => domains::get(&mut conn, id).await?,
        Err(_) => domains::by_slug(&mut conn, name).await?,
    };
    let not_found = || {
        Error::NotFound(format!(
            "no Domain {name:?}; `plexctl domain list` shows them"
        ))
    };
    let domain = found.ok_or_else(not_found)?;
    op.require_domain(domain.id, not_found)?;
    Ok(domain)
}

/// The generation that signs at `now` (as `KeySet::current` decides it).
fn current_generation(rows: &[StoredKey], now: i64) -> i64 {
    rows.iter()
        .rev()
        .find(|r| r.active_from <= now)
        .or(rows.first())
        .map_or(1, |r| r.generation)
}

fn view(row: &StoredKey, current: i64, now: i64) -> Result<SigningKeyView, StoreError> {
    let status = if row.generation == current {
        SigningKeyStatus::Current
    } else if row.generation > current && row.active_from > now {
        SigningKeyStatus::Next
    } else {
        SigningKeyStatus::Retired
    };
    Ok(SigningKeyView {
        generation: u64::try_from(row.generation)
            .map_err(|_| StoreError::corrupt("domain_keys.generation", row.generation))?,
        public_key: row.public_key.clone(),
        active_from: from_unix("domain_keys.active_from", row.active_from)?,
        created_at: from_unix("domain_keys.created_at", row.created_at)?,
        status,
    })
}
