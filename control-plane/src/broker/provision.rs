//! What provisioning a resource starts with: for a machine, a single-use bootstrap token bound
//! to the resource and the cloud-init document carrying it and the lab CA; for every resource,
//! the composite handed to its substrate, kept with the resource as YAML so a later pass (or a
//! restarted server) hands the substrate the same document without minting another token.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plexsphere_broker::cloudinit::{self, MachineBootstrap};
use plexsphere_broker::composite::{self, Composite};
use plexsphere_broker::{Blueprint, Class, Resource, Substrate as SubstrateKind, crossplane};
use plexsphere_wire::secret::{BootstrapToken, TokenKind};
use time::OffsetDateTime;

use crate::api::AppState;
use crate::error::Error;
use crate::store::tokens::TokenRow;
use crate::store::{self, StoreError, domains, projects, tokens};

/// A resource's provisioning inputs, ready to persist.
pub struct Prepared {
    /// The minted token's id (machines).
    pub token_id: Option<String>,
    /// The composite as YAML (it may hold the token: a secret).
    pub composite_yaml: String,
}

/// A reason to refuse or fail provisioning, as one line.
fn failed(what: impl std::fmt::Display) -> Error {
    Error::Invalid(what.to_string())
}

/// Mints the machine's token (stored, bound to the resource) and renders the composite.
pub async fn prepare(
    st: &AppState,
    blueprint: &Blueprint,
    resource: &Resource,
    now: OffsetDateTime,
) -> Result<Prepared, Error> {
    let (token_id, user_data) = match blueprint.class {
        Class::Standalone => (None, None),
        Class::Machine => {
            let (id, doc) = machine_document(st, resource, now).await?;
            (Some(id), Some(doc))
        }
    };
    let composite_yaml = match blueprint.substrate {
        SubstrateKind::Crossplane => {
            let c = crossplane::composite(blueprint, resource, user_data).map_err(failed)?;
            crossplane::to_yaml(&c).map_err(failed)?
        }
        _ => {
            let c = composite::render(blueprint, resource, user_data).map_err(failed)?;
            serde_yaml::to_string(&c).map_err(failed)?
        }
    };
    Ok(Prepared {
        token_id,
        composite_yaml,
    })
}

/// The stored composite back as an object.
pub fn parse_composite(yaml: &str) -> Result<Composite, Error> {
    serde_yaml::from_str(yaml)
        .map_err(|e| Error::Internal(format!("the stored composite does not parse: {e}")))
}

async fn machine_document(
    st: &AppState,
    resource: &Resource,
    now: OffsetDateTime,
) -> Result<(String, cloudinit::CloudInitDocument), Error> {
    let cfg = &st.broker.config;
    let api_url = cfg.public_url.as_deref().ok_or_else(|| {
        failed("this server has no public URL for machines to reach it; start it with --public-url")
    })?;
    let ca_pem = cfg.ca_pem.as_deref().ok_or_else(|| {
        failed(
            "this server knows no lab CA for machines to trust (<data-dir>/tls/ca.crt is missing)",
        )
    })?;
    let mut conn = st.store.pool().acquire().await.map_err(StoreError::from)?;
    let project = projects::get(&mut conn, resource.project_id)
        .await?
        .ok_or_else(|| failed(format!("project {} no longer exists", resource.project_id)))?;
    let domain = domains::get(&mut conn, project.domain_id)
        .await?
        .ok_or_else(|| Error::Internal(format!("project {} names a missing domain", project.id)))?;
    let signer = st.keys.signer(&domain.slug)?;
    let signing_key: Option<[u8; 32]> = STANDARD
        .decode(signer.public_key_b64())
        .ok()
        .and_then(|k| k.try_into().ok());

    let token = BootstrapToken::generate(&cfg.token_env_prefix, TokenKind::Node)
        .map_err(|e| Error::Internal(format!("cannot mint a bootstrap token: {e}")))?;
    let handle = resource.composed_name();
    let doc = cloudinit::render(&MachineBootstrap {
        api_url,
        ca_pem,
        bootstrap_token: &token,
        project_id: resource.project_id,
        resource_handle: &handle,
        domain_signing_public_key: signing_key,
    })
    .map_err(failed)?;
    let ttl = i64::try_from(cfg.token_ttl.as_secs()).unwrap_or(i64::MAX);
    let row = TokenRow {
        id: token.id.clone(),
        project_id: resource.project_id,
        kind: TokenKind::Node.as_str().to_owned(),
        env_prefix: cfg.token_env_prefix.clone(),
        secret_sha256: hex::encode(token.secret.digest()),
        created_at: store::unix(now),
        expires_at: store::unix(now).saturating_add(ttl),
        consumed_at: None,
        consumed_by_node: None,
        revoked_at: None,
        resource_id: Some(resource.id),
    };
    tokens::insert(&mut conn, &row).await?;
    tracing::info!(resource_id = %resource.id, token_id = %row.id, "bootstrap token minted for the resource's machine");
    Ok((row.id, doc))
}
