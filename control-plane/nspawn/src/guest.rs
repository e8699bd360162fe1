//! Reaching into a machine without trusting it: the host never runs a binary of the machine
//! with the host's privileges, and never follows the machine's symlinks out of its root.
//!
//! - Files are opened relative to the machine's root (`/proc/<pid 1>/root`) with `openat2`
//!   and `RESOLVE_IN_ROOT` (an absolute symlink or `..` stays inside the machine; magic links
//!   are refused), and only regular files are read, with a bound, without blocking (a FIFO or a
//!   device node the machine planted reads as "not readable").
//! - The machine's systemd is asked by the host's own `systemctl` (see `crate::guest_systemd`):
//!   its state, and commands, which it runs as services of the machine. A command so runs under
//!   the machine's PID 1, with exactly its capability bounding set, seccomp filter and
//!   namespaces, never with more privilege than the machine itself has.
//!
//! systemd-nspawn cannot run the machines in a user namespace on this kind of host (no systemd
//! as the host's PID 1 to delegate a cgroup to the namespace's root: the machine's systemd fails
//! with "Failed to allocate manager object: Permission denied"), so root in a machine is root
//! with nspawn's restrictions, and everything the host does inside it goes through this module.

use std::fs::File;
use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};

use crate::error::{Error, Result};

/// Where a machine's systemd listens for root's private connections.
pub const PRIVATE_BUS: &str = "/run/systemd/private";

fn root_path(leader: i32) -> PathBuf {
    PathBuf::from(format!("/proc/{leader}/root"))
}

/// The machine's root directory as an `O_PATH` descriptor.
fn open_root(leader: i32) -> Result<OwnedFd> {
    let path = root_path(leader);
    nix::fcntl::open(
        &path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|errno| Error::Sys {
        what: "opening the machine's root",
        path,
        errno,
    })
}

/// Opens `path` (absolute, as the machine sees it) inside the machine's root.
pub fn open_inside(leader: i32, path: &str, flags: OFlag) -> Result<Option<OwnedFd>> {
    let relative = path.trim_start_matches('/');
    if relative.is_empty() || path.contains('\0') {
        return Err(Error::InvalidPath {
            path: path.to_owned(),
            reason: "it must name a file below /",
        });
    }
    let root = open_root(leader)?;
    // openat2 refuses any flag but O_CLOEXEC and O_DIRECTORY beside O_PATH.
    let extra = if flags.contains(OFlag::O_PATH) {
        OFlag::O_CLOEXEC
    } else {
        OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK
    };
    let how = OpenHow::new()
        .flags(flags | extra)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    match openat2(&root, relative, how) {
        Ok(fd) => Ok(Some(fd)),
        Err(
            nix::errno::Errno::ENOENT
            | nix::errno::Errno::ENOTDIR
            | nix::errno::Errno::EACCES
            | nix::errno::Errno::ELOOP
            | nix::errno::Errno::EXDEV,
        ) => Ok(None),
        Err(errno) => Err(Error::Sys {
            what: "opening a file inside the machine",
            path: root_path(leader).join(relative),
            errno,
        }),
    }
}

/// The first `max_bytes` of the regular file at `path` inside the machine; `None` when there
/// is none there (missing, a directory, a FIFO, a device, a socket, unreadable).
pub fn read_regular(leader: i32, path: &str, max_bytes: usize) -> Result<Option<Vec<u8>>> {
    let Some(fd) = open_inside(leader, path, OFlag::O_RDONLY)? else {
        return Ok(None);
    };
    let file = File::from(fd);
    let meta = file.metadata().map_err(|e| {
        Error::io(
            "reading a file's type inside the machine",
            root_path(leader).join(path.trim_start_matches('/')),
            e,
        )
    })?;
    if !meta.file_type().is_file() {
        tracing::debug!(path, "not a regular file inside the machine; not read");
        return Ok(None);
    }
    let mut out = Vec::with_capacity(max_bytes.min(64 * 1024));
    file.take(max_bytes as u64)
        .read_to_end(&mut out)
        .map_err(|e| {
            Error::io(
                "reading a file inside the machine",
                root_path(leader).join(path.trim_start_matches('/')),
                e,
            )
        })?;
    Ok(Some(out))
}

/// Creates `/run/systemd/system/<name>` inside the machine with `contents`: the directory is
/// resolved inside the machine's root, the file made new (`O_EXCL`, no symlink followed).
pub fn create_runtime_unit(leader: i32, name: &str, contents: &[u8]) -> Result<()> {
    use std::io::Write as _;
    if name.contains('/') || name.starts_with('.') {
        return Err(Error::InvalidPath {
            path: name.to_owned(),
            reason: "a unit name has no slash",
        });
    }
    let dir = open_inside(
        leader,
        "/run/systemd/system",
        OFlag::O_PATH | OFlag::O_DIRECTORY,
    )?
    .ok_or_else(|| {
        Error::NotRunning(format!(
            "machine with PID 1 {leader} (no /run/systemd/system)"
        ))
    })?;
    let fd = nix::fcntl::openat(
        &dir,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .map_err(|errno| Error::Sys {
        what: "creating a runtime unit inside the machine",
        path: root_path(leader).join("run/systemd/system").join(name),
        errno,
    })?;
    File::from(fd).write_all(contents).map_err(|e| {
        Error::io(
            "writing a runtime unit inside the machine",
            root_path(leader).join("run/systemd/system").join(name),
            e,
        )
    })
}

/// Removes `/run/systemd/system/<name>` inside the machine (a unit [`create_runtime_unit`] made).
pub fn remove_runtime_unit(leader: i32, name: &str) {
    if name.contains('/') {
        return;
    }
    if let Ok(Some(dir)) = open_inside(
        leader,
        "/run/systemd/system",
        OFlag::O_PATH | OFlag::O_DIRECTORY,
    ) {
        let _ = nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
}

/// Removes `/run/<name>` inside the machine (a file this crate had the machine's systemd
/// write); only a plain name directly in /run, never a path the machine could redirect.
pub fn remove_in_run(leader: i32, path: &str) {
    let Some(name) = path
        .strip_prefix("/run/")
        .filter(|n| !n.is_empty() && !n.contains('/'))
    else {
        return;
    };
    let Ok(Some(run)) = open_inside(leader, "/run", OFlag::O_PATH | OFlag::O_DIRECTORY) else {
        return;
    };
    let _ = nix::unistd::unlinkat(&run, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
}
