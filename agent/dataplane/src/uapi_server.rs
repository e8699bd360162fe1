//! The UAPI unix socket (`/var/run/wireguard/<iface>.sock`): accepts connections, reads
//! requests up to their empty line, and writes the answers `uapi` formats. The socket file is
//! removed when the listener is dropped, if it is still the file this listener bound: an
//! instance for the same interface started while this one was exiting has put its own socket
//! at the path, and must keep it (WireGuard's netns.sh restarts an interface at once).
//! The other way round, a new instance that finds the path still served waits up to
//! [`TAKEOVER_WAIT`] for the exiting one to let go before it says the socket is in use; and
//! [`served_by`] lets the process that started an instance tell its socket from the old one's.

use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::shutdown::Shutdown;
use crate::uapi::{self, Request, UapiError};

/// The directory wg and wireguard-go use for UAPI sockets.
pub(crate) const SOCKET_DIR: &str = "/var/run/wireguard";

/// A request longer than this is refused with errno=22 (EINVAL). A set with 10k peers, or
/// one peer with 2.5 million allowed IPs (~25 bytes a line), fits; the 130k of the kernel's
/// netns.sh take about 3 MiB. Answers (`get`) are not limited: they hold what was set.
pub const MAX_REQUEST: usize = 64 << 20;
/// A client that sends nothing (or reads nothing) for this long is hung up on, so one stuck
/// client cannot hold the socket (served one connection at a time) for good.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// How long [`UapiListener::bind`] waits for a process that still serves the path to stop
/// (an instance whose interface was just deleted is exiting) before it answers
/// [`UapiServerError::InUse`].
pub const TAKEOVER_WAIT: Duration = Duration::from_secs(5);
/// How often the path is tried again meanwhile.
const TAKEOVER_POLL: Duration = Duration::from_millis(20);

/// The socket path for an interface.
pub fn socket_path(iface: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("{iface}.sock"))
}

#[derive(Debug, thiserror::Error)]
pub enum UapiServerError {
    #[error(
        "cannot create the UAPI socket {path} ({source}); is /var/run/wireguard writable (run as root)?"
    )]
    Bind { path: PathBuf, source: io::Error },
    #[error("another process already serves {0}; stop it (or pick another interface name) first")]
    InUse(PathBuf),
    #[error("the UAPI socket {path} failed ({source})")]
    Accept { path: PathBuf, source: io::Error },
}

/// A bound UAPI socket; the file goes away with it.
pub(crate) struct UapiListener {
    listener: UnixListener,
    path: PathBuf,
    /// The device and inode of the socket file this listener bound.
    file: (u64, u64),
}

impl UapiListener {
    pub(crate) fn bind(path: &Path) -> Result<Self, UapiServerError> {
        let err = |source| UapiServerError::Bind {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(err)?;
        }
        if path.exists() {
            let deadline = std::time::Instant::now() + TAKEOVER_WAIT;
            while UnixStream::connect(path).is_ok() {
                if std::time::Instant::now() >= deadline {
                    return Err(UapiServerError::InUse(path.to_owned()));
                }
                std::thread::sleep(TAKEOVER_POLL);
            }
            // A stale socket from a process that died, or one that an exiting instance
            // stopped serving and has not removed yet (its drop leaves ours alone).
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(err(e)),
                _ => {}
            }
        }
        let listener = UnixListener::bind(path).map_err(err)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
        listener.set_nonblocking(true).map_err(err)?;
        let meta = std::fs::symlink_metadata(path).map_err(err)?;
        Ok(Self {
            listener,
            path: path.to_owned(),
            file: (meta.dev(), meta.ino()),
        })
    }

    /// Serves until `shutdown` fires, one connection at a time (requests are short).
    pub(crate) fn serve(
        self,
        shutdown: &Shutdown,
        handle: impl Fn(Request) -> String,
    ) -> Result<(), UapiServerError> {
        while !shutdown.is_triggered() {
            let mut fds = [PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(100u16)) {
                Ok(0) | Err(nix::Error::EINTR) => continue,
                Ok(_) => {}
                Err(e) => {
                    return Err(UapiServerError::Accept {
                        path: self.path.clone(),
                        source: e.into(),
                    });
                }
            }
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = serve_connection(stream, &handle) {
                        tracing::debug!(error = %e, "UAPI connection ended with an error");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => tracing::warn!(error = %e, "UAPI accept failed"),
            }
        }
        Ok(())
    }
}

impl Drop for UapiListener {
    fn drop(&mut self) {
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether the UAPI socket at `path` is served by the process `pid` (the peer credentials of a
/// connection name the process that listens): a starter waits for this, not for any answer,
/// since an exiting instance of the same interface may still answer at the path.
pub fn served_by(path: &Path, pid: u32) -> bool {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let Ok(stream) = UnixStream::connect(path) else {
        return false;
    };
    getsockopt(&stream, PeerCredentials).is_ok_and(|cred| i64::from(cred.pid()) == i64::from(pid))
}

/// Reads requests until the client closes; answers each.
fn serve_connection(stream: UnixStream, handle: &impl Fn(Request) -> String) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut lines: Vec<String> = Vec::new();
        let mut size = 0;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                // EOF: a request without its empty line is still answered (wg does this).
                if lines.is_empty() {
                    return Ok(());
                }
                break;
            }
            size += line.len();
            if size > MAX_REQUEST {
                writer.write_all(uapi::errno_answer(-uapi::EINVAL).as_bytes())?;
                return Ok(());
            }
            let line = line.trim_end_matches('\n');
            if line.is_empty() {
                break;
            }
            lines.push(line.to_owned());
        }
        let answer = match uapi::parse_request(lines.iter().map(String::as_str)) {
            Ok(request) => handle(request),
            // wireguard-go hangs up on an unknown operation.
            Err(UapiError::UnknownOperation) => return Ok(()),
            Err(e) => {
                tracing::debug!(error = %e, "UAPI request refused");
                uapi::errno_answer(e.errno())
            }
        };
        writer.write_all(answer.as_bytes())?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exiting_listener_leaves_the_socket_of_the_instance_that_replaced_it() {
        let dir = std::env::temp_dir().join(format!("plexd-uapi-{}", std::process::id()));
        let path = dir.join("wg-restart.sock");
        let old = UapiListener::bind(&path).expect("bind the first instance");
        // The old instance is exiting; its file went away (or was found stale) and the new
        // instance bound its own socket at the same path.
        std::fs::remove_file(&path).expect("remove");
        let new = UapiListener::bind(&path).expect("bind the second instance");
        drop(old);
        assert!(
            UnixStream::connect(&path).is_ok(),
            "the new instance's socket must survive the old one's exit"
        );
        drop(new);
        assert!(!path.exists(), "the last listener removes its own socket");
        let _ = std::fs::remove_dir(&dir);
    }

    #[test]
    fn a_new_listener_waits_for_an_exiting_one_to_let_go() {
        let dir = std::env::temp_dir().join(format!("plexd-uapi-wait-{}", std::process::id()));
        let path = dir.join("wg-wait.sock");
        let old = UapiListener::bind(&path).expect("bind the first instance");
        // The old instance stops serving a moment after the new one starts.
        let exiting = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(old);
        });
        let new = UapiListener::bind(&path).expect("the new instance takes the path over");
        exiting.join().expect("the old instance's thread");
        assert!(
            served_by(&path, std::process::id()),
            "the path is served, by this process's new listener"
        );
        drop(new);
        let _ = std::fs::remove_dir(&dir);
    }

    #[test]
    fn served_by_names_the_listening_process_only() {
        let dir = std::env::temp_dir().join(format!("plexd-uapi-pid-{}", std::process::id()));
        let path = dir.join("wg-pid.sock");
        assert!(!served_by(&path, std::process::id()), "nothing listens yet");
        let l = UapiListener::bind(&path).expect("bind");
        assert!(served_by(&path, std::process::id()));
        assert!(!served_by(&path, std::process::id() + 1), "another pid");
        drop(l);
        let _ = std::fs::remove_dir(&dir);
    }
}
