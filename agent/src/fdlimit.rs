//! The open-file limit of `plexd run`: raised from the soft limit to the hard one at start.
//!
//! With the kernel backend every relayed peer holds a loopback forwarder (one UDP socket,
//! `crate::reach::forward`), so 1,000 relayed peers need 1,000 descriptors besides the
//! daemon's own dozen; the soft limit most hosts start services with is 1,024 (systemd's
//! default, and the kernel's for init), which leaves no room. The hard limit is the bound the
//! host chose (systemd's default is 524,288; the kernel's for init 4,096), so plexd takes it,
//! as the Go runtime does for every program. docs/reach.md ("The kernel backend") has the sums.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// The soft and hard open-file limits before and after a raise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raised {
    pub before: u64,
    pub after: u64,
}

/// Sets the soft `RLIMIT_NOFILE` to the hard one; answers the soft limit before and after.
pub fn raise_open_files() -> nix::Result<Raised> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    let (after, _) = getrlimit(Resource::RLIMIT_NOFILE)?;
    Ok(Raised {
        before: soft,
        after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A soft limit below the hard one is raised to it (nextest runs each test in a process
    /// of its own, so lowering this one's soft limit touches no other test).
    #[test]
    fn the_soft_open_file_limit_is_raised_to_the_hard_one() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let low = hard.min(256);
        setrlimit(Resource::RLIMIT_NOFILE, low, hard).unwrap();
        let raised = raise_open_files().unwrap();
        assert_eq!(
            raised,
            Raised {
                before: low,
                after: hard
            }
        );
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (hard, hard));
        // Already at the hard limit: nothing changes.
        let again = raise_open_files().unwrap();
        assert_eq!(
            again,
            Raised {
                before: hard,
                after: hard
            }
        );
    }
}
