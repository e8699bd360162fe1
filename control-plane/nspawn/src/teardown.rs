//! Stopping a machine and taking its overlay down, each step a bounded wait on what /proc
//! shows.

use std::path::Path;
use std::process::Child;
use std::sync::Mutex;
use std::time::Duration;

use nix::mount::{MntFlags, umount2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::{Error, Result};
use crate::procfs::{ProcId, find_ns_init, mount_points, mounts_under};
use crate::wait::{POLL_FAST, poll_until};

/// An orderly poweroff of a booted Debian takes a few seconds; past this, SIGKILL.
const POWEROFF_TIMEOUT: Duration = Duration::from_secs(45);
const KILL_TIMEOUT: Duration = Duration::from_secs(15);
const UNMOUNT_TIMEOUT: Duration = Duration::from_secs(15);

/// What stopping a machine needs of it: its name, its processes as recorded, and
/// systemd-nspawn's handle when this process started it (to reap it).
pub(crate) struct Running<'a> {
    pub name: &'a str,
    pub nspawn: Option<ProcId>,
    pub leader: Option<ProcId>,
    pub child: &'a Mutex<Option<Child>>,
}

/// Reaps systemd-nspawn if this process started it and it has exited.
pub(crate) fn reap(child: &Mutex<Option<Child>>) {
    if let Some(child) = child.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        let _ = child.try_wait();
    }
}

fn signal(p: ProcId, sig: Signal) {
    if p.alive()
        && let Err(errno) = kill(Pid::from_raw(p.pid), sig)
    {
        tracing::debug!(pid = p.pid, %errno, ?sig, "signal not delivered");
    }
}

fn wait_exit(m: &Running<'_>, procs: &[ProcId], what: &str, timeout: Duration) -> Result<()> {
    poll_until(
        what,
        timeout,
        POLL_FAST,
        "the machine's processes did not exit; check `ps` for them",
        || {
            reap(m.child);
            Ok(procs.iter().all(|p| !p.alive()).then_some(()))
        },
    )
}

/// Stops the machine: SIGTERM to systemd-nspawn (it powers the container off), then SIGKILL
/// to the container's PID 1 (which ends the whole container) and to nspawn past the bound.
pub(crate) fn stop(m: &Running<'_>) -> Result<()> {
    reap(m.child);
    let nspawn = m.nspawn.filter(ProcId::alive);
    let leader = m
        .leader
        .or_else(|| nspawn.and_then(|n| find_ns_init(n.pid)))
        .filter(ProcId::alive);
    let name = m.name;
    if let Some(n) = nspawn {
        tracing::info!(machine = name, nspawn = n.pid, "powering the machine off");
        signal(n, Signal::SIGTERM);
        let mut procs = vec![n];
        procs.extend(leader);
        if let Err(e) = wait_exit(
            m,
            &procs,
            &format!("powering off machine {name}"),
            POWEROFF_TIMEOUT,
        ) {
            tracing::warn!(machine = name, error = %e, "orderly poweroff timed out; killing the machine");
        }
    }
    let remaining: Vec<ProcId> = nspawn
        .into_iter()
        .chain(leader)
        .filter(ProcId::alive)
        .collect();
    if remaining.is_empty() {
        return Ok(());
    }
    // The container's PID 1 first: killing it kills every process of its PID namespace.
    for p in leader.iter().chain(nspawn.iter()) {
        signal(*p, Signal::SIGKILL);
    }
    wait_exit(
        m,
        &remaining,
        &format!("killing machine {name}"),
        KILL_TIMEOUT,
    )
}

pub(crate) fn is_mounted(path: &Path) -> bool {
    mount_points().iter().any(|p| p == path)
}

/// Unmounts `merged` and anything mounted below it, deepest first. A busy mount is retried
/// within a bound, then detached lazily (it goes once its last user does).
pub(crate) fn unmount(merged: &Path) -> Result<()> {
    let targets = mounts_under(&mount_points(), merged);
    for target in targets {
        let done = poll_until(
            &format!("unmounting {}", target.display()),
            UNMOUNT_TIMEOUT,
            POLL_FAST,
            "a process still uses the machine's files",
            || match umount2(&target, MntFlags::empty()) {
                Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {
                    Ok(Some(()))
                }
                Err(nix::errno::Errno::EBUSY) => Ok(None),
                Err(errno) => Err(Error::sys(
                    "unmounting the machine's overlay",
                    &target,
                    errno,
                )),
            },
        );
        match done {
            Ok(()) => {}
            Err(Error::Timeout { .. }) => {
                tracing::warn!(mount = %target.display(), "mount still busy; detaching it lazily");
                umount2(&target, MntFlags::MNT_DETACH).map_err(|errno| {
                    Error::sys("detaching the machine's overlay", &target, errno)
                })?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
