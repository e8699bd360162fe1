//! The substrates behind one interface. Every method blocks (host tools, the file system), so
//! the reconcile loop calls them on a blocking thread. Each is idempotent: the loop may ask
//! again after a restart or a lost race.

use std::path::PathBuf;

use plexsphere_broker::composite::Composite;
use plexsphere_broker::credentials::CredentialPayload;
use plexsphere_broker::{Observation, Phase, Resource};

/// Why a substrate call did not succeed, one line for the resource's history or the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubstrateError {
    /// The substrate refused or broke: the resource fails with this reason.
    #[error("{0}")]
    Failed(String),
    /// The substrate cannot be asked now (its API is down, slow or overloaded): nothing is
    /// concluded, the phase stays, and the next pass asks again.
    #[error("{0}")]
    Unreachable(String),
}

/// What a substrate call is about: the resource, and the cloud credential it was created with,
/// opened (a cloud signs in with it; the local substrates ignore it). Its `Debug` never shows
/// the credential.
#[derive(Debug, Clone)]
pub struct Target {
    pub resource: Resource,
    pub credential: CredentialPayload,
}

/// Where resources are made.
pub trait Substrate: Send + Sync + 'static {
    /// The substrate's name as blueprints spell it.
    fn name(&self) -> &'static str;
    /// Makes the resource from its rendered composite (a machine's carries the cloud-init
    /// document as user data). `Ok` means the substrate accepted it.
    fn provision(&self, target: &Target, composite: &Composite) -> Result<(), SubstrateError>;
    /// What the substrate shows about the resource now, as observations. The phase machine
    /// ignores those that do not apply, so report every current fact.
    fn observe(&self, target: &Target) -> Result<Vec<Observation>, SubstrateError>;
    /// Starts removing the resource.
    fn deprovision(&self, target: &Target) -> Result<(), SubstrateError>;
    /// Whether the resource no longer exists on the substrate.
    fn gone(&self, target: &Target) -> Result<bool, SubstrateError>;
}

/// `local-directory` (the `local-bucket` blueprint): `<root>/pr-<resource id>/`.
pub(crate) struct LocalDirectory {
    root: PathBuf,
}

impl LocalDirectory {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    pub(crate) fn dir(&self, resource: &Resource) -> PathBuf {
        self.root.join(resource.composed_name())
    }
}

impl Substrate for LocalDirectory {
    fn name(&self) -> &'static str {
        "local-directory"
    }

    fn provision(&self, target: &Target, _composite: &Composite) -> Result<(), SubstrateError> {
        let resource = &target.resource;
        let dir = self.dir(resource);
        std::fs::create_dir_all(&dir).map_err(|e| {
            SubstrateError::Failed(format!(
                "cannot create the bucket directory {}: {e}",
                dir.display()
            ))
        })?;
        tracing::info!(resource_id = %resource.id, dir = %dir.display(), "local bucket directory created");
        Ok(())
    }

    fn observe(&self, target: &Target) -> Result<Vec<Observation>, SubstrateError> {
        if self.dir(&target.resource).is_dir() {
            Ok(vec![
                Observation::SubstrateAccepted,
                Observation::SubstrateReady,
            ])
        } else {
            Ok(Vec::new())
        }
    }

    fn deprovision(&self, target: &Target) -> Result<(), SubstrateError> {
        let resource = &target.resource;
        let dir = self.dir(resource);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                tracing::info!(resource_id = %resource.id, dir = %dir.display(), "local bucket directory removed");
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(SubstrateError::Failed(format!(
                "cannot remove the bucket directory {}: {e}",
                dir.display()
            ))),
        }
    }

    fn gone(&self, target: &Target) -> Result<bool, SubstrateError> {
        let resource = &target.resource;
        match std::fs::symlink_metadata(self.dir(resource)) {
            Ok(_) => Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
            Err(e) => Err(SubstrateError::Failed(format!(
                "cannot look at the bucket directory of {}: {e}",
                resource.composed_name()
            ))),
        }
    }
}

/// `crossplane` (`openstack-instance`): the composite is rendered and stored with the resource;
/// applying it to a management cluster is a later issue. The substrate accepts it (the
/// resource shows Provisioning) and holds nothing, so a delete finds it gone at once.
pub(crate) struct Crossplane;

impl Substrate for Crossplane {
    fn name(&self) -> &'static str {
        "crossplane"
    }

    fn provision(&self, target: &Target, composite: &Composite) -> Result<(), SubstrateError> {
        tracing::info!(
            resource_id = %target.resource.id,
            composite = %composite.metadata.name,
            namespace = %composite.metadata.namespace,
            kind = %composite.kind,
            "crossplane composite rendered and stored with the resource; no management cluster is configured, so it is not applied (a later issue)"
        );
        Ok(())
    }

    fn observe(&self, _target: &Target) -> Result<Vec<Observation>, SubstrateError> {
        Ok(vec![Observation::SubstrateAccepted])
    }

    fn deprovision(&self, _target: &Target) -> Result<(), SubstrateError> {
        Ok(())
    }

    fn gone(&self, target: &Target) -> Result<bool, SubstrateError> {
        Ok(target.resource.provisioning.phase == Phase::Deprovisioning)
    }
}
