//! The one error type of this crate. Every message is one line: what happened, where, and what
//! to do next.

use std::path::PathBuf;
use std::time::Duration;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "local machines need root (systemd-nspawn, overlay mounts, bridges); run the control plane as root or pick another substrate"
    )]
    NotRoot,

    #[error(
        "/dev/net/tun is missing on the host; load the tun module (modprobe tun) so machines get TUN for plexd"
    )]
    NoTun,

    #[error("`{tool}` is not installed; install the Debian package `{package}` (scripts/deps.sh)")]
    ToolMissing {
        tool: &'static str,
        package: &'static str,
    },

    #[error("`{program}` failed while {what} ({status}): {detail}")]
    Command {
        what: String,
        program: String,
        status: String,
        detail: String,
    },

    #[error("{what} did not finish within {after:?}; {hint}")]
    Timeout {
        what: String,
        after: Duration,
        hint: &'static str,
    },

    #[error("{what} at {}: {source}", .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{what} at {}: {errno}", .path.display())]
    Sys {
        what: &'static str,
        path: PathBuf,
        errno: nix::errno::Errno,
    },

    #[error(
        "invalid machine name {0:?}: use 1-63 characters of a-z, 0-9 and '-', starting with a letter or digit"
    )]
    InvalidMachineName(String),

    #[error("invalid bridge name {0:?}: use 1-15 characters of a-z, A-Z, 0-9, '-' and '_'")]
    InvalidBridgeName(String),

    #[error("invalid path {path:?} for a file inside the machine: {reason}")]
    InvalidPath { path: String, reason: &'static str },

    #[error(
        "{} exists and is not a bridge; pick another bridge name or remove that interface",
        .0
    )]
    NotABridge(String),

    #[error("bridge {0} does not exist; call Bridge::ensure before creating machines on it")]
    BridgeMissing(String),

    #[error(
        "machine {name} already exists under {}; destroy it (or reattach to it) before creating it again",
        .dir.display()
    )]
    MachineExists { name: String, dir: PathBuf },

    #[error(
        "no machine {name} under {}; list the machines of this state dir with Machine::list",
        .dir.display()
    )]
    MachineNotFound { name: String, dir: PathBuf },

    #[error(
        "machine {0} is not running (its systemd-nspawn process has exited); read its console log, then destroy and recreate it"
    )]
    NotRunning(String),

    #[error(
        "the state file {} is unreadable ({reason}); destroy the machine's directory by hand if no process uses it",
        .path.display()
    )]
    BadStateFile { path: PathBuf, reason: String },

    #[error(
        "{} is still mounted under {}; unmount it (umount -l) before removing the directory",
        .mount.display(), .dir.display()
    )]
    StillMounted { dir: PathBuf, mount: PathBuf },

    #[error(
        "path {} contains ',', ':' or whitespace, which an overlay mount cannot take; use a plainer state or cache directory",
        .0.display()
    )]
    UnmountablePath(PathBuf),
}

impl Error {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            what,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn sys(
        what: &'static str,
        path: impl Into<PathBuf>,
        errno: nix::errno::Errno,
    ) -> Self {
        Error::Sys {
            what,
            path: path.into(),
            errno,
        }
    }
}
