//! `local-machine`: systemd-nspawn machines on the control plane's own host, over
//! `plexsphere-nspawn` (root only). A machine is named `pr-<last 9 of the resource id>`, sits
//! on the host bridge (default `plexbr0`, 172.30.231.1/24) and boots with the resource's
//! cloud-init document as its NoCloud user-data. The machine reaches the control plane on the
//! bridge address, so the server must listen there: `plexsphere dev --listen
//! 172.30.231.1:8443`, or `--listen 0.0.0.0:8443 --san 172.30.231.1 --public-url
//! https://172.30.231.1:8443`.
//!
//! Parameters: `arch` must be the host's; `release` must be the base image's suite (bookworm,
//! the only image built). The machine has no memory limit: the host has no systemd to set one,
//! so the blueprint declares none.
//!
//! Facts: started -> SubstrateAccepted; booted -> MachineBooted; cloud-init error -> JoinFailed
//! when `plexd join` left its result file (`cloudinit::JOIN_RESULT_PATH`, read inside the
//! machine), else CloudInitFailed; gone -> SubstrateGone. The base image is built once
//! (debootstrap, about a minute) on the first machine and cached.

mod decide;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use ipnet::Ipv4Net;
use plexsphere_broker::cloudinit::JOIN_RESULT_PATH;
use plexsphere_broker::composite::Composite;
use plexsphere_broker::{Observation, Phase};
use plexsphere_nspawn::{
    BaseImage, Bridge, CloudInitStatus, Error as NspawnError, Life, Machine, MachineSpec,
    NoCloudSeed, Recipe,
};

use super::substrate::{Substrate, SubstrateError, Target};
pub(crate) use decide::{
    JOIN_RESULT_MAX_BYTES, check_parameters, free_host, host_arch, machine_name, parse_join_result,
};

/// The local machines' knobs.
#[derive(Debug, Clone)]
pub(crate) struct LocalMachineConfig {
    /// Machines live in `<state_dir>/machines/<name>/`.
    pub state_dir: PathBuf,
    /// Where the Debian base image is cached.
    pub image_cache: PathBuf,
    pub bridge: String,
    /// The bridge's host address with the machines' prefix.
    pub bridge_address: Ipv4Net,
}

pub(crate) struct LocalMachine {
    config: LocalMachineConfig,
    image: Mutex<Option<BaseImage>>,
}

fn err(e: impl std::fmt::Display) -> SubstrateError {
    SubstrateError::Failed(e.to_string())
}

/// The bound on reading the join result inside a machine.
const JOIN_RESULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why cloud-init failed, as precisely as the machine tells: `plexd join`'s exit and message
/// when its result file is there and parses, else cloud-init's own detail.
fn cloud_init_failure(machine: &Machine, detail: String) -> Observation {
    match machine.read_file(JOIN_RESULT_PATH, JOIN_RESULT_MAX_BYTES, JOIN_RESULT_TIMEOUT) {
        Ok(Some(bytes)) => match parse_join_result(&bytes) {
            Some(obs) => return obs,
            None => {
                tracing::warn!(
                    machine = machine.name(),
                    path = JOIN_RESULT_PATH,
                    "the join result file in the machine is not plexd's JSON; reporting cloud-init's error"
                )
            }
        },
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(machine = machine.name(), path = JOIN_RESULT_PATH, error = %e, "cannot read the join result in the machine; reporting cloud-init's error")
        }
    }
    Observation::CloudInitFailed { detail }
}

impl LocalMachine {
    /// Checks that this host can run machines (root, the tools, TUN) and makes the bridge
    /// (so the server can listen on its address); says why not.
    pub fn new(config: LocalMachineConfig) -> Result<Self, String> {
        plexsphere_nspawn::preflight().map_err(|e| e.to_string())?;
        Bridge::ensure(&config.bridge, config.bridge_address).map_err(|e| e.to_string())?;
        Ok(Self {
            config,
            image: Mutex::new(None),
        })
    }

    fn find(&self, name: &str) -> Result<Option<Machine>, SubstrateError> {
        match Machine::reattach(&self.config.state_dir, name) {
            Ok(m) => Ok(Some(m)),
            Err(NspawnError::MachineNotFound { .. }) => Ok(None),
            Err(e) => Err(err(e)),
        }
    }

    fn image(&self) -> Result<BaseImage, SubstrateError> {
        let mut slot = self.image.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = slot.as_ref() {
            return Ok(i.clone());
        }
        tracing::info!(cache = %self.config.image_cache.display(), "preparing the machines' base image (built once, about a minute)");
        let image = BaseImage::ensure(&self.config.image_cache).map_err(err)?;
        *slot = Some(image.clone());
        Ok(image)
    }

    fn used_hosts(&self) -> Result<BTreeSet<u32>, SubstrateError> {
        let net = u32::from(self.config.bridge_address.network());
        let mut used = BTreeSet::new();
        for name in Machine::list(&self.config.state_dir).map_err(err)? {
            if let Some(m) = self.find(&name)? {
                used.insert(u32::from(m.address().addr()).wrapping_sub(net));
            }
        }
        Ok(used)
    }
}

impl Substrate for LocalMachine {
    fn name(&self) -> &'static str {
        "local-machine"
    }

    fn provision(&self, target: &Target, composite: &Composite) -> Result<(), SubstrateError> {
        let resource = &target.resource;
        let name = machine_name(resource);
        if self.find(&name)?.is_some() {
            return Ok(());
        }
        check_parameters(resource, host_arch(), &Recipe::bookworm().suite)?;
        let user_data = composite
            .spec
            .user_data
            .as_ref()
            .ok_or_else(|| {
                SubstrateError::Failed("the composite carries no cloud-init document".into())
            })?
            .as_str()
            .to_owned();
        let bridge =
            Bridge::ensure(&self.config.bridge, self.config.bridge_address).map_err(err)?;
        let image = self.image()?;
        let host = free_host(&self.used_hosts()?, bridge.address()).ok_or_else(|| {
            SubstrateError::Failed(format!(
                "no free address is left on bridge {}",
                bridge.name()
            ))
        })?;
        let address = bridge.machine_address(host).ok_or_else(|| {
            SubstrateError::Failed(format!("no address {host} on bridge {}", bridge.name()))
        })?;
        let machine = Machine::create(
            &self.config.state_dir,
            MachineSpec {
                name: name.clone(),
                image,
                bridge: bridge.name().to_owned(),
                address,
                gateway: bridge.host_address(),
                seed: NoCloudSeed {
                    instance_id: resource.id.to_string(),
                    user_data,
                },
                files: Vec::new(),
            },
        )
        .map_err(err)?;
        tracing::info!(resource_id = %resource.id, machine = %name, address = %machine.address(), "local machine started");
        Ok(())
    }

    fn observe(&self, target: &Target) -> Result<Vec<Observation>, SubstrateError> {
        let resource = &target.resource;
        let Some(machine) = self.find(&machine_name(resource))? else {
            return Ok(Vec::new());
        };
        let deleting = resource.provisioning.phase == Phase::Deprovisioning;
        Ok(match machine.observe().map_err(err)? {
            Life::Starting { .. } => vec![Observation::SubstrateAccepted],
            Life::Booted { cloud_init, .. } => {
                let mut facts = vec![Observation::SubstrateAccepted, Observation::MachineBooted];
                if let CloudInitStatus::Error { detail } = cloud_init {
                    facts.push(cloud_init_failure(&machine, detail));
                }
                facts
            }
            Life::Stopped if !deleting => vec![Observation::SubstrateFailed {
                reason: format!(
                    "machine {} stopped (its console log is {})",
                    machine.name(),
                    machine.console_path().display()
                ),
            }],
            Life::Stopped | Life::Gone => Vec::new(),
        })
    }

    fn deprovision(&self, target: &Target) -> Result<(), SubstrateError> {
        let resource = &target.resource;
        if let Some(machine) = self.find(&machine_name(resource))? {
            machine.destroy().map_err(err)?;
        }
        Ok(())
    }

    fn gone(&self, target: &Target) -> Result<bool, SubstrateError> {
        let resource = &target.resource;
        Ok(self.find(&machine_name(resource))?.is_none())
    }
}
