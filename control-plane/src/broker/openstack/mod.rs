//! `openstack` (the `openstack-instance@v1beta1` blueprint): Nova servers made through the
//! cloud's own API with the resource's cloud credential, no Crossplane in between.
//!
//! - `credential`: the credential payload (Keystone v3 URL, application credential or
//!   password, region, interface, CA) and its strict parsing;
//! - `keystone`: the sign-in body and the catalog's endpoints; `session`: one signed-in
//!   cloud (token cached until 5 minutes before expiry, a 401 signs in again once);
//! - `lookup`: image (Glance), flavor (Nova) and network (Neutron) by name or id;
//! - `compute`: the server's create body, finding it again by name and metadata, deleting it,
//!   its status as observations; `error`: answers as lines an operator can act on;
//! - `http`: the client with its bounds (connect 5 s, request 30 s, bodies 4 MiB).
//!
//! A server is named `pr-<resource id>` and carries the metadata `plexsphere-resource-id`,
//! `plexsphere-project-id` and `plexsphere-blueprint-version-id`; provisioning first looks for
//! it by both, so a broker stopped between the create call and its write never makes a second.
//! Facts: BUILD -> SubstrateAccepted; ACTIVE -> SubstrateAccepted, MachineBooted; ERROR ->
//! SubstrateFailed with Nova's fault; SHUTOFF and other stopped states -> SubstrateFailed;
//! no server (or DELETED) -> gone.
//!
//! The trait's methods block: each runs its calls on the tokio runtime of the thread it is
//! called on (the reconcile loop calls from `spawn_blocking`), and answers `Unreachable`
//! outside one.

mod compute;
pub(crate) mod credential;
mod error;
mod http;
mod keystone;
mod lookup;
mod session;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};

use plexsphere_broker::composite::Composite;
use plexsphere_broker::{Observation, Phase, Resource};

pub(crate) use credential::parse;
use lookup::Kind;
use session::Session;

// The test and operations surface: the substrate is driven directly by
// control-plane/tests/openstack_substrate.rs against a real cloud.
pub use super::substrate::{Substrate, SubstrateError, Target};

/// How many cloud credentials' sessions (client and token) are kept; past it they are all
/// dropped and the next calls sign in again. A rotated credential is a new payload, so old
/// ones would otherwise pile up.
pub const MAX_SESSIONS: usize = 64;

/// The `openstack` substrate.
pub struct OpenStack {
    sessions: Mutex<HashMap<[u8; 32], Arc<Session>>>,
}

impl Default for OpenStack {
    fn default() -> Self {
        Self::new()
    }
}

impl OpenStack {
    pub fn new() -> Self {
        Self {
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// The session of the target's credential, keyed by the SHA-256 of its payload.
    fn session(&self, target: &Target) -> Result<Arc<Session>, SubstrateError> {
        let bytes = target.credential.expose();
        let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = sessions.get(&key) {
            return Ok(s.clone());
        }
        let cred = parse(bytes).map_err(|e| {
            SubstrateError::Failed(format!(
                "the resource's cloud credential {} is not a usable OpenStack credential: {e}; create a correct one and rotate it with `plexctl cloud-credential rotate`",
                target.resource.cloud_credential_id
            ))
        })?;
        let cloud = cred.auth_url.clone();
        let session = Arc::new(Session::new(cred).map_err(|e| {
            SubstrateError::Failed(format!(
                "cannot set up the client for the cloud {cloud}: {e}; fix the credential's ca_pem"
            ))
        })?);
        if sessions.len() >= MAX_SESSIONS {
            sessions.clear();
        }
        sessions.insert(key, session.clone());
        Ok(session)
    }
}

/// Runs the calls on the runtime of this (blocking) thread.
fn block_on<T>(
    calls: impl Future<Output = Result<T, SubstrateError>>,
) -> Result<T, SubstrateError> {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => runtime.block_on(calls),
        Err(_) => Err(SubstrateError::Unreachable(
            "the OpenStack substrate was called outside a tokio runtime (a broker bug); nothing was asked".to_owned(),
        )),
    }
}

/// A string parameter of the composite, if set.
fn text_param<'a>(composite: &'a Composite, name: &str) -> Option<&'a str> {
    composite
        .spec
        .parameters
        .get(name)
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
}

fn required_param<'a>(composite: &'a Composite, name: &str) -> Result<&'a str, SubstrateError> {
    text_param(composite, name).ok_or_else(|| {
        SubstrateError::Failed(format!(
            "the composite has no {name}; the blueprint requires it (a broker bug if the resource was admitted)"
        ))
    })
}

fn metadata(resource: &Resource) -> BTreeMap<String, String> {
    BTreeMap::from([
        (compute::META_RESOURCE.to_owned(), resource.id.to_string()),
        (
            compute::META_PROJECT.to_owned(),
            resource.project_id.to_string(),
        ),
        (
            compute::META_BLUEPRINT_VERSION.to_owned(),
            resource.blueprint_version_id.to_string(),
        ),
    ])
}

impl Substrate for OpenStack {
    fn name(&self) -> &'static str {
        "openstack"
    }

    fn provision(&self, target: &Target, composite: &Composite) -> Result<(), SubstrateError> {
        let resource = &target.resource;
        let name = resource.composed_name();
        // Checked before any call: a document Nova would refuse fails the resource here.
        let document = composite.spec.user_data.as_ref().ok_or_else(|| {
            SubstrateError::Failed(format!(
                "the composite of {name} carries no cloud-init document (a broker bug)"
            ))
        })?;
        let user_data = compute::user_data(document.as_str()).map_err(SubstrateError::Failed)?;
        let image = required_param(composite, "imageName")?;
        let flavor = required_param(composite, "flavorName")?;
        let network = required_param(composite, "networkName")?;
        let session = self.session(target)?;
        let resource_id = resource.id.to_string();
        block_on(async {
            let existing = compute::find(&session, &name, &resource_id).await?;
            if let Some(s) = existing.first() {
                tracing::info!(resource_id = %resource.id, server_id = %s.id, status = %s.status, "the resource's server already exists; not creating another");
                return Ok(());
            }
            let placement = compute::Placement {
                image_id: lookup::find(&session, Kind::Image, image).await?,
                flavor_id: lookup::find(&session, Kind::Flavor, flavor).await?,
                network_id: lookup::find(&session, Kind::Network, network).await?,
                key_name: text_param(composite, "keyName").map(str::to_owned),
                config_drive: composite
                    .spec
                    .parameters
                    .get("configDrive")
                    .and_then(|v| v.as_bool())
                    .unwrap_or(false),
                availability_zone: text_param(composite, "availabilityZone").map(str::to_owned),
            };
            let body = compute::create_body(&name, &metadata(resource), &user_data, &placement);
            let server_id = compute::create(&session, &name, &body).await?;
            tracing::info!(resource_id = %resource.id, server_id, cloud = session.cloud(), "OpenStack server created");
            Ok(())
        })
    }

    fn observe(&self, target: &Target) -> Result<Vec<Observation>, SubstrateError> {
        let resource = &target.resource;
        let session = self.session(target)?;
        let deleting = resource.provisioning.phase == Phase::Deprovisioning;
        let server = block_on(async {
            let servers = compute::find(
                &session,
                &resource.composed_name(),
                &resource.id.to_string(),
            )
            .await?;
            let Some(server) = servers.into_iter().next() else {
                return Ok(None);
            };
            // Nova's list leaves out the fault of a server in ERROR; the server itself has it.
            if server.status == "ERROR" && server.fault.is_none() && !deleting {
                return Ok(compute::show(&session, &server.id).await?.or(Some(server)));
            }
            Ok(Some(server))
        })?;
        let Some(server) = server else {
            return Ok(Vec::new());
        };
        Ok(compute::observations(&server, deleting, session.cloud())
            .unwrap_or_else(|reason| vec![Observation::SubstrateFailed { reason }]))
    }

    fn deprovision(&self, target: &Target) -> Result<(), SubstrateError> {
        let resource = &target.resource;
        let session = self.session(target)?;
        block_on(async {
            let servers = compute::find(
                &session,
                &resource.composed_name(),
                &resource.id.to_string(),
            )
            .await?;
            for server in &servers {
                compute::delete(&session, server).await?;
                tracing::info!(resource_id = %resource.id, server_id = %server.id, "OpenStack server delete requested");
            }
            Ok(())
        })
    }

    fn gone(&self, target: &Target) -> Result<bool, SubstrateError> {
        let resource = &target.resource;
        let session = self.session(target)?;
        let servers = block_on(compute::find(
            &session,
            &resource.composed_name(),
            &resource.id.to_string(),
        ))?;
        Ok(servers.is_empty())
    }
}

#[cfg(test)]
#[path = "substrate_tests.rs"]
mod tests;
