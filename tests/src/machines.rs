//! Real machines for the end-to-end tests: systemd-nspawn machines booted from the cached
//! Debian base image (plexsphere-nspawn), on a bridge of their own, destroyed on drop.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use plexsphere_nspawn::{
    BaseImage, Bridge, DEFAULT_IMAGE_CACHE, Machine, MachineSpec, NoCloudSeed,
};

pub const BOOT: Duration = Duration::from_secs(180);

/// These tests need root and the machine tools; they fail (never skip) without them.
pub fn preflight() -> Result<()> {
    if !nix_is_root() {
        bail!("the machine tests need root (they boot systemd-nspawn machines); run them as root");
    }
    plexsphere_nspawn::preflight().context("this host cannot run local machines")
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// A bridge of the test's own, removed on drop.
pub struct TestBridge {
    pub bridge: Bridge,
}

impl TestBridge {
    pub fn new(name: &str, cidr: &str) -> Result<Self> {
        let bridge = Bridge::ensure(name, cidr.parse().context("the bridge CIDR")?)?;
        Ok(Self { bridge })
    }
}

impl Drop for TestBridge {
    fn drop(&mut self) {
        let _ = Bridge::remove(self.bridge.name());
    }
}

/// A booted machine, destroyed on drop.
pub struct TestMachine {
    pub machine: Machine,
}

impl TestMachine {
    /// Boots `name` on `bridge` at host number `host` with the given cloud-init user-data.
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

    /// Runs a shell script inside the machine as root; its stdin is `/dev/null` unless the
    /// script redirects it. Returns stdout, or the error with both streams.
    pub fn sh(&self, script: &str) -> Result<String> {
        let out = self
            .machine
            .exec_timeout(&["sh", "-euc", script], Duration::from_secs(180))?;
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
        let _ = self.machine.destroy();
    }
}
