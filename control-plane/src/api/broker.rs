//! The broker's operator endpoints (docs/api.md, "The broker"): the blueprint catalog, cloud
//! credentials, and resources. Creating a resource is checked in full before anything is
//! stored or any substrate touched; provisioning itself is the reconcile loop's.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use plexsphere_broker::blueprint::Param;
use plexsphere_broker::credentials::CredentialPayload;
use plexsphere_broker::{AdmitError, Class, Observation, Outcome, Resource, admit};
use plexsphere_wire::admin::List;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use super::extract::{ApiJson, Operator, UuidPath};
use super::operator::require_project;
use super::state::AppState;
use crate::broker::provider_for;
use crate::error::Error;
use crate::store::credentials::CredentialRow;
use crate::store::resources::{self, ResourceRow};
use crate::store::{self, credentials as cred_store};

/// One catalog entry as `GET /v1/blueprints` lists it.
#[derive(Debug, Serialize)]
pub(crate) struct BlueprintView {
    pub version_id: Uuid,
    pub name: String,
    pub version: String,
    pub resource_kind: String,
    pub class: Class,
    pub substrate: &'static str,
    pub parameters: std::collections::BTreeMap<String, Param>,
}

pub(crate) async fn list_blueprints(
    State(st): State<Arc<AppState>>,
    _op: Operator,
) -> Json<List<BlueprintView>> {
    let items = st
        .broker
        .config
        .catalog
        .entries()
        .into_iter()
        .map(|e| BlueprintView {
            version_id: e.version_id,
            name: e.blueprint.name.clone(),
            version: e.blueprint.version.clone(),
            resource_kind: e.blueprint.resource_kind.clone(),
            class: e.blueprint.class,
            substrate: e.blueprint.substrate.as_str(),
            parameters: e.blueprint.parameters.clone(),
        })
        .collect();
    Json(List { items })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateCredential {
    name: String,
    provider: String,
    payload: Value,
}

/// A cloud credential as the API shows it: never its payload.
#[derive(Debug, Serialize)]
pub(crate) struct CredentialView {
    pub id: Uuid,
    pub name: String,
    pub provider: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub revoked_at: Option<OffsetDateTime>,
}

fn credential_view(r: &CredentialRow) -> Result<CredentialView, Error> {
    Ok(CredentialView {
        id: r.id,
        name: r.name.clone(),
        provider: r.provider.clone(),
        created_at: store::from_unix("cloud_credentials.created_at", r.created_at)?,
        revoked_at: r
            .revoked_at
            .map(|t| store::from_unix("cloud_credentials.revoked_at", t))
            .transpose()?,
    })
}

const PROVIDERS: [&str; 2] = ["local", "openstack"];

pub(crate) async fn create_credential(
    State(st): State<Arc<AppState>>,
    op: Operator,
    ApiJson(req): ApiJson<CreateCredential>,
) -> Result<(StatusCode, Json<CredentialView>), Error> {
    let name = req.name.trim();
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(Error::Invalid(
            "name must be 1-128 printable characters".into(),
        ));
    }
    if !PROVIDERS.contains(&req.provider.as_str()) {
        return Err(Error::Invalid(format!(
            "provider {:?} is not one of local, openstack",
            req.provider
        )));
    }
    let plain = checked_payload(&req.provider, &req.payload)?;
    let id = Uuid::now_v7();
    let sealed_payload = st.broker.seal_credential(&st.keys, id, &plain)?;
    let row = CredentialRow {
        id,
        name: name.to_owned(),
        provider: req.provider,
        sealed_payload,
        created_at: store::unix(st.now()),
        revoked_at: None,
    };
    cred_store::insert(&mut *st.store.acquire().await?, &row).await?;
    tracing::info!(credential_id = %id, provider = %row.provider, operator = %op.id, "cloud credential created");
    let detail = serde_json::json!({"name": row.name, "provider": row.provider});
    st.audit(super::audit_record::by(
        &op,
        None,
        "cloud-credential.create",
        format!("cloud-credential/{id}"),
        detail,
    ))
    .await;
    Ok((StatusCode::CREATED, Json(credential_view(&row)?)))
}

/// The payload as stored, once it is a JSON object of at most [`MAX_PAYLOAD`] bytes that the
/// provider can use.
fn checked_payload(provider: &str, payload: &Value) -> Result<CredentialPayload, Error> {
    if !payload.is_object() {
        return Err(Error::Invalid(
            "payload must be a JSON object (the provider's credentials)".into(),
        ));
    }
    let bytes = payload.to_string().into_bytes();
    if bytes.len() > MAX_PAYLOAD {
        return Err(Error::Invalid(format!(
            "the payload is {} bytes; a cloud credential holds at most {MAX_PAYLOAD}",
            bytes.len()
        )));
    }
    if provider == "openstack" {
        crate::broker::openstack::credential::parse(&bytes).map_err(|e| {
            Error::Invalid(format!(
                "the payload is not an OpenStack credential: {e} (docs/broker.md, \"Point the broker at your OpenStack\")"
            ))
        })?;
    }
    Ok(CredentialPayload::new(bytes))
}

/// The largest credential payload (JSON text) the server keeps: a CA bundle and a password
/// fit many times over.
pub(crate) const MAX_PAYLOAD: usize = 64 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RotateCredential {
    payload: Value,
}

/// `POST /v1/cloud-credentials/{id}/rotate`: the credential keeps its id and name and takes a
/// new payload; every resource made with it uses the new one from its next reconcile pass.
pub(crate) async fn rotate_credential(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(id): UuidPath,
    ApiJson(req): ApiJson<RotateCredential>,
) -> Result<Json<CredentialView>, Error> {
    let mut c = st.store.acquire().await?;
    let not_found = || Error::NotFound(format!("no cloud credential with id {id}"));
    let row = cred_store::get(&mut c, id).await?.ok_or_else(not_found)?;
    if row.revoked_at.is_some() {
        return Err(Error::Invalid(format!(
            "cloud credential {id} was revoked; create a new one"
        )));
    }
    let plain = checked_payload(&row.provider, &req.payload)?;
    let sealed = st.broker.seal_credential(&st.keys, id, &plain)?;
    if !cred_store::rotate(&mut c, id, &sealed).await? {
        return Err(Error::Conflict(format!(
            "cloud credential {id} was revoked meanwhile; create a new one"
        )));
    }
    let row = cred_store::get(&mut c, id).await?.ok_or_else(not_found)?;
    tracing::info!(credential_id = %id, operator = %op.id, "cloud credential rotated");
    let detail = serde_json::json!({"name": row.name, "provider": row.provider});
    st.audit(super::audit_record::by(
        &op,
        None,
        "cloud-credential.rotate",
        format!("cloud-credential/{id}"),
        detail,
    ))
    .await;
    st.broker.wake();
    Ok(Json(credential_view(&row)?))
}

pub(crate) async fn list_credentials(
    State(st): State<Arc<AppState>>,
    _op: Operator,
) -> Result<Json<List<CredentialView>>, Error> {
    let rows = cred_store::list(&mut *st.store.acquire().await?).await?;
    let items = rows.iter().map(credential_view).collect::<Result<_, _>>()?;
    Ok(Json(List { items }))
}

pub(crate) async fn revoke_credential(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(id): UuidPath,
) -> Result<Json<CredentialView>, Error> {
    let mut c = st.store.acquire().await?;
    let not_found = || Error::NotFound(format!("no cloud credential with id {id}"));
    if !cred_store::revoke(&mut c, id, store::unix(st.now())).await? {
        return Err(not_found());
    }
    let row = cred_store::get(&mut c, id).await?.ok_or_else(not_found)?;
    tracing::info!(credential_id = %id, operator = %op.id, "cloud credential revoked");
    let detail = serde_json::json!({"name": row.name});
    st.audit(super::audit_record::by(
        &op,
        None,
        "cloud-credential.revoke",
        format!("cloud-credential/{id}"),
        detail,
    ))
    .await;
    Ok(Json(credential_view(&row)?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateResource {
    kind: String,
    blueprint_version_id: Uuid,
    cloud_credential_id: Uuid,
    #[serde(default)]
    parameters: Value,
}

fn admit_error(e: AdmitError) -> Error {
    match e {
        AdmitError::Parameters(p) => Error::InvalidParameters(p.to_string()),
        other => Error::Invalid(other.to_string()),
    }
}

/// `POST /v1/projects/{id}/resources`: 202 with the resource in phase Pending.
pub(crate) async fn create_resource(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(project_id): UuidPath,
    ApiJson(req): ApiJson<CreateResource>,
) -> Result<(StatusCode, Json<Resource>), Error> {
    let mut c = st.store.acquire().await?;
    require_project(&mut c, &op, project_id).await?;
    let broker = &st.broker;
    let admitted = admit(
        &broker.config.catalog,
        &req.kind,
        req.blueprint_version_id,
        &req.parameters,
    )
    .map_err(admit_error)?;
    let blueprint = admitted.blueprint;
    let cred_id = req.cloud_credential_id;
    let cred = cred_store::get(&mut c, cred_id).await?.ok_or_else(|| {
        Error::Invalid(format!(
            "no cloud credential with id {cred_id}; `plexctl cloud-credential list` shows them"
        ))
    })?;
    if cred.revoked_at.is_some() {
        return Err(Error::Invalid(format!(
            "cloud credential {cred_id} was revoked; create a new one"
        )));
    }
    let want = provider_for(blueprint.substrate);
    if cred.provider != want {
        return Err(Error::Invalid(format!(
            "blueprint {} takes a `{want}` cloud credential, and {cred_id} is `{}`",
            blueprint.label(),
            cred.provider
        )));
    }
    // The substrate must be usable before anything is stored.
    broker.substrate(blueprint)?;
    if blueprint.class == Class::Machine {
        if broker.config.public_url.is_none() {
            return Err(Error::Unavailable(
                "machines need to reach this server, and it has no public URL; start it with --public-url".into(),
            ));
        }
        if broker.config.ca_pem.is_none() {
            return Err(Error::Unavailable(
                "machines must trust this server's CA, and it knows none (<data-dir>/tls/ca.crt is missing)".into(),
            ));
        }
    }
    let now = st.now();
    let resource = Resource::new(
        Uuid::now_v7(),
        project_id,
        req.kind,
        req.blueprint_version_id,
        cred_id,
        admitted.parameters,
        now,
    );
    let row = ResourceRow {
        resource,
        token_id: None,
        composite: None,
        provisioned_at: None,
        version: 1,
        updated_at: store::unix(now),
    };
    resources::insert(&mut c, &row).await?;
    tracing::info!(resource_id = %row.resource.id, project_id = %project_id, blueprint = %blueprint.label(), operator = %op.id, "resource accepted");
    let detail = serde_json::json!({"project_id": project_id, "kind": row.resource.kind, "blueprint": blueprint.label(), "cloud_credential_id": cred_id});
    st.audit_in_project(
        project_id,
        super::audit_record::by(
            &op,
            None,
            "resource.create",
            format!("resource/{}", row.resource.id),
            detail,
        ),
    )
    .await;
    broker.wake();
    Ok((StatusCode::ACCEPTED, Json(row.resource)))
}

pub(crate) async fn list_resources(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(project_id): UuidPath,
) -> Result<Json<List<Resource>>, Error> {
    let mut c = st.store.acquire().await?;
    require_project(&mut c, &op, project_id).await?;
    let items = resources::list_for_project(&mut c, project_id)
        .await?
        .into_iter()
        .map(|r| r.resource)
        .collect();
    Ok(Json(List { items }))
}

fn no_resource(id: Uuid) -> Error {
    Error::NotFound(format!("no resource with id {id}"))
}

pub(crate) async fn get_resource(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(id): UuidPath,
) -> Result<Json<Resource>, Error> {
    let row = resources::get(&mut *st.store.acquire().await?, id)
        .await?
        .ok_or_else(|| no_resource(id))?;
    op.require(row.resource.project_id, || no_resource(id))?;
    Ok(Json(row.resource))
}

/// `DELETE /v1/resources/{id}`: 202 with the resource in Deprovisioning (or unchanged when
/// already deleting or deleted).
pub(crate) async fn delete_resource(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(id): UuidPath,
) -> Result<(StatusCode, Json<Resource>), Error> {
    let mut c = st.store.acquire().await?;
    for _ in 0..store::MAX_ATTEMPTS {
        let mut row = resources::get(&mut c, id)
            .await?
            .ok_or_else(|| no_resource(id))?;
        op.require(row.resource.project_id, || no_resource(id))?;
        let class = st
            .broker
            .config
            .catalog
            .get(&row.resource.blueprint_version_id)
            .map_or(Class::Standalone, |e| e.blueprint.class);
        let now = st.now();
        match row
            .resource
            .observe(class, &Observation::DeleteRequested, now)
        {
            Outcome::Ignored { .. } => return Ok((StatusCode::ACCEPTED, Json(row.resource))),
            Outcome::Moved { from, to } => {
                if resources::update(&mut c, &mut row, store::unix(now)).await? {
                    st.metrics.transition(from.as_str(), to.as_str());
                    tracing::info!(resource_id = %id, operator = %op.id, "resource delete requested");
                    let project = row.resource.project_id;
                    let detail = serde_json::json!({"project_id": project, "from": from.as_str()});
                    st.audit_in_project(
                        project,
                        super::audit_record::by(
                            &op,
                            None,
                            "resource.delete",
                            format!("resource/{id}"),
                            detail,
                        ),
                    )
                    .await;
                    st.broker.wake();
                    return Ok((StatusCode::ACCEPTED, Json(row.resource)));
                }
            }
        }
    }
    Err(Error::Conflict(format!(
        "resource {id} kept changing while the delete was recorded; retry"
    )))
}
