//! The workspace's binaries as child processes: where they are, and a running one whose output
//! the tests read line by line.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

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

/// The last `n` lines of a process's output, enough to see what went wrong.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
