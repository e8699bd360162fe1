//! What load balancers and Prometheus ask: `/healthz` (the process answers), `/readyz` (the
//! database answers, its schema is current and the event bus between replicas is connected), `/metrics` (docs/metrics.md), and the
//! middleware that counts every request by its route template.
//!
//! None of these log per request above DEBUG: a probe every few seconds must not fill the log.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use plexsphere_wire::{ApiError, codes};

use super::extract::Operator;
use super::state::AppState;
use crate::error::Error;
use crate::metrics::{self, UNMATCHED_ROUTE};
use crate::store::resources;

/// How long one readiness check may take before it counts as failed (a database that takes
/// longer to answer `SELECT 1` is not serving requests either).
pub(crate) const READY_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// One thing `/readyz` checks. The list is [`READY_CHECKS`]; a new dependency (the bus) is
/// one more variant and one more row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadyCheck {
    /// The database answers `SELECT 1`.
    Database,
    /// Every embedded migration is applied.
    Migrations,
    /// The event bus carries notices between replicas (NATS connected, with `--nats-url`;
    /// always passes for the in-process bus).
    Bus,
}

/// What `/readyz` checks, in order; the first failure is the answer.
pub(crate) const READY_CHECKS: &[ReadyCheck] = &[
    ReadyCheck::Database,
    ReadyCheck::Migrations,
    ReadyCheck::Bus,
];

impl ReadyCheck {
    /// Passes, or says what is wrong and what to do, in one line.
    async fn run(self, st: &AppState) -> Result<(), String> {
        match self {
            ReadyCheck::Database => st
                .store
                .ping()
                .await
                .map_err(|e| format!("the database does not answer: {e}")),
            ReadyCheck::Migrations => {
                let pending = st
                    .store
                    .pending_migrations()
                    .await
                    .map_err(|e| format!("cannot read the applied migrations: {e}"))?;
                if pending.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "database migrations {pending:?} are not applied; run `plexsphere migrate`"
                    ))
                }
            }
            ReadyCheck::Bus => st.bus.check(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            ReadyCheck::Database => "database",
            ReadyCheck::Migrations => "migrations",
            ReadyCheck::Bus => "bus",
        }
    }
}

/// `GET /healthz`: 200 `ok` while the process serves requests.
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// `GET /readyz`: 200 `ok` when every check of [`READY_CHECKS`] passes; else 503
/// `unavailable` naming the first check that failed.
pub(crate) async fn readyz(State(st): State<Arc<AppState>>) -> Response {
    for check in READY_CHECKS {
        let outcome = match tokio::time::timeout(READY_CHECK_TIMEOUT, check.run(&st)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!(
                "the {} check got no answer within {} s",
                check.name(),
                READY_CHECK_TIMEOUT.as_secs()
            )),
        };
        if let Err(reason) = outcome {
            tracing::debug!(check = check.name(), %reason, "readyz: not ready");
            let body = ApiError::new(codes::UNAVAILABLE, format!("not ready: {reason}"));
            return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
        }
    }
    "ok".into_response()
}

/// `GET /metrics` on the API listener: for an operator token of scope `read-only` or higher.
pub(crate) async fn metrics(State(st): State<Arc<AppState>>, _op: Operator) -> Response {
    exposition(&st).await
}

/// `GET /metrics` on `--metrics-listen`: no authentication (that listener is meant for
/// loopback or a private network).
pub(crate) async fn metrics_open(State(st): State<Arc<AppState>>) -> Response {
    exposition(&st).await
}

/// Reads what is read at scrape time (the pool, resources by phase), then encodes.
async fn exposition(st: &AppState) -> Response {
    let pool = st.store.pool();
    st.metrics.set_pool(
        pool.size(),
        pool.num_idle(),
        pool.options().get_max_connections(),
    );
    st.metrics.set_roles(
        st.leadership.leads_now(std::time::Instant::now()),
        st.bus.check().is_ok(),
    );
    match resource_counts(st).await {
        Ok(counts) => st.metrics.set_resources(&counts),
        // The rest is still worth serving; the gauges keep their last values.
        Err(e) => tracing::debug!(error = %e, "metrics: cannot count resources by phase"),
    }
    match st.metrics.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response(),
        Err(_) => Error::Internal("cannot encode the metrics".into()).into_response(),
    }
}

async fn resource_counts(st: &AppState) -> Result<Vec<(&'static str, i64)>, Error> {
    let mut conn = st.store.acquire().await?;
    Ok(resources::count_by_phase(&mut conn).await?)
}

/// Counts the request under its route template (never the raw path) and times it to the
/// response head.
pub(crate) async fn track(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| UNMATCHED_ROUTE.to_owned(), |p| p.as_str().to_owned());
    let method = metrics::method_label(req.method());
    let started = Instant::now();
    let resp = next.run(req).await;
    st.metrics.observe_request(
        &route,
        method,
        resp.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    resp
}
