//! The real OpenStack of `scripts/openstack-lab` (docs/openstack-lab.md), as the broker's
//! OpenStack tests see it: the lab's clouds.yaml and its names, and the admin's view of Nova
//! through Debian's `openstack` CLI (what an operator would run to check the broker's work).
//!
//! [`OpenStackLab::open`] fails, never skips, when the lab is not up: scripts/test brings it up
//! before these tests run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use serde_json::Value;

/// Where `scripts/openstack-lab` keeps its data (`PLEXSPHERE_OPENSTACK_LAB_DIR` moves it).
pub fn lab_dir() -> PathBuf {
    std::env::var_os("PLEXSPHERE_OPENSTACK_LAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/plexsphere-openstack-lab"))
}

/// The running lab.
pub struct OpenStackLab {
    dir: PathBuf,
    env: HashMap<String, String>,
}

impl OpenStackLab {
    /// The lab's `env` file read, and Keystone answering; else an error saying how to start it.
    pub fn open() -> Result<Self> {
        let dir = lab_dir();
        let text = std::fs::read_to_string(dir.join("env")).with_context(|| {
            format!(
                "the OpenStack lab is not set up ({}/env is missing): run `sudo scripts/openstack-lab up` first (scripts/test does)",
                dir.display()
            )
        })?;
        let env = text
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
            .collect();
        let lab = Self { dir, env };
        lab.admin(&["token", "issue", "-f", "value", "-c", "id"])
            .context("Keystone does not answer: run `sudo scripts/openstack-lab up`")?;
        Ok(lab)
    }

    /// A value of the lab's env file (`PLEXLAB_FLAVOR`, ...).
    pub fn var(&self, name: &str) -> Result<&str> {
        self.env
            .get(name)
            .map(String::as_str)
            .with_context(|| format!("{name} is not in the lab's env file"))
    }

    pub fn clouds_yaml(&self) -> PathBuf {
        self.dir.join("clouds.yaml")
    }

    /// `openstack <args>` as the lab's admin; stdout, or the CLI's stderr as the error.
    pub fn admin(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("openstack")
            .env("OS_CLIENT_CONFIG_FILE", self.clouds_yaml())
            .env("OS_CLOUD", "plexlab-admin")
            .args(args)
            .output()
            .context("running the openstack CLI (package python3-openstackclient)")?;
        if !out.status.success() {
            bail!(
                "openstack {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn admin_json(&self, args: &[&str]) -> Result<Value> {
        let out = self.admin(args)?;
        serde_json::from_str(&out).with_context(|| format!("openstack {args:?}: not JSON: {out}"))
    }

    /// Every server of any project named exactly `name`, as `server show` answers each.
    pub fn servers_named(&self, name: &str) -> Result<Vec<Value>> {
        let pattern = format!("^{name}$");
        let list = self.admin_json(&[
            "server",
            "list",
            "--all-projects",
            "--name",
            &pattern,
            "-f",
            "json",
        ])?;
        let mut out = Vec::new();
        for s in list.as_array().context("server list is not a list")? {
            let id = s["ID"].as_str().context("a listed server has no ID")?;
            out.push(self.server(id)?);
        }
        Ok(out)
    }

    /// `server show` at compute microversion 2.3, which shows the user data to the admin.
    pub fn server(&self, id: &str) -> Result<Value> {
        self.admin_json(&[
            "--os-compute-api-version",
            "2.3",
            "server",
            "show",
            id,
            "-f",
            "json",
        ])
    }

    /// Whether Nova boots real guests here (`scripts/openstack-lab up --libvirt`: libvirt and
    /// qemu), rather than recording them (Nova's `fake` driver, what CI runs).
    pub fn boots_guests(&self) -> bool {
        self.var("PLEXLAB_COMPUTE").is_ok_and(|c| c == "libvirt")
    }

    /// What the guest wrote to its serial console, as an operator reads it
    /// (`openstack console log show`).
    pub fn console_log(&self, server_id: &str) -> Result<String> {
        self.admin(&["console", "log", "show", server_id])
    }

    /// The user data Nova stored for a server, decoded.
    pub fn user_data(&self, server: &Value) -> Result<String> {
        let b64 = server["OS-EXT-SRV-ATTR:user_data"]
            .as_str()
            .context("the server shows no OS-EXT-SRV-ATTR:user_data")?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .context("the stored user data is not base64")?;
        String::from_utf8(bytes).context("the stored user data is not UTF-8")
    }

    /// A public flavor, made if the lab lacks it.
    pub fn ensure_flavor(&self, name: &str, ram_mb: u64, disk_gb: u64) -> Result<()> {
        if self
            .admin(&["flavor", "show", name, "-f", "value", "-c", "id"])
            .is_ok()
        {
            return Ok(());
        }
        self.admin(&[
            "flavor",
            "create",
            "--public",
            "--vcpus",
            "1",
            "--ram",
            &ram_mb.to_string(),
            "--disk",
            &disk_gb.to_string(),
            name,
        ])
        .map(drop)
    }

    /// A public image that needs at least `min_disk_gb` of disk, made if the lab lacks it.
    pub fn ensure_image_needing_disk(&self, name: &str, min_disk_gb: u64) -> Result<()> {
        if self
            .admin(&["image", "show", name, "-f", "value", "-c", "id"])
            .is_ok()
        {
            return Ok(());
        }
        let file = std::env::temp_dir().join(format!("{name}.raw"));
        std::fs::write(&file, vec![0u8; 1 << 16])?;
        let made = self.admin(&[
            "image",
            "create",
            "--public",
            "--disk-format",
            "raw",
            "--container-format",
            "bare",
            "--min-disk",
            &min_disk_gb.to_string(),
            "--file",
            &file.to_string_lossy(),
            name,
        ]);
        let _ = std::fs::remove_file(&file);
        made.map(drop)
    }

    /// How many servers the lab project has now (of any run).
    pub fn servers_in_project(&self) -> Result<usize> {
        let list = self.admin_json(&["server", "list", "--project", "plexlab", "-f", "json"])?;
        Ok(list.as_array().context("server list is not a list")?.len())
    }

    /// Sets the lab project's instance quota.
    pub fn set_instance_quota(&self, n: u32) -> Result<()> {
        self.admin(&["quota", "set", "--instances", &n.to_string(), "plexlab"])
            .map(drop)
    }

    /// Stops Keystone (its pid from the lab's run directory); [`OpenStackLab::up`] starts it again.
    pub fn stop_keystone(&self) -> Result<()> {
        let pid_file = self.dir.join("run/keystone.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .with_context(|| format!("reading {}", pid_file.display()))?;
        let status = Command::new("kill").arg(pid.trim()).status()?;
        anyhow::ensure!(status.success(), "kill {} failed", pid.trim());
        crate::wait_until(Duration::from_secs(30), "Keystone stops answering", || {
            Ok(self.admin(&["token", "issue"]).is_err().then_some(()))
        })
    }

    /// `scripts/openstack-lab up` (with `--libvirt` when the lab boots guests): starts
    /// whatever of the lab is not running, in the mode it runs in.
    pub fn up(&self, repo: &Path) -> Result<()> {
        let mut cmd = Command::new(repo.join("scripts/openstack-lab"));
        cmd.arg("up");
        if self.boots_guests() {
            cmd.arg("--libvirt");
        }
        let out = cmd
            .env("PLEXSPHERE_OPENSTACK_LAB_DIR", &self.dir)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "scripts/openstack-lab up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

/// Sets the instance quota back to the lab's 10 when dropped, however the test ends.
pub struct QuotaReset<'a>(pub &'a OpenStackLab);

impl Drop for QuotaReset<'_> {
    fn drop(&mut self) {
        let _ = self.0.set_instance_quota(10);
    }
}
