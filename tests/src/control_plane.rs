//! A real `plexsphere dev` for the end-to-end tests, and the lab seed's Projects.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, Result, bail};

use crate::process::{Proc, STARTUP_BOUND, bin};

/// A real control plane started with `plexsphere dev` on 127.0.0.1:0 in a temporary data dir.
pub struct ControlPlane {
    pub proc: Proc,
    pub url: String,
    pub data_dir: PathBuf,
}

impl ControlPlane {
    pub fn start_dev(data_dir: &Path) -> Result<Self> {
        Self::start_dev_with(data_dir, &[])
    }

    pub fn start_dev_with(data_dir: &Path, extra: &[&str]) -> Result<Self> {
        Self::start_dev_on(data_dir, "127.0.0.1:0", extra)
    }

    /// `plexsphere dev` listening on `listen` (port 0 picks one), without local machines (as
    /// root, dev would otherwise set up the machine bridge).
    pub fn start_dev_on(data_dir: &Path, listen: &str, extra: &[&str]) -> Result<Self> {
        let mut cmd = Command::new(bin("plexsphere")?);
        cmd.env("PLEXSPHERE_NO_LOCAL_MACHINES", "1");
        Self::start(cmd, data_dir, listen, extra)
    }

    /// `plexsphere dev` with its local-machine substrate on (root): machines on its bridge.
    pub fn start_dev_with_machines(data_dir: &Path, listen: &str, extra: &[&str]) -> Result<Self> {
        let mut cmd = Command::new(bin("plexsphere")?);
        cmd.env_remove("PLEXSPHERE_NO_LOCAL_MACHINES");
        Self::start(cmd, data_dir, listen, extra)
    }

    fn start(mut cmd: Command, data_dir: &Path, listen: &str, extra: &[&str]) -> Result<Self> {
        cmd.arg("dev")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", listen])
            .args(extra);
        let proc = Proc::spawn(cmd)?;
        let line = proc.wait_for_line(STARTUP_BOUND, |l| l.contains("listening on https://"))?;
        let url = line
            .split("listening on ")
            .nth(1)
            .map(|s| s.trim().to_owned())
            .context("parsing the listening line")?;
        Ok(Self {
            proc,
            url,
            data_dir: data_dir.to_path_buf(),
        })
    }

    /// The socket address the control plane listens on.
    pub fn addr(&self) -> Result<std::net::SocketAddr> {
        self.url
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .parse()
            .with_context(|| format!("parsing the address of {}", self.url))
    }

    /// The node as `plexctl node get <id> --output json` shows it.
    pub fn node(&self, id: &str) -> Result<serde_json::Value> {
        let out = self.plexctl_ok(&["node", "get", id, "--output", "json"])?;
        Ok(serde_json::from_str(&out)?)
    }

    pub fn ca_file(&self) -> PathBuf {
        self.data_dir.join("tls/ca.crt")
    }

    pub fn plexctl_config(&self) -> PathBuf {
        self.data_dir.join("plexctl.yaml")
    }

    /// Runs `plexctl` against this control plane with the config `dev` wrote.
    pub fn plexctl(&self, args: &[&str]) -> Result<Output> {
        let out = Command::new(bin("plexctl")?)
            .env("PLEXCTL_CONFIG", self.plexctl_config())
            .env_remove("PLEXCTL_SERVER")
            .env_remove("PLEXCTL_TOKEN")
            .args(args)
            .output()
            .context("running plexctl")?;
        Ok(out)
    }

    /// Runs `plexctl` and insists it succeeded; returns its stdout.
    pub fn plexctl_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.plexctl(args)?;
        if !out.status.success() {
            bail!(
                "plexctl {args:?} failed with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }

    /// Issues a fresh node token for a Project and returns its text.
    pub fn issue_token(&self, project: &str) -> Result<String> {
        token_of(&self.plexctl_ok(&issue_token_args(project))?)
    }
}

/// `plexctl` arguments that issue a one-hour node token of `project` (JSON output).
pub fn issue_token_args(project: &str) -> [&str; 12] {
    [
        "bootstrap-token",
        "issue",
        "--project",
        project,
        "--kind",
        "node",
        "--env-prefix",
        "lab",
        "--ttl",
        "1h",
        "--output",
        "json",
    ]
}

/// The token of `plexctl bootstrap-token issue --output json`'s answer.
pub fn token_of(out: &str) -> Result<String> {
    let v: serde_json::Value = serde_json::from_str(out).context("parsing issue output")?;
    v["token"]
        .as_str()
        .map(str::to_owned)
        .context("no token in the issue output")
}

/// The Project the built-in lab seed creates without a sub-range.
pub const LAB_NODES_PROJECT: &str = "019a0816-0000-7000-8000-000000000002";
/// The Project the built-in lab seed creates with the sub-range 10.64.1.0/24.
pub const OPENSTACK_PROJECT: &str = "019a0816-0000-7000-8000-000000000001";
