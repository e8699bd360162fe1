//! A control plane with local machines, as the broker tests need it: `plexsphere dev` on a
//! host address of its own machine bridge, a `local` cloud credential and the `local-machine`
//! blueprint's version. Dropping it stops the control plane, then destroys the machines it
//! left (it is killed, not asked to deprovision) and removes the bridge, however the test ends.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plexsphere_test_support::machines::Leftovers;

use std::process::Output;

use crate::{ControlPlane, OPENSTACK_PROJECT};

pub struct BrokerLab {
    /// Declared before the clean-up: fields drop in order, so the server stops first.
    pub cp: ControlPlane,
    /// The id of the `local` cloud credential.
    cred: String,
    /// The `local-machine` blueprint's version id.
    version: String,
    /// The machines the broker left and its bridge, removed after the server stopped.
    _cleanup: Leftovers,
}

impl BrokerLab {
    /// Starts `plexsphere dev` in `data_dir` on `host_ip` (a /24 of its own on `bridge`).
    pub fn start(data_dir: &Path, bridge: &str, host_ip: &str) -> Result<Self> {
        let cleanup = Leftovers::new(data_dir.join("nspawn"), bridge);
        let cp = ControlPlane::start_dev_with_machines(
            data_dir,
            &format!("{host_ip}:0"),
            &[
                "--san",
                host_ip,
                "--machine-bridge",
                bridge,
                "--machine-bridge-address",
                &format!("{host_ip}/24"),
                "--reconcile-secs",
                "1",
            ],
        )?;
        let cred = json(&cp.plexctl_ok(&[
            "cloud-credential",
            "create",
            "--name",
            "local",
            "--provider",
            "local",
            "--output",
            "json",
        ])?)?;
        let cred = cred["id"]
            .as_str()
            .context("the created credential has no id")?
            .to_owned();
        let blueprints = json(&cp.plexctl_ok(&["blueprint", "list", "--output", "json"])?)?;
        let version = blueprints
            .as_array()
            .and_then(|a| a.iter().find(|b| b["name"] == "local-machine"))
            .and_then(|b| b["version_id"].as_str())
            .context("no local-machine blueprint in `blueprint list`")?
            .to_owned();
        Ok(Self {
            cp,
            cred,
            version,
            _cleanup: cleanup,
        })
    }
}

impl BrokerLab {
    /// `plexctl resource create --output json` of a `local-machine` node in the `openstack`
    /// Project with these parameters (JSON) and `extra` flags (e.g. `--wait`).
    pub fn create(&self, parameters: &str, extra: &[&str]) -> Result<Output> {
        create_node(&self.cp, &self.version, &self.cred, parameters, extra)
    }

    /// [`delete_resource`] with a 5-minute bound: the resource, Deleted.
    pub fn delete(&self, resource_id: &str) -> Result<serde_json::Value> {
        delete_resource(&self.cp, resource_id, "5m")
    }

    /// The running machine of a resource.
    pub fn machine(&self, resource_id: &str) -> Result<plexsphere_nspawn::Machine> {
        let name = machine_name(resource_id);
        plexsphere_nspawn::Machine::reattach(&self.cp.data_dir.join("nspawn"), &name)
            .with_context(|| format!("machine {name} of resource {resource_id}"))
    }

    /// Where the local substrate keeps the machine of a resource.
    pub fn machine_dir(&self, resource_id: &str) -> PathBuf {
        self.cp
            .data_dir
            .join("nspawn/machines")
            .join(machine_name(resource_id))
    }
}

/// `plexctl resource delete --yes --wait --timeout <timeout>` (a plexctl duration, e.g. `4m`),
/// then the resource as `resource get` shows it, which must be Deleted with Deprovisioning
/// right before it in its history.
pub fn delete_resource(
    cp: &ControlPlane,
    resource_id: &str,
    timeout: &str,
) -> Result<serde_json::Value> {
    let out = cp.plexctl(&[
        "resource",
        "delete",
        resource_id,
        "--yes",
        "--wait",
        "--timeout",
        timeout,
    ])?;
    anyhow::ensure!(
        out.status.success(),
        "plexctl resource delete {resource_id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = json(&cp.plexctl_ok(&["resource", "get", resource_id, "--output", "json"])?)?;
    let phases: Vec<&str> = r["provisioning"]["history"]
        .as_array()
        .map(|h| h.iter().filter_map(|p| p["phase"].as_str()).collect())
        .unwrap_or_default();
    anyhow::ensure!(
        phases.ends_with(&["Deprovisioning", "Deleted"]) && r["provisioning"]["phase"] == "Deleted",
        "resource {resource_id} is not Deleted after Deprovisioning once its delete returned: {r}"
    );
    Ok(r)
}

/// `plexctl resource create --output json` of a node in the `openstack` Project from the
/// blueprint version `version` with the credential `cred`, these parameters (JSON) and `extra`
/// flags (e.g. `--wait`).
pub fn create_node(
    cp: &ControlPlane,
    version: &str,
    cred: &str,
    parameters: &str,
    extra: &[&str],
) -> Result<Output> {
    let mut args = vec![
        "resource",
        "create",
        "--project-id",
        OPENSTACK_PROJECT,
        "--kind",
        "node",
        "--blueprint-version-id",
        version,
        "--cloud-credential-id",
        cred,
        "--parameters",
        parameters,
        "--output",
        "json",
    ];
    args.extend_from_slice(extra);
    cp.plexctl(&args)
}

/// The version id of blueprint `name` whose substrate is `substrate`, from `blueprint list`.
pub fn blueprint_version(cp: &ControlPlane, name: &str, substrate: &str) -> Result<String> {
    let list = json(&cp.plexctl_ok(&["blueprint", "list", "--output", "json"])?)?;
    list.as_array()
        .and_then(|a| {
            a.iter()
                .find(|b| b["name"] == name && b["substrate"] == substrate)
        })
        .and_then(|b| b["version_id"].as_str())
        .map(str::to_owned)
        .with_context(|| format!("no {name} blueprint on {substrate} in `blueprint list`: {list}"))
}

/// plexctl's `--output json`, parsed; the error quotes what it could not parse.
pub fn json(out: &str) -> Result<serde_json::Value> {
    serde_json::from_str(out).with_context(|| format!("not JSON: {out}"))
}

/// The machine of a resource: `pr-<last 9 hex digits of its id>`.
fn machine_name(resource_id: &str) -> String {
    let hex: String = resource_id.chars().filter(|c| *c != '-').collect();
    format!("pr-{}", &hex[hex.len().saturating_sub(9)..])
}
