//! A node host for the end-to-end tests: a temporary root with plexd's config, token and
//! state, and the plexd commands run against it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, Result, bail};

use crate::process::{Proc, bin};

/// A plexd "host": a temporary root holding its config dir, state dir and unit dir.
pub struct Host {
    pub root: PathBuf,
}

impl Host {
    pub fn new(root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root)?;
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    pub fn etc(&self) -> PathBuf {
        self.root.join("etc/plexd")
    }
    pub fn config(&self) -> PathBuf {
        self.etc().join("config.yaml")
    }
    pub fn token_file(&self) -> PathBuf {
        self.etc().join("bootstrap-token")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.root.join("var/lib/plexd")
    }
    pub fn unit_dir(&self) -> PathBuf {
        self.root.join("etc/systemd/system")
    }
    pub fn run_dir(&self) -> PathBuf {
        self.root.join("run/plexd")
    }
    /// This host's machine id, when the test gave it one ([`Host::write_machine_id`]);
    /// otherwise plexd reads the real `/etc/machine-id`.
    pub fn machine_id_file(&self) -> PathBuf {
        self.root.join("etc/machine-id")
    }

    /// The `Plexd-Host` value plexd on this host sends for `node_id` (64 hex), computed as plexd
    /// does from the machine id (`plexd::identity::host::fingerprint`): the state dir does not
    /// hold it. The machine id is this host's own, or the real `/etc/machine-id`.
    pub fn sent_fingerprint(&self, node_id: &str) -> Result<String> {
        let file = if self.machine_id_file().exists() {
            self.machine_id_file()
        } else {
            PathBuf::from("/etc/machine-id")
        };
        let machine_id = std::fs::read_to_string(&file)?.trim().to_ascii_lowercase();
        let node: u128 = u128::from_str_radix(&node_id.replace('-', ""), 16)?;
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, machine_id.as_bytes());
        let mut ctx = ring::hmac::Context::with_key(&key);
        ctx.update(b"plexd host binding v1\0");
        ctx.update(&node.to_be_bytes());
        let tag = ctx.sign();
        Ok(tag.as_ref().iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Gives this host its own machine id (plexd binds its state dir to it).
    pub fn write_machine_id(&self, id: &str) -> Result<()> {
        std::fs::create_dir_all(self.root.join("etc"))?;
        std::fs::write(self.machine_id_file(), format!("{id}\n"))?;
        Ok(())
    }

    /// Writes config.yaml for a node of `project` against `api_url`, trusting `ca`, plus any
    /// `extra` YAML (e.g. a `daemon:` section).
    pub fn write_config(
        &self,
        api_url: &str,
        ca: &Path,
        project: &str,
        handle: &str,
        extra: &str,
    ) -> Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(self.etc())?;
        let text = format!(
            "api_url: {api_url}\ntoken_file: {token}\nstate_dir: {state}\ntls:\n  ca_file: {ca}\nregistration:\n  project_id: {project}\n  resource_handle: {handle}\n{extra}",
            token = self.token_file().display(),
            state = self.state_dir().display(),
            ca = ca.display(),
        );
        std::fs::write(self.config(), text)?;
        Ok(())
    }

    /// Starts `plexd run` in the background.
    pub fn start_daemon(&self) -> Result<Proc> {
        let mut cmd = self.command()?;
        cmd.arg("run");
        Proc::spawn(cmd)
    }

    /// `plexd status --output json`, or None when no daemon answers.
    pub fn status(&self) -> Result<Option<serde_json::Value>> {
        let out = self.plexd(&["status", "--output", "json"])?;
        if out.status.code() == Some(3) {
            return Ok(None);
        }
        if !out.status.success() {
            bail!(
                "plexd status failed with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(Some(serde_json::from_slice(&out.stdout)?))
    }

    /// The mesh IPs of the peers a `status` JSON lists.
    pub fn peer_ips(status: &serde_json::Value) -> Vec<String> {
        status["peers"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p["mesh_ip"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The node's identity as saved by join: (node id, mesh ip).
    pub fn identity(&self) -> Result<(String, String)> {
        let text = std::fs::read_to_string(self.state_dir().join("identity.json"))?;
        let v: serde_json::Value = serde_json::from_str(&text)?;
        Ok((
            v["node_id"].as_str().context("node_id")?.to_owned(),
            v["mesh_ip"].as_str().context("mesh_ip")?.to_owned(),
        ))
    }

    /// Writes the token file the way the runbook does: directory 0700, file 0600.
    pub fn write_token(&self, token: &str) -> Result<()> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(self.etc())?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(self.token_file())?;
        std::io::Write::write_all(&mut f, format!("{token}\n").as_bytes())?;
        Ok(())
    }

    pub fn command(&self) -> Result<Command> {
        Ok(self.with_env(Command::new(bin("plexd")?)))
    }

    /// `cmd` with this host's plexd environment: a plexd binary, or a runner whose first
    /// argument is one (`qemu-aarch64-static <plexd>`).
    pub fn with_env(&self, mut cmd: Command) -> Command {
        cmd.env("PLEXD_CONFIG", self.config())
            .env("PLEXD_STATE_DIR", self.state_dir())
            .env("PLEXD_UNIT_DIR", self.unit_dir())
            .env("PLEXD_RUN_DIR", self.run_dir())
            .env_remove("NOTIFY_SOCKET")
            .env_remove("JOURNAL_STREAM");
        if self.machine_id_file().exists() {
            cmd.env("PLEXD_MACHINE_ID_FILE", self.machine_id_file());
        }
        cmd
    }

    /// `plexd install --api-url <api_url> --token-file <this host's> [--ca-file <ca>]`.
    pub fn install(&self, api_url: &str, ca: Option<&Path>) -> Result<Output> {
        let token_file = self.token_file();
        let mut args = vec![
            "install".to_owned(),
            "--api-url".to_owned(),
            api_url.to_owned(),
            "--token-file".to_owned(),
            token_file.display().to_string(),
        ];
        if let Some(ca) = ca {
            args.push("--ca-file".to_owned());
            args.push(ca.display().to_string());
        }
        self.command()?
            .args(&args)
            .output()
            .context("running plexd install")
    }

    /// Runs `plexd <args>` to completion.
    pub fn plexd(&self, args: &[&str]) -> Result<Output> {
        self.command()?.args(args).output().context("running plexd")
    }
}
