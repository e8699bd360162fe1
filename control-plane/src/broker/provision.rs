//! What provisioning a resource starts with: for a machine, a single-use bootstrap token bound
//! to the resource and the cloud-init document carrying it and the lab CA; for every resource,
//! the composite handed to its substrate.
//!
//! Tokens are never stored in clear: the composite kept with the resource (YAML) has the token
//! replaced by `cloudinit::REDACTED_TOKEN`, and the real one exists only in memory, handed to
//! the substrate in the same pass. A later pass never mints a second token for a machine that
//! was handed its document; when none was (the server stopped in between), the old token is
//! revoked and the resource prepared again ([`pending_step`]).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plexsphere_broker::cloudinit::{self, CloudInitDocument, MachineBootstrap};
use plexsphere_broker::composite::{self, Composite};
use plexsphere_broker::{Blueprint, Class, Resource, Substrate as SubstrateKind, crossplane};
use plexsphere_wire::secret::{BootstrapToken, TokenKind};
use time::OffsetDateTime;

use super::BrokerHost;
use crate::error::Error;
use crate::store::tokens::TokenRow;
use crate::store::{domains, projects, tokens};

/// A resource's provisioning inputs: what to persist, and what to hand the substrate.
pub(crate) struct Prepared {
    /// The minted token's id (machines).
    pub token_id: Option<String>,
    /// The composite as YAML, to store: a machine's has its token redacted.
    pub composite_yaml: String,
    /// The composite the substrate is handed, in memory only: a machine's carries the real
    /// token (`Composite`'s `Debug` never shows it).
    pub delivered: Composite,
}

/// What a pass does with a `Pending` resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PendingStep {
    /// Nothing stored yet: prepare (mint a machine's token), store, hand over.
    Prepare,
    /// A standalone resource's stored composite holds no secret: hand it over again (the
    /// substrate's provisioning is idempotent).
    HandStored,
    /// The machine was handed its document: nothing to hand, no token to mint.
    AlreadyHanded,
    /// A machine's composite was stored but the substrate holds no machine (the server stopped
    /// before handing it over): revoke the stored token, prepare again.
    Remint,
}

/// Decides a `Pending` pass. `substrate_holds` is asked only of a machine with a stored
/// composite (whether the substrate has its machine).
pub(crate) fn pending_step(
    class: Class,
    stored: bool,
    substrate_holds: impl FnOnce() -> bool,
) -> PendingStep {
    match (stored, class) {
        (false, _) => PendingStep::Prepare,
        (true, Class::Standalone) => PendingStep::HandStored,
        (true, Class::Machine) if substrate_holds() => PendingStep::AlreadyHanded,
        (true, Class::Machine) => PendingStep::Remint,
    }
}

/// A reason to refuse or fail provisioning, as one line.
fn failed(what: impl std::fmt::Display) -> Error {
    Error::Invalid(what.to_string())
}

/// Mints the machine's token (stored hashed, bound to the resource) and renders the composite
/// twice: the one handed to the substrate and the one stored, with the token redacted.
pub(crate) async fn prepare(
    st: &(impl BrokerHost + ?Sized),
    blueprint: &Blueprint,
    resource: &Resource,
    now: OffsetDateTime,
) -> Result<Prepared, Error> {
    let machine = match blueprint.class {
        Class::Standalone => None,
        Class::Machine => Some(machine_document(st, resource, now).await?),
    };
    let render = |user_data: Option<CloudInitDocument>| -> Result<(Composite, String), Error> {
        Ok(match blueprint.substrate {
            SubstrateKind::Crossplane => {
                let c = crossplane::composite(blueprint, resource, user_data).map_err(failed)?;
                let yaml = crossplane::to_yaml(&c).map_err(failed)?;
                (c, yaml)
            }
            SubstrateKind::LocalMachine
            | SubstrateKind::LocalDirectory
            | SubstrateKind::OpenStack => {
                let c = composite::render(blueprint, resource, user_data).map_err(failed)?;
                let yaml = serde_yaml::to_string(&c).map_err(failed)?;
                (c, yaml)
            }
        })
    };
    let Some(m) = machine else {
        let (delivered, composite_yaml) = render(None)?;
        return Ok(Prepared {
            token_id: None,
            composite_yaml,
            delivered,
        });
    };
    let (delivered, _) = render(Some(m.doc))?;
    let (_, composite_yaml) = render(Some(m.stored))?;
    if composite_yaml.contains(m.token.secret.expose()) {
        return Err(Error::Internal(format!(
            "the stored composite of resource {} would hold its bootstrap token; refusing to store it (a broker bug)",
            resource.id
        )));
    }
    Ok(Prepared {
        token_id: Some(m.token.id),
        composite_yaml,
        delivered,
    })
}

/// The stored composite back as an object.
pub(crate) fn parse_composite(yaml: &str) -> Result<Composite, Error> {
    serde_yaml::from_str(yaml)
        .map_err(|e| Error::Internal(format!("the stored composite does not parse: {e}")))
}

/// A machine's freshly minted token and its document, real and redacted.
struct MachineDocument {
    token: BootstrapToken,
    doc: CloudInitDocument,
    stored: CloudInitDocument,
}

async fn machine_document(
    st: &(impl BrokerHost + ?Sized),
    resource: &Resource,
    now: OffsetDateTime,
) -> Result<MachineDocument, Error> {
    let cfg = &st.broker().config;
    let api_url = cfg.public_url.as_deref().ok_or_else(|| {
        failed("this server has no public URL for machines to reach it; start it with --public-url")
    })?;
    let ca_pem = cfg.ca_pem.as_deref().ok_or_else(|| {
        failed(
            "this server knows no lab CA for machines to trust (<data-dir>/tls/ca.crt is missing)",
        )
    })?;
    let mut conn = st.store().acquire().await?;
    let project = projects::get(&mut conn, resource.project_id)
        .await?
        .ok_or_else(|| failed(format!("project {} no longer exists", resource.project_id)))?;
    let domain = domains::get(&mut conn, project.domain_id)
        .await?
        .ok_or_else(|| Error::Internal(format!("project {} names a missing domain", project.id)))?;
    let signer = st.keys().signer(&domain).await?;
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
    let row = TokenRow::issued(
        &token,
        resource.project_id,
        now,
        cfg.token_ttl.as_secs(),
        Some(resource.id),
    );
    tokens::insert(&mut conn, &row).await?;
    tracing::info!(resource_id = %resource.id, token_id = %row.id, "bootstrap token minted for the resource's machine");
    let stored = doc.redacted(&token);
    Ok(MachineDocument { token, doc, stored })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_pass_mints_only_when_no_machine_was_handed_its_document() {
        let never = || -> bool { panic!("the substrate is asked only about a stored machine") };
        assert_eq!(
            pending_step(Class::Machine, false, never),
            PendingStep::Prepare
        );
        assert_eq!(
            pending_step(Class::Standalone, false, never),
            PendingStep::Prepare
        );
        assert_eq!(
            pending_step(Class::Standalone, true, never),
            PendingStep::HandStored
        );
        assert_eq!(
            pending_step(Class::Machine, true, || true),
            PendingStep::AlreadyHanded
        );
        assert_eq!(
            pending_step(Class::Machine, true, || false),
            PendingStep::Remint
        );
    }
}
