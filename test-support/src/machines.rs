//! The machine tests' guards (root, systemd-nspawn; plexsphere-nspawn does the work): a bridge
//! of the test's own removed on drop, a booted machine destroyed on drop, and [`Leftovers`],
//! which destroys every machine of a state dir and removes a bridge on drop, whoever made them
//! (the test itself, or a control plane it started). Dropped in the usual Rust order, so a
//! guard declared after what it cleans up runs after it is gone.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use plexsphere_nspawn::{
    BaseImage, Bridge, DEFAULT_IMAGE_CACHE, Machine, MachineSpec, NoCloudSeed,
};

/// How long [`TestMachine::boot`] waits for a machine's systemd to finish booting.
pub const BOOT: Duration = Duration::from_secs(180);

/// How long [`TestMachine::sh`] lets a script run.
pub const SCRIPT: Duration = Duration::from_secs(180);

/// The end-to-end machine tests need root and the machine tools; they fail (never skip)
/// without them.
pub fn preflight() -> Result<()> {
    if !crate::is_root() {
        bail!("the machine tests need root (they boot systemd-nspawn machines); run them as root");
    }
    plexsphere_nspawn::preflight().context("this host cannot run local machines")
}

/// Destroys every machine under a state dir, then removes a bridge, when dropped: what a
/// machine test or the control plane it ran left on the host, however the test ended. A
/// failure to clean up is printed, not raised (a drop cannot fail the test).
pub struct Leftovers {
    state: PathBuf,
    bridge: String,
}

impl Leftovers {
    /// Guards the machines under `state` (a plexsphere-nspawn state dir) and the bridge
    /// `bridge`; neither needs to exist yet.
    pub fn new(state: impl Into<PathBuf>, bridge: &str) -> Self {
        Self {
            state: state.into(),
            bridge: bridge.to_owned(),
        }
    }

    /// The state dir whose machines are destroyed.
    pub fn state(&self) -> &Path {
        &self.state
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        if let Err(e) = Machine::destroy_leftovers(&self.state) {
            eprintln!(
                "cleanup: cannot destroy the machines under {}: {e}",
                self.state.display()
            );
        }
        if let Err(e) = Bridge::remove(&self.bridge) {
            eprintln!("cleanup: cannot remove bridge {}: {e}", self.bridge);
        }
    }
}

/// A bridge of the test's own, removed on drop.
pub struct TestBridge {
    pub bridge: Bridge,
}

impl TestBridge {
    /// Makes (or takes over) the bridge `name` with the host address `cidr`, e.g.
    /// `172.30.240.1/24`.
    pub fn new(name: &str, cidr: &str) -> Result<Self> {
        let bridge = Bridge::ensure(name, cidr.parse().context("the bridge CIDR")?)?;
        Ok(Self { bridge })
    }
}

impl Drop for TestBridge {
    fn drop(&mut self) {
        if let Err(e) = Bridge::remove(self.bridge.name()) {
            eprintln!("cleanup: cannot remove bridge {}: {e}", self.bridge.name());
        }
    }
}

/// A booted machine, destroyed on drop.
pub struct TestMachine {
    pub machine: Machine,
}

impl TestMachine {
    /// Boots `name` from the cached base image on `bridge` at host number `host` with the
    /// given cloud-init user-data, and waits up to [`BOOT`] for it to finish booting.
    pub fn boot(
        state_dir: &Path,
        bridge: &Bridge,
        name: &str,
        host: u32,
        user_data: &str,
    ) -> Result<Self> {
        let image = BaseImage::ensure(Path::new(DEFAULT_IMAGE_CACHE))?;
        let spec = MachineSpec {
            name: name.to_owned(),
            image,
            bridge: bridge.name().to_owned(),
            address: bridge
                .machine_address(host)
                .context("an address in the bridge network")?,
            gateway: bridge.host_address(),
            seed: NoCloudSeed {
                instance_id: format!("{name}-{}", std::process::id()),
                user_data: user_data.to_owned(),
            },
            files: Vec::new(),
        };
        let machine = Machine::create(state_dir, spec)?;
        let m = Self { machine };
        m.machine.wait_booted(BOOT)?;
        Ok(m)
    }

    /// Runs a shell script inside the machine as root for at most [`SCRIPT`]; its stdin is
    /// `/dev/null` unless the script redirects it. Returns stdout, or the error with both
    /// streams.
    pub fn sh(&self, script: &str) -> Result<String> {
        let out = self.machine.exec_timeout(&["sh", "-euc", script], SCRIPT)?;
        if !out.status.success() {
            bail!(
                "`{script}` in {} failed with {}:\n{}\n{}",
                self.machine.name(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Writes a file into the machine's root (through the host's view of its overlay).
    pub fn write(&self, path: &str, contents: &str) -> Result<()> {
        let host_path = self.machine.merged().join(path.trim_start_matches('/'));
        if let Some(dir) = host_path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&host_path, contents)
            .with_context(|| format!("writing {path} into {}", self.machine.name()))
    }
}

impl Drop for TestMachine {
    fn drop(&mut self) {
        if let Err(e) = self.machine.destroy() {
            eprintln!(
                "cleanup: cannot destroy machine {}: {e}",
                self.machine.name()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    //! Root tests (CI runs them as root): the guards leave nothing behind.
    use super::*;

    fn bridge_exists(name: &str) -> bool {
        Path::new("/sys/class/net")
            .join(name)
            .join("bridge")
            .exists()
    }

    #[test]
    fn a_test_bridge_is_removed_on_drop() {
        preflight().unwrap();
        let name = "plexbts0";
        let net = TestBridge::new(name, "172.30.236.1/24").unwrap();
        assert_eq!(net.bridge.name(), name);
        assert!(bridge_exists(name));
        drop(net);
        assert!(!bridge_exists(name), "the bridge is gone after the drop");
    }

    #[test]
    fn leftovers_remove_the_bridge_and_tolerate_an_empty_state_dir() {
        preflight().unwrap();
        let name = "plexbts1";
        let state =
            std::env::temp_dir().join(format!("plexsphere-leftovers-{}", std::process::id()));
        let guard = Leftovers::new(&state, name);
        assert_eq!(guard.state(), state);
        Bridge::ensure(name, "172.30.237.1/24".parse().unwrap()).unwrap();
        assert!(bridge_exists(name));
        drop(guard);
        assert!(!bridge_exists(name), "the bridge is gone after the drop");
        assert!(Machine::list(&state).map(|l| l.is_empty()).unwrap_or(true));
    }
}
