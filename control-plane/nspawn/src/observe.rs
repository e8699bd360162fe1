//! Watching a machine live: its PID 1 on the host, whether systemd finished booting (asked over
//! its private bus), cloud-init's verdict and the journal of a unit (commands the machine's own
//! systemd runs, with the machine's privileges), files read from its root without following its
//! symlinks out, and the console log. See `crate::guest` for why nothing of the machine ever
//! runs with the host's privileges.

use std::process::Output;
use std::time::Duration;

use crate::cloud_init::{CloudInitStatus, parse_status};
use crate::cmd::last_words;
use crate::error::{Error, Result};
use crate::guest_systemd::GuestSystemd;
use crate::machine::Machine;
use crate::procfs::{ProcId, find_ns_init};
use crate::wait::{POLL_SLOW, poll_until};

/// The bound on one command inside a machine unless the caller gives another.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(60);
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

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

    /// Runs `argv` inside the machine, as a transient service of the machine's systemd (so with
    /// the machine's own privileges, never the host's), and returns its output whatever its exit
    /// status. Bounded by [`EXEC_TIMEOUT`].
    pub fn exec(&self, argv: &[&str]) -> Result<Output> {
        self.exec_timeout(argv, EXEC_TIMEOUT)
    }

    pub fn exec_timeout(&self, argv: &[&str], timeout: Duration) -> Result<Output> {
        let leader = self.leader_pid()?;
        // The machine's own systemd runs it (see `crate::guest`): never this process's
        // privileges, never a binary of the machine started by the host.
        GuestSystemd::connect(leader)?.run(argv, timeout)
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
        // Asked over the machine's private bus: no command runs for it.
        GuestSystemd::connect(self.leader_pid()?)?.system_state()
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

    /// The first `max_bytes` of the regular file at `path` inside the machine, or `None` when
    /// there is none (missing, a directory, a FIFO or device, unreadable). Read by the host
    /// relative to the machine's root: the machine's symlinks resolve inside it, never out into
    /// the host (`crate::guest`). An error means the machine could not be asked at all.
    pub fn read_file(
        &self,
        path: &str,
        max_bytes: usize,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>> {
        let _ = timeout; // a bounded read of a regular file does not block
        let leader = self.leader_pid()?;
        let read = crate::guest::read_regular(leader, path, max_bytes)?;
        if read.is_none() {
            tracing::debug!(
                machine = self.name(),
                path,
                "file not readable in the machine"
            );
        }
        Ok(read)
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
