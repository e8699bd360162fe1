//! Waiting on a device's file descriptor, and filling a batch from non-blocking reads: what the
//! TUN device and the UDP socket share.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::batch::PacketBatch;

/// Waits up to `timeout` for `flags` on `fd`; false on timeout or a signal.
pub(super) fn wait_fd(fd: BorrowedFd<'_>, flags: PollFlags, timeout: Duration) -> io::Result<bool> {
    let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(fd, flags)];
    match poll(&mut fds, PollTimeout::from(ms)) {
        Ok(n) => Ok(n > 0),
        Err(nix::Error::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// What one non-blocking read did to the batch.
pub(super) enum Read {
    /// Something was read (packets may or may not have been added).
    Done,
    /// A read failed in a way that is not fatal; after a wait, stop rather than spin.
    Skipped,
}

/// Fills `batch` from non-blocking reads: until it is full or the device has nothing more,
/// waiting (up to `timeout`, once) only while the batch is still empty. `read` returns
/// `WouldBlock` when the device is drained; `Interrupted` is retried, other errors end the call.
pub(super) fn fill(
    batch: &mut PacketBatch,
    timeout: Duration,
    mut read: impl FnMut(&mut PacketBatch) -> io::Result<Read>,
    mut wait_readable: impl FnMut(Duration) -> io::Result<bool>,
) -> io::Result<usize> {
    batch.clear();
    let mut waited = false;
    while !batch.is_full() {
        match read(batch) {
            Ok(Read::Done) => {}
            Ok(Read::Skipped) => {
                if waited {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !batch.is_empty() || waited {
                    break;
                }
                waited = true;
                if !wait_readable(timeout)? {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(batch.len())
}
