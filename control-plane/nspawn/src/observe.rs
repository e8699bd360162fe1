//! Watching a machine live: its PID 1 on the host, commands run inside it through `nsenter`
//! (there is no machined on the host), whether systemd finished booting, cloud-init's verdict,
//! the journal of a unit and the console log.

use std::process::Output;
use std::time::Duration;

use crate::cloud_init::{CloudInitStatus, parse_status};
use crate::cmd::{Tool, last_words, run_bounded};
use crate::error::{Error, Result};
use crate::machine::Machine;
use crate::procfs::{ProcId, find_ns_init};
use crate::wait::{POLL_SLOW, poll_until};

/// The bound on one command inside a machine unless the caller gives another.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(60);
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One look at a machine, for the substrate's report of its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Life {
    /// systemd-nspawn runs; systemd inside has not finished booting (its state is given).
    Starting { system_state: String },
    /// systemd finished booting (`running` or `degraded`); cloud-init's verdict so far.
    Booted {
        system_state: String,
        cloud_init: CloudInitStatus,
    },
    /// systemd-nspawn has exited but the machine was not destroyed (it crashed, or powered
    /// itself off); its files and console log are still there.
    Stopped,
    /// No process and no mount is left.
    Gone,
}

impl Machine {
    /// Where the machine is in its life, now. Cheap enough to poll every second or so.
    pub fn observe(&self) -> Result<Life> {
        if !self.is_running() {
            return Ok(if self.gone() && !self.dir.exists() {
                Life::Gone
            } else {
                Life::Stopped
            });
        }
        let system_state = match self.system_state() {
            Ok(s) => s,
            // The machine's systemd may not answer yet, or the machine stopped meanwhile.
            Err(Error::Timeout { .. }) | Err(Error::Command { .. }) | Err(Error::NotRunning(_)) => {
                return Ok(if self.is_running() {
                    Life::Starting {
                        system_state: String::new(),
                    }
                } else {
                    Life::Stopped
                });
            }
            Err(e) => return Err(e),
        };
        if !booted_state(&system_state) {
            return Ok(Life::Starting { system_state });
        }
        let cloud_init = self.cloud_init_status()?;
        Ok(Life::Booted {
            system_state,
            cloud_init,
        })
    }

    /// True while systemd-nspawn runs.
    pub fn is_running(&self) -> bool {
        crate::teardown::reap(&self.child);
        self.nspawn().is_some_and(|p| p.alive())
    }

    /// The machine's PID 1 as the host numbers it: the init of the PID namespace below the
    /// systemd-nspawn process.
    pub fn leader_pid(&self) -> Result<i32> {
        if let Some(l) = self.known_leader().filter(ProcId::alive) {
            return Ok(l.pid);
        }
        let nspawn = self
            .nspawn()
            .filter(|_| self.is_running())
            .ok_or_else(|| Error::NotRunning(self.name().to_string()))?;
        let leader =
            find_ns_init(nspawn.pid).ok_or_else(|| Error::NotRunning(self.name().to_string()))?;
        *self.leader.lock().unwrap_or_else(|p| p.into_inner()) = Some(leader);
        Ok(leader.pid)
    }

    /// Runs `argv` inside the machine (all its namespaces, its root) and returns its output
    /// whatever its exit status. Bounded by [`EXEC_TIMEOUT`].
    pub fn exec(&self, argv: &[&str]) -> Result<Output> {
        self.exec_timeout(argv, EXEC_TIMEOUT)
    }

    pub fn exec_timeout(&self, argv: &[&str], timeout: Duration) -> Result<Output> {
        let leader = self.leader_pid()?;
        // The parent-death signal kills nsenter with plexsphere: nsenter lives in the machine's
        // namespaces, and one stopped by a powering-off machine would otherwise outlive us
        // holding its network namespace.
        let mut cmd = Tool::Setpriv.command()?;
        cmd.args(["--pdeathsig", "KILL", "--"])
            .arg(Tool::Nsenter.path()?)
            .arg("-t")
            .arg(leader.to_string())
            .arg("-a")
            .arg("--")
            .args(argv)
            .env_clear()
            .env("PATH", PATH)
            .env("LANG", "C.UTF-8")
            .env("TERM", "dumb");
        let what = format!(
            "running {:?} in machine {}",
            argv.first().copied().unwrap_or_default(),
            self.name()
        );
        run_bounded(cmd, &what, timeout)
    }

    /// Like [`Machine::exec`]; a non-zero exit is an error quoting the command's stderr.
    pub fn exec_ok(&self, argv: &[&str]) -> Result<Output> {
        let out = self.exec(argv)?;
        if out.status.success() {
            return Ok(out);
        }
        Err(Error::Command {
            what: format!("running it in machine {}", self.name()),
            program: argv.first().copied().unwrap_or_default().to_string(),
            status: out.status.to_string(),
            detail: last_words(&out.stderr, &out.stdout),
        })
    }

    /// What `systemctl is-system-running` says (`starting`, `running`, `degraded`, ...).
    pub fn system_state(&self) -> Result<String> {
        let out = self.exec_timeout(&["systemctl", "is-system-running"], PROBE_TIMEOUT)?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// True once systemd finished booting: `running`, or `degraded` (booted, some unit failed).
    pub fn is_booted(&self) -> Result<bool> {
        Ok(booted_state(&self.system_state()?))
    }

    /// Waits until [`Machine::is_booted`]; fails early if the machine stops.
    pub fn wait_booted(&self, timeout: Duration) -> Result<()> {
        poll_until(
            &format!("booting machine {}", self.name()),
            timeout,
            POLL_SLOW,
            "read the machine's console.log to see which unit holds the boot",
            || match self.is_booted() {
                Ok(true) => Ok(Some(())),
                Ok(false) => Ok(None),
                // systemctl may not answer before systemd has set up its socket.
                Err(Error::Timeout { .. }) | Err(Error::Command { .. }) if self.is_running() => {
                    Ok(None)
                }
                Err(e) => Err(e),
            },
        )?;
        tracing::info!(machine = self.name(), "machine booted");
        Ok(())
    }

    /// cloud-init's verdict so far, from `cloud-init status --long`.
    pub fn cloud_init_status(&self) -> Result<CloudInitStatus> {
        let out = self.exec_timeout(&["cloud-init", "status", "--long"], PROBE_TIMEOUT)?;
        let text = String::from_utf8_lossy(&out.stdout);
        parse_status(&text).ok_or_else(|| Error::Command {
            what: format!("reading cloud-init's status in machine {}", self.name()),
            program: "cloud-init".into(),
            status: out.status.to_string(),
            detail: last_words(&out.stderr, &out.stdout),
        })
    }

    /// Waits until cloud-init's verdict is final (done, error, ...) and answers it.
    pub fn wait_cloud_init(&self, timeout: Duration) -> Result<CloudInitStatus> {
        let status = poll_until(
            &format!("cloud-init in machine {}", self.name()),
            timeout,
            POLL_SLOW,
            "read /var/log/cloud-init-output.log in the machine (or its console.log)",
            || {
                if !self.is_running() {
                    return Err(Error::NotRunning(self.name().to_string()));
                }
                match self.cloud_init_status() {
                    Ok(s) if s.is_final() => Ok(Some(s)),
                    Ok(_) | Err(Error::Timeout { .. }) | Err(Error::Command { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            },
        )?;
        tracing::info!(machine = self.name(), cloud_init = %status, "cloud-init finished");
        Ok(status)
    }

    /// The journal of `unit` in the machine, messages only.
    pub fn journal(&self, unit: &str) -> Result<String> {
        let out = self.exec_ok(&["journalctl", "-u", unit, "--no-pager", "-o", "cat"])?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The first `max_bytes` of the file at `path` inside the machine, or `None` when it
    /// cannot be read there (missing, a directory, no permission: `head` failed). Bounded by
    /// `timeout`; an error means the machine could not be asked at all.
    pub fn read_file(
        &self,
        path: &str,
        max_bytes: usize,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>> {
        let limit = max_bytes.to_string();
        let out = self.exec_timeout(&["head", "-c", &limit, "--", path], timeout)?;
        if !out.status.success() {
            tracing::debug!(machine = self.name(), path, status = %out.status, detail = %last_words(&out.stderr, &out.stdout), "file not readable in the machine");
            return Ok(None);
        }
        Ok(Some(out.stdout))
    }

    /// Everything the machine printed on its console so far.
    pub fn console_log(&self) -> Result<String> {
        let path = self.console_path();
        std::fs::read(&path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(|e| Error::io("reading the console log", &path, e))
    }
}

/// Whether a `systemctl is-system-running` answer means the boot has finished.
pub fn booted_state(state: &str) -> bool {
    matches!(state.trim(), "running" | "degraded")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booted_means_running_or_degraded() {
        assert!(booted_state("running\n"));
        assert!(booted_state("degraded"));
        for s in [
            "initializing",
            "starting",
            "stopping",
            "maintenance",
            "offline",
            "",
        ] {
            assert!(!booted_state(s), "{s}");
        }
    }
}
