//! `GET /v1/audit` and `POST /v1/audit/verify` (docs/audit.md): reading a chain a page at a
//! time, and walking a whole chain to say whether it is the one plexsphere wrote.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use plexsphere_wire::audit::{
    AuditActor, AuditPage, AuditRow, DEFAULT_PAGE, MAX_PAGE, VerifyProblem, VerifyReport,
    VerifyRequest,
};
use serde::Deserialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use uuid::Uuid;

use super::extract::{ApiJson, Operator};
use super::signing_keys::visible_domain;
use super::state::AppState;
use crate::audit::chain::{ChainKey, Row, Verifier};
use crate::audit::table as audit_store;
use crate::audit::{self, PepperError};
use crate::error::Error;
use crate::store;

/// Rows read from the database at a time while verifying.
pub(crate) const VERIFY_BATCH: i64 = 1_000;

#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    domain: Option<String>,
    since: Option<String>,
    limit: Option<u32>,
    after: Option<i64>,
    actor_email: Option<String>,
}

/// The chain a request names: a Domain (id or slug) or, without one, the platform's. The log
/// is per Domain: a token limited to a project reads none of it.
async fn chain_of(
    st: &AppState,
    op: &Operator,
    domain: Option<&str>,
) -> Result<(String, Option<Uuid>), Error> {
    const PER_DOMAIN: &str = "the audit log is kept per Domain and for the platform";
    match domain.map(str::trim).filter(|d| !d.is_empty()) {
        None => {
            op.platform_wide(PER_DOMAIN)?;
            Ok((audit::PLATFORM_CHAIN.to_owned(), None))
        }
        Some(name) => {
            let d = visible_domain(st, op, name).await?;
            op.domain_wide(d.id, PER_DOMAIN)?;
            Ok((audit::chain_id(Some(d.id)), Some(d.id)))
        }
    }
}

fn pepper_error(e: PepperError) -> Error {
    Error::Internal(e.to_string())
}

/// `GET /v1/audit`: one page of a chain in seq order.
pub async fn list(
    State(st): State<Arc<AppState>>,
    op: Operator,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<AuditPage>, Error> {
    let Query(q) = query.map_err(|e| Error::BadRequest(format!("bad query string: {e}")))?;
    let (chain, domain_id) = chain_of(&st, &op, q.domain.as_deref()).await?;
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Error::Invalid(format!(
            "limit must be between 1 and {MAX_PAGE} (page with after=<next_after>)"
        )));
    }
    let since = match q.since.as_deref() {
        None => None,
        Some(s) => Some(
            OffsetDateTime::parse(s, &Rfc3339)
                .map_err(|_| {
                    Error::Invalid(format!(
                        "since {s:?} is not an RFC 3339 time (e.g. 2026-12-06T05:00:00Z)"
                    ))
                })?
                .unix_timestamp(),
        ),
    };
    let actor_email = match q.actor_email.as_deref() {
        None => None,
        Some(e) => {
            let pepper = st.pepper_key().map_err(pepper_error)?;
            Some(ChainKey::derive(&pepper, &chain).person("email", e))
        }
    };
    let filter = audit_store::Filter {
        after: q.after.unwrap_or(0).max(0),
        since,
        actor_email,
    };
    let mut conn = st.store.acquire().await?;
    let rows = audit_store::list(&mut conn, &chain, &filter, i64::from(limit)).await?;
    let next_after = if rows.len() == limit as usize {
        rows.last().map(|r| r.seq)
    } else {
        None
    };
    let entries = rows.iter().map(view).collect::<Result<Vec<_>, Error>>()?;
    Ok(Json(AuditPage {
        chain,
        domain_id,
        entries,
        next_after,
    }))
}

fn view(r: &Row) -> Result<AuditRow, Error> {
    let keyed = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    Ok(AuditRow {
        seq: r.seq,
        at: store::from_unix("audit_log.at", r.at)?,
        actor: AuditActor {
            kind: r.actor_kind.clone(),
            reference: r.actor_ref.clone(),
            name: r.actor_name.clone(),
            how: r.how.clone(),
            subject_key: keyed(&r.actor_subject),
            email_key: keyed(&r.actor_email),
        },
        action: r.action.clone(),
        target: r.target.clone(),
        // A detail that is not JSON (tampered with) is shown as the text it is.
        detail: serde_json::from_str(&r.detail)
            .unwrap_or_else(|_| serde_json::Value::String(r.detail.clone())),
        prev_hash: r.prev_hash.clone(),
        hash: r.hash.clone(),
    })
}

/// `POST /v1/audit/verify`: walks the whole chain (in batches of [`VERIFY_BATCH`]) and
/// checks every row's hash, MAC and link and the head.
pub(crate) async fn verify(
    State(st): State<Arc<AppState>>,
    op: Operator,
    ApiJson(req): ApiJson<VerifyRequest>,
) -> Result<Json<VerifyReport>, Error> {
    let (chain, _) = chain_of(&st, &op, req.domain.as_deref()).await?;
    let pepper = st.pepper_key().map_err(pepper_error)?;
    let key = ChainKey::derive(&pepper, &chain);
    let mut verifier = Verifier::new(&key);
    let mut conn = st.store.acquire().await?;
    let head = audit_store::head(&mut conn, &chain).await?;
    let mut filter = audit_store::Filter::default();
    loop {
        let batch = audit_store::list(&mut conn, &chain, &filter, VERIFY_BATCH).await?;
        for row in &batch {
            verifier.push(row);
        }
        match batch.last() {
            Some(last) if batch.len() as i64 == VERIFY_BATCH => filter.after = last.seq,
            _ => break,
        }
    }
    let verdict = verifier.finish(head.as_ref());
    if !verdict.ok() {
        tracing::warn!(
            chain = %chain, problems = verdict.problems.len() + verdict.unlisted as usize,
            operator = %op.id, "the audit chain does not verify"
        );
    }
    Ok(Json(VerifyReport {
        ok: verdict.ok(),
        chain,
        rows: verdict.rows,
        problems: verdict
            .problems
            .into_iter()
            .map(|p| VerifyProblem {
                seq: p.seq,
                kind: p.kind.as_str().to_owned(),
                detail: p.detail,
            })
            .collect(),
        more_problems: verdict.unlisted,
    }))
}
