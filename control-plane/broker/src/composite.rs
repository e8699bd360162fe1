//! The composite: the one object the broker hands a substrate for a resource, in the shape of a
//! Kubernetes object (`apiVersion`, `kind`, `metadata`, `spec`) whatever the substrate.
//!
//! It is named after the resource (`pr-<resource id>`), sits in the Project's namespace
//! (`plexsphere-project-<project id>`), carries labels naming the Project, the resource and the
//! blueprint version, the resolved parameters, and for a machine the cloud-init document as
//! `spec.userData`. The local substrates read it in-process; [`crate::crossplane`] writes it as
//! YAML for a management cluster.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::blueprint::{Blueprint, Class};
use crate::cloudinit::CloudInitDocument;
use crate::resource::{Resource, project_namespace};

pub const LABEL_PROJECT: &str = "plexsphere.com/project-id";
pub const LABEL_RESOURCE: &str = "plexsphere.com/resource-id";
pub const LABEL_BLUEPRINT: &str = "plexsphere.com/blueprint";
pub const LABEL_BLUEPRINT_VERSION: &str = "plexsphere.com/blueprint-version-id";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
}

/// How a composed cloud object authenticates: the ProviderConfig in the Project namespace made
/// from the cloud credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderConfigRef {
    pub name: String,
}

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompositeSpec {
    pub parameters: Map<String, Value>,
    /// The cloud-init document (machines only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<UserData>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_config_ref: Option<ProviderConfigRef>,
}

impl std::fmt::Debug for CompositeSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompositeSpec")
            .field("parameters", &self.parameters)
            .field("user_data", &self.user_data.as_ref().map(|_| "<redacted>"))
            .field("provider_config_ref", &self.provider_config_ref)
            .finish()
    }
}

/// `spec.userData`: the document text, serialised as a plain string.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UserData(String);

impl UserData {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<CloudInitDocument> for UserData {
    fn from(d: CloudInitDocument) -> Self {
        Self(d.into_string())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Composite {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: CompositeSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompositeError {
    #[error("resource {resource} is a machine ({blueprint}) and needs a cloud-init document")]
    MissingUserData { resource: Uuid, blueprint: String },
    #[error(
        "resource {resource} is standalone ({blueprint}); it boots nothing, so it takes no cloud-init document"
    )]
    UnexpectedUserData { resource: Uuid, blueprint: String },
    #[error(
        "resource {resource} was created from blueprint version {has}, not {given} ({blueprint})"
    )]
    WrongBlueprint {
        resource: Uuid,
        has: Uuid,
        given: Uuid,
        blueprint: String,
    },
}

/// Renders the composite of `resource` from its blueprint. A machine needs `user_data`; a
/// standalone resource refuses one.
pub fn render(
    blueprint: &Blueprint,
    resource: &Resource,
    user_data: Option<CloudInitDocument>,
) -> Result<Composite, CompositeError> {
    if resource.blueprint_version_id != blueprint.version_id() {
        return Err(CompositeError::WrongBlueprint {
            resource: resource.id,
            has: resource.blueprint_version_id,
            given: blueprint.version_id(),
            blueprint: blueprint.label(),
        });
    }
    match (blueprint.class, &user_data) {
        (Class::Machine, None) => {
            return Err(CompositeError::MissingUserData {
                resource: resource.id,
                blueprint: blueprint.label(),
            });
        }
        (Class::Standalone, Some(_)) => {
            return Err(CompositeError::UnexpectedUserData {
                resource: resource.id,
                blueprint: blueprint.label(),
            });
        }
        _ => {}
    }
    let labels = BTreeMap::from([
        (LABEL_MANAGED_BY.to_owned(), "plexsphere".to_owned()),
        (LABEL_PROJECT.to_owned(), resource.project_id.to_string()),
        (LABEL_RESOURCE.to_owned(), resource.id.to_string()),
        (LABEL_BLUEPRINT.to_owned(), blueprint.name.clone()),
        (
            LABEL_BLUEPRINT_VERSION.to_owned(),
            resource.blueprint_version_id.to_string(),
        ),
    ]);
    Ok(Composite {
        api_version: blueprint.composite.api_version.clone(),
        kind: blueprint.composite.kind.clone(),
        metadata: Metadata {
            name: resource.composed_name(),
            namespace: project_namespace(resource.project_id),
            labels,
        },
        spec: CompositeSpec {
            parameters: resource.parameters.clone(),
            user_data: user_data.map(UserData::from),
            provider_config_ref: None,
        },
    })
}
