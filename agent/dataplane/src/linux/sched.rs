//! The packet threads' scheduling priority: a nice value for the calling thread alone.
//!
//! Under a saturating load the packet threads compete for the cores with the applications
//! whose traffic they carry; a ping then waits for a thread to be scheduled, not for the
//! cipher. The kernel's WireGuard runs in softirq context, ahead of every process; a raised
//! priority (a negative nice value, which needs CAP_SYS_NICE) gives the userspace threads the
//! same precedence, so the tunnel is drained as fast as traffic arrives and the bulk queue
//! moves back into the sending application's socket. See docs/benchmarks.md.
#![allow(unsafe_code)]

use std::io;

use nix::libc;

/// The packet threads' nice value in plexd-wg and in plexd's embedded data plane: ahead of the
/// applications whose traffic they carry, as the kernel's WireGuard is (softirq context).
pub const PACKET_THREAD_NICE: i32 = -20;

/// Sets the calling thread's nice value (-20 ..= 19). On Linux `setpriority(PRIO_PROCESS,
/// tid)` changes that thread only.
pub(crate) fn set_thread_nice(nice: i32) -> io::Result<()> {
    let tid = nix::unistd::gettid().as_raw();
    let who = libc::id_t::try_from(tid).map_err(|_| io::Error::other("negative thread id"))?;
    // SAFETY: setpriority takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_nice() -> i32 {
        let tid = nix::unistd::gettid().as_raw() as libc::id_t;
        // SAFETY: getpriority takes plain integers.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) }
    }

    #[test]
    fn a_thread_changes_its_own_priority_and_no_other() {
        // Raising it needs CAP_SYS_NICE; lowering it never does.
        let mine = own_nice();
        let theirs = std::thread::spawn(|| {
            set_thread_nice(own_nice() + 1).expect("setpriority");
            own_nice()
        })
        .join()
        .expect("the thread ran");
        assert_eq!(theirs, mine + 1);
        assert_eq!(own_nice(), mine, "the calling thread only");
    }
}
