//! The Crossplane form of a composite, for blueprints whose substrate is `crossplane` (the
//! sources' `openstack-instance`): the namespaced composite `pr-<resource id>` in
//! `plexsphere-project-<project id>`, with the resolved parameters, the cloud-init document as
//! `spec.userData`, and a reference to the ProviderConfig made from the resource's cloud
//! credential (`cloud-credential-<credential id>` in the same namespace).
//!
//! Only rendering lives here. Applying the YAML to a management cluster (and writing the
//! ProviderConfig from the opened credential) is a later issue; see docs/broker.md.

use crate::blueprint::{Blueprint, Substrate};
use crate::cloudinit::CloudInitDocument;
use crate::composite::{self, Composite, CompositeError, ProviderConfigRef};
use crate::resource::Resource;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CrossplaneError {
    #[error("blueprint {blueprint} runs on the {substrate} substrate, not crossplane")]
    NotCrossplane {
        blueprint: String,
        substrate: &'static str,
    },
    #[error(transparent)]
    Composite(#[from] CompositeError),
    #[error("cannot serialise composite {name}: {reason}")]
    Serialize { name: String, reason: String },
}

/// The name of the ProviderConfig made from a cloud credential.
pub fn provider_config_name(credential_id: uuid::Uuid) -> String {
    format!("cloud-credential-{credential_id}")
}

/// Renders the composite with its credential reference.
pub fn composite(
    blueprint: &Blueprint,
    resource: &Resource,
    user_data: Option<CloudInitDocument>,
) -> Result<Composite, CrossplaneError> {
    if blueprint.substrate != Substrate::Crossplane {
        return Err(CrossplaneError::NotCrossplane {
            blueprint: blueprint.label(),
            substrate: blueprint.substrate.as_str(),
        });
    }
    let mut c = composite::render(blueprint, resource, user_data)?;
    c.spec.provider_config_ref = Some(ProviderConfigRef {
        name: provider_config_name(resource.cloud_credential_id),
    });
    Ok(c)
}

/// The composite as a YAML manifest (`kubectl apply -f` ready). It may hold a bootstrap token
/// in `spec.userData`: treat the text as a secret.
pub fn to_yaml(c: &Composite) -> Result<String, CrossplaneError> {
    let body = serde_yaml::to_string(c).map_err(|e| CrossplaneError::Serialize {
        name: c.metadata.name.clone(),
        reason: e.to_string(),
    })?;
    Ok(format!(
        "# Rendered by the plexsphere broker for resource {}. spec.userData holds a single-use\n# bootstrap token: treat this manifest as a secret.\n{body}",
        c.metadata.name
    ))
}
