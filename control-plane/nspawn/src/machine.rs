//! A machine's life on the host: a copy-on-write overlay over the base image, the files it
//! boots with, the systemd-nspawn process that runs it, and its removal.
//!
//! Everything of a machine lives under `<state_dir>/machines/<name>/`: `upper/` and `work/`
//! (its overlay layer), `merged/` (the mounted root), `console.log` (the console: nspawn's and
//! the machine's output, where `plexd join` prints its `node_id:`/`mesh_ip:` lines) and
//! `machine.json` (what a restarted process needs to find the machine again).

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use ipnet::Ipv4Net;
use nix::mount::{MsFlags, mount};

use crate::bridge;
use crate::cmd::{Tool, last_words};
use crate::error::{Error, Result};
use crate::image::{BaseImage, remove_tree};
use crate::layer::{ExtraFile, NoCloudSeed, machine_files, validate_name};
use crate::nspawn::nspawn_args;
use crate::procfs::{ProcId, find_ns_init};
use crate::rootfs;
use crate::teardown;
use crate::wait::{POLL_FAST, poll_until};

/// How long systemd-nspawn may take to start the machine's PID 1.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// What to create.
#[derive(Debug, Clone)]
pub struct MachineSpec {
    /// Hostname and machine name: 1-63 of `a-z`, `0-9`, `-`.
    pub name: String,
    pub image: BaseImage,
    /// The host bridge (see [`crate::Bridge`]); it must exist.
    pub bridge: String,
    /// The machine's address with the bridge's prefix, e.g. 172.30.231.10/24.
    pub address: Ipv4Net,
    /// Usually the bridge's host address.
    pub gateway: Ipv4Addr,
    pub seed: NoCloudSeed,
    /// Written after the machine's own files, so they may replace them.
    pub files: Vec<ExtraFile>,
}

/// What `machine.json` keeps.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Record {
    pub name: String,
    pub rootfs: PathBuf,
    pub bridge: String,
    pub address: Ipv4Net,
    pub nspawn: Option<ProcId>,
    /// The machine's PID 1, so a machine whose nspawn died can still be stopped.
    #[serde(default)]
    pub leader: Option<ProcId>,
}

/// A machine created by this process or found again in the state dir.
#[derive(Debug)]
pub struct Machine {
    pub(crate) dir: PathBuf,
    pub(crate) record: Record,
    /// Set when this process spawned systemd-nspawn (it reaps it).
    pub(crate) child: Mutex<Option<Child>>,
    pub(crate) leader: Mutex<Option<ProcId>>,
}

impl Machine {
    /// Creates the machine's layer, writes its files, and starts it; returns once its PID 1
    /// runs (boot goes on: see [`Machine::wait_booted`]). On failure nothing is left behind.
    pub fn create(state_dir: &Path, spec: MachineSpec) -> Result<Machine> {
        validate_name(&spec.name)?;
        if !bridge::exists(&spec.bridge) {
            return Err(Error::BridgeMissing(spec.bridge.clone()));
        }
        let machines = state_dir.join("machines");
        std::fs::create_dir_all(&machines)
            .map_err(|e| Error::io("creating the machines directory", &machines, e))?;
        // The kernel lists mounts by their canonical path: use that one throughout.
        let state_dir = canonical(state_dir)?;
        let dir = machine_dir(&state_dir, &spec.name);
        let rootfs = spec.image.rootfs();
        for p in [&dir, &rootfs] {
            if p.to_string_lossy()
                .contains([',', ':', ' ', '\t', '\n', '\\'])
            {
                return Err(Error::UnmountablePath(p.clone()));
            }
        }
        if std::fs::symlink_metadata(&dir).is_ok() {
            return Err(Error::MachineExists {
                name: spec.name.clone(),
                dir,
            });
        }
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            // Another caller created the same machine just now.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(Error::MachineExists {
                    name: spec.name.clone(),
                    dir,
                });
            }
            Err(e) => return Err(Error::io("creating the machine's directory", &dir, e)),
        }
        let mut machine = Machine {
            dir,
            record: Record {
                name: spec.name.clone(),
                rootfs,
                bridge: spec.bridge.clone(),
                address: spec.address,
                nspawn: None,
                leader: None,
            },
            child: Mutex::new(None),
            leader: Mutex::new(None),
        };
        match machine.start(&spec) {
            Ok(()) => Ok(machine),
            Err(e) => {
                tracing::warn!(machine = %spec.name, error = %e, "machine did not start; removing it");
                if let Err(cleanup) = machine.destroy() {
                    tracing::error!(machine = %spec.name, error = %cleanup, "could not remove the machine that failed to start");
                }
                Err(e)
            }
        }
    }

    fn start(&mut self, spec: &MachineSpec) -> Result<()> {
        let (upper, work, merged) = (self.dir.join("upper"), self.dir.join("work"), self.merged());
        for d in [&upper, &work, &merged] {
            std::fs::create_dir(d).map_err(|e| Error::io("creating the machine's layer", d, e))?;
        }
        // Write the record before mounting, so a crash from here on leaves a findable machine.
        self.write_record(&self.record)?;
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            self.record.rootfs.display(),
            upper.display(),
            work.display()
        );
        let source = format!("plexsphere-{}", self.record.name);
        mount(
            Some(source.as_str()),
            &merged,
            Some("overlay"),
            MsFlags::empty(),
            Some(opts.as_str()),
        )
        .map_err(|errno| {
            Error::sys(
                "mounting the machine's overlay (is the overlay module available?)",
                &merged,
                errno,
            )
        })?;

        let files = machine_files(&spec.name, spec.address, spec.gateway, &spec.seed);
        for f in files.iter().chain(&spec.files) {
            rootfs::write_file(&merged, &f.path, &f.contents, f.mode)?;
        }

        let console = self.console_path();
        let log = File::options()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&console)
            .map_err(|e| Error::io("opening the console log", &console, e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| Error::io("opening the console log", &console, e))?;
        let mut cmd = Tool::SystemdNspawn.command()?;
        cmd.args(nspawn_args(&merged, &spec.name, &spec.bridge))
            // A plain console: no colours or spinners in console.log.
            .env("TERM", "dumb")
            .env("SYSTEMD_COLORS", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2))
            // Its own process group: a Ctrl-C meant for the server does not reach the machine.
            .process_group(0);
        let child = cmd.spawn().map_err(|e| Error::Command {
            what: format!("starting machine {}", spec.name),
            program: "systemd-nspawn".into(),
            status: "could not start".into(),
            detail: e.to_string(),
        })?;
        let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
        let nspawn = ProcId::of(pid);
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        self.record.nspawn = nspawn;
        self.write_record(&self.record)?;
        let Some(nspawn) = nspawn else {
            return Err(self.exited_early());
        };
        let leader = poll_until(
            &format!("starting machine {}", spec.name),
            START_TIMEOUT,
            POLL_FAST,
            "read the machine's console.log for systemd-nspawn's reason",
            || {
                if !nspawn.alive() {
                    return Err(self.exited_early());
                }
                Ok(find_ns_init(nspawn.pid))
            },
        )?;
        *self.leader.lock().unwrap_or_else(|p| p.into_inner()) = Some(leader);
        self.record.leader = Some(leader);
        self.write_record(&self.record)?;
        tracing::info!(machine = %spec.name, address = %spec.address, nspawn = nspawn.pid, leader = leader.pid, "machine started");
        Ok(())
    }

    fn exited_early(&self) -> Error {
        let mut status = "exited".to_string();
        if let Some(child) = self
            .child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
            && let Ok(Some(s)) = child.try_wait()
        {
            status = s.to_string();
        }
        let log = std::fs::read(self.console_path()).unwrap_or_default();
        Error::Command {
            what: format!("starting machine {}", self.record.name),
            program: "systemd-nspawn".into(),
            status,
            detail: last_words(&log, b""),
        }
    }

    /// Powers the machine off (SIGTERM to systemd-nspawn, which shuts the container down;
    /// SIGKILL past a bound), unmounts its overlay and removes its directory. Idempotent.
    pub fn destroy(&self) -> Result<()> {
        if !self.dir.exists() && self.gone() {
            return Ok(());
        }
        teardown::stop(&teardown::Running {
            name: self.name(),
            nspawn: self.nspawn(),
            leader: self.known_leader(),
            child: &self.child,
        })?;
        teardown::unmount(&self.merged())?;
        remove_tree(&self.dir)?;
        tracing::info!(machine = %self.record.name, "machine destroyed");
        Ok(())
    }

    /// True when systemd-nspawn and the machine's PID 1 have exited and its overlay is
    /// unmounted.
    pub fn gone(&self) -> bool {
        teardown::reap(&self.child);
        let nspawn_alive = self.record.nspawn.is_some_and(|p| p.alive());
        let leader_alive = self.known_leader().is_some_and(|p| p.alive());
        !nspawn_alive && !leader_alive && !teardown::is_mounted(&self.merged())
    }

    pub fn name(&self) -> &str {
        &self.record.name
    }

    pub fn address(&self) -> Ipv4Net {
        self.record.address
    }

    pub fn bridge(&self) -> &str {
        &self.record.bridge
    }

    /// `<state_dir>/machines/<name>`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The mounted root of the machine, as the host sees it.
    pub fn merged(&self) -> PathBuf {
        self.dir.join("merged")
    }

    pub fn console_path(&self) -> PathBuf {
        self.dir.join("console.log")
    }

    /// The systemd-nspawn process, if one was recorded.
    pub fn nspawn(&self) -> Option<ProcId> {
        self.record.nspawn
    }

    pub(crate) fn known_leader(&self) -> Option<ProcId> {
        *self.leader.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write_record(&self, record: &Record) -> Result<()> {
        let path = self.dir.join("machine.json");
        let tmp = self.dir.join(".machine.json.tmp");
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| Error::BadStateFile {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        std::fs::write(&tmp, bytes)
            .map_err(|e| Error::io("writing the machine's state", &tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io("writing the machine's state", &path, e))
    }
}

pub(crate) fn canonical(state_dir: &Path) -> Result<PathBuf> {
    std::fs::canonicalize(state_dir)
        .map_err(|e| Error::io("resolving the state directory", state_dir, e))
}

/// `<state_dir>/machines/<name>`.
pub fn machine_dir(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join("machines").join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machines_are_send_and_sync_for_spawn_blocking() {
        fn check<T: Send + Sync>() {}
        check::<Machine>();
        check::<BaseImage>();
        check::<crate::Bridge>();
    }
}
