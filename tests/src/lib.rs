//! Utilities for the end-to-end tests: they run the real `plexsphere`, `plexctl` and `plexd`
//! binaries as separate processes, over real TLS, with real files, in temporary roots.
//!
//! The binaries come from `PLEXSPHERE_BIN_DIR`, or else from the cargo target directory this
//! test executable was built into; `scripts/test` builds them first.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

pub mod broker;
pub mod machines;
pub mod netns;
pub mod proxy;

/// How long a process may take to print an expected line before a test gives up.
pub const STARTUP_BOUND: Duration = Duration::from_secs(60);

/// The path of one of the workspace's binaries.
pub fn bin(name: &str) -> Result<PathBuf> {
    let dir = match std::env::var_os("PLEXSPHERE_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            // target/debug/deps/<test exe> -> target/debug
            let exe = std::env::current_exe().context("locating the test executable")?;
            exe.parent()
                .and_then(Path::parent)
                .map(Path::to_path_buf)
                .context("the test executable has no grandparent directory")?
        }
    };
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "{} is missing: run `cargo build --workspace --bins` first (or set PLEXSPHERE_BIN_DIR)",
            path.display()
        );
    }
    Ok(path)
}

/// A child process whose output lines are collected as they arrive; killed on drop.
pub struct Proc {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    rx: mpsc::Receiver<String>,
}

impl Proc {
    pub fn spawn(mut cmd: Command) -> Result<Self> {
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        let mut child = cmd.spawn().with_context(|| format!("spawning {cmd:?}"))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().context("child stdout")?;
        let err = child.stderr.take().context("child stderr")?;
        for stream in [
            Box::new(out) as Box<dyn std::io::Read + Send>,
            Box::new(err),
        ] {
            let lines = Arc::clone(&lines);
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if let Ok(mut l) = lines.lock() {
                        l.push(line.clone());
                    }
                    let _ = tx.send(line);
                }
            });
        }
        Ok(Self { child, lines, rx })
    }

    /// Waits for the first output line (stdout or stderr) that satisfies `pred`, within `bound`.
    pub fn wait_for_line(&self, bound: Duration, pred: impl Fn(&str) -> bool) -> Result<String> {
        let deadline = Instant::now() + bound;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) if pred(&line) => return Ok(line),
                Ok(_) => continue,
                Err(_) => bail!(
                    "no expected line within {bound:?}; output so far:\n{}",
                    self.output()
                ),
            }
        }
    }

    /// Everything the process printed so far.
    pub fn output(&self) -> String {
        self.lines.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the process has ended.
    pub fn try_exit(&mut self) -> Result<Option<std::process::ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Sends a signal by its kill(1) name (`HUP` for a config reload) without waiting for
    /// anything; the caller observes the effect.
    pub fn signal(&self, name: &str) -> Result<()> {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(&pid)
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -{name} {pid} failed with {status}");
        }
        Ok(())
    }

    /// Sends SIGTERM and waits for the exit, within a bound.
    pub fn terminate(&mut self, bound: Duration) -> Result<std::process::ExitStatus> {
        let pid = i32::try_from(self.child.id()).context("pid out of range")?;
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .context("running kill")?;
        let deadline = Instant::now() + bound;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("process {pid} did not exit within {bound:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
        let out = self.plexctl_ok(&[
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
        ])?;
        let v: serde_json::Value = serde_json::from_str(&out).context("parsing issue output")?;
        v["token"]
            .as_str()
            .map(str::to_owned)
            .context("no token in the issue output")
    }
}

/// The Project the built-in lab seed creates without a sub-range.
pub const LAB_NODES_PROJECT: &str = "019a0816-0000-7000-8000-000000000002";
/// The Project the built-in lab seed creates with the sub-range 10.64.1.0/24.
pub const OPENSTACK_PROJECT: &str = "019a0816-0000-7000-8000-000000000001";

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
        let mut cmd = Command::new(bin("plexd")?);
        cmd.env("PLEXD_CONFIG", self.config())
            .env("PLEXD_STATE_DIR", self.state_dir())
            .env("PLEXD_UNIT_DIR", self.unit_dir())
            .env("PLEXD_RUN_DIR", self.run_dir())
            .env_remove("NOTIFY_SOCKET")
            .env_remove("JOURNAL_STREAM");
        Ok(cmd)
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

/// The mode bits of a file (permissions only).
pub fn mode(path: &Path) -> Result<u32> {
    use std::os::unix::fs::PermissionsExt;
    Ok(std::fs::metadata(path)
        .with_context(|| format!("stat {}", path.display()))?
        .permissions()
        .mode()
        & 0o7777)
}

/// Polls `check` every 100 ms until it yields a value, for at most `bound`; the error names
/// `what` and the last reason `check` gave.
pub fn wait_until<T>(
    bound: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + bound;
    loop {
        let last = match check() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => "not yet".to_owned(),
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() > deadline {
            bail!("{what}: not within {bound:?} (last: {last})");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
