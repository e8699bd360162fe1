//! The unauthenticated endpoints: version, the CA, registration.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use plexsphere_wire::admin::VersionInfo;
use plexsphere_wire::proof::{Challenge, RegisterChallengeRequest};
use plexsphere_wire::register::MAX_REGISTER_BODY;
use plexsphere_wire::{RegisterRequest, RegisterResponse};

use super::extract::{ApiJson, RegisterBudget, RegisterChallengeBudget};
use super::state::AppState;
use crate::error::Error;
use crate::node::register::Registrar;

pub(crate) async fn version() -> Json<VersionInfo> {
    Json(VersionInfo {
        name: "plexsphere".into(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

pub(crate) async fn ca_cert(State(st): State<Arc<AppState>>) -> Result<Response, Error> {
    let pem = st.config.ca_pem.clone().ok_or_else(|| {
        Error::NotFound("this server was not started with a CA it knows (only `plexsphere dev` serves its lab CA)".into())
    })?;
    Ok(([(header::CONTENT_TYPE, "application/x-pem-file")], pem).into_response())
}

/// `POST /v1/register/challenge`: the nonce and key a registration's proof is made with.
pub(crate) async fn register_challenge(
    State(st): State<Arc<AppState>>,
    _budget: RegisterChallengeBudget,
    ApiJson(req): ApiJson<RegisterChallengeRequest, MAX_REGISTER_BODY>,
) -> Result<Json<Challenge>, Error> {
    let registrar = Registrar {
        store: &st.store,
        keys: &st.keys,
        bus: st.bus.as_ref(),
        intervals: st.config.intervals,
    };
    let now = crate::store::unix(st.now());
    Ok(Json(registrar.challenge(&req, now).await?))
}

pub async fn register(
    State(st): State<Arc<AppState>>,
    _budget: RegisterBudget,
    ApiJson(req): ApiJson<RegisterRequest, MAX_REGISTER_BODY>,
) -> Result<(StatusCode, Json<RegisterResponse>), Error> {
    let registrar = Registrar {
        store: &st.store,
        keys: &st.keys,
        bus: st.bus.as_ref(),
        intervals: st.config.intervals,
    };
    let done = match registrar.register(&req, st.now()).await {
        Ok(done) => done,
        Err(e) => {
            st.metrics.registration(super::error::classify(&e).1);
            return Err(e);
        }
    };
    st.metrics
        .registration(if done.created { "created" } else { "existing" });
    if done.created && req.resource_handle.is_some() {
        // A broker machine may have registered: let the reconcile loop look now.
        st.broker.wake();
    }
    let status = if done.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(done.response)))
}
