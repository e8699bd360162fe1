//! The kernel backend's policy filter: an nftables table plexd owns, generated from the
//! node's [`NodeView`] and replaced in one atomic `nft -f -` transaction (docs/policy.md,
//! "Kernel backend: nftables").
//!
//! One table per WireGuard interface, `inet plexd_<iface>`: several plexd interfaces (or a
//! test's several nodes) on one host never touch each other's rules, and `remove(iface)`
//! knows what to delete from the configuration alone. The table filters only packets that
//! arrive on the interface (`iifname`); every other interface is left alone (its base chains
//! accept, so they add nothing to what other tables decide).
//!
//! Input (packets decrypted from a peer, for this host): the destination must be one of this
//! node's mesh addresses; then every packet, not only a flow's first, is checked against the
//! policy, so a revocation cuts established flows at the next packet with no conntrack
//! flush: conntrack's direction says who opened the flow —
//! - `ct direction original` (the peer opened it): the peer's source address selects, through
//!   a verdict map, the chain of its inbound grant, which accepts the allowed destination
//!   ports (tcp, udp), icmp/icmpv6, or any other protocol;
//! - `ct direction reply` (this node opened it): the chain of the peer's outbound grant checks
//!   the source port (the port this node opened on the peer). So replies pass, and only while
//!   the policy still lets this node open that flow;
//! - ICMP errors about a tracked flow (`ct state related`) pass;
//! - anything else: a rate-limited log line (`plexd-policy drop`), counted, dropped.
//!
//! Forward (packets from the mesh this node would route): only replies to flows that left
//! through the interface, and what the view's route grants allow (`routes`: a router's
//! clients into its served prefixes and their replies back; a client's packets into a
//! route).
//!
//! Output: no chain without routes. The receiver is the boundary (the peer drops what its
//! policy refuses), and a reply to a flow this node opened where it may not is dropped here
//! on the way back. A client of a route gets an output chain for packets into the route.
//!
//! Spoofed sources: the kernel's WireGuard drops a decrypted packet whose source is not in
//! the sending peer's allowed IPs, and allowed IPs never overlap between peers, so a source
//! address selects the one peer that sent it; the verdict maps are keyed by it.
//!
//! Size: one map element per peer address plus, per distinct grant (deduplicated in the
//! view), one chain with its port ranges: `O(peer addresses + grants x ranges)`, never
//! `peers x ranges` (bounded by the policy's own limits, docs/policy.md "Limits").

use std::io::Write as _;
use std::process::{Command, Stdio};

use plexsphere_policy::filter::{NodeFilter, ViewError};
use plexsphere_policy::view::NodeView;
use plexsphere_wire::node::PolicyState;

mod log;
mod routes;
mod ruleset;

pub use ruleset::{LOG_PER_SECOND, LOG_PREFIX, MAX_IFACE_LEN, closed_ruleset, ruleset, table_name};
use ruleset::{filter_ruleset, valid_iface};

/// The program plexd runs (Debian's `nftables` package).
pub const NFT: &str = "nft";

/// Where [`NFT`] is on the `PATH` given (`std::env::var_os("PATH")` for this process), if it is
/// an executable file there. The kernel backend filters with it; `wireguard.backend: auto`
/// asks before it picks the kernel.
pub fn find_nft(path: Option<&std::ffi::OsStr>) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::split_paths(path?)
        .map(|dir| dir.join(NFT))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Why the filter could not be installed or removed.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error(
        "interface name {0:?} cannot name an nftables table: use 1 to {MAX_IFACE_LEN} letters, digits, '_', '-' or '.'"
    )]
    BadInterface(String),
    #[error("cannot run {NFT} ({0}); install Debian's nftables package")]
    Spawn(std::io::Error),
    #[error("{NFT} refused the table for {iface} ({status}): {stderr}")]
    Refused {
        iface: String,
        status: String,
        stderr: String,
    },
}

/// What [`install`] put in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    /// No policy (a server older than policies): no table, the interface filters nothing.
    Removed,
    /// The view's filter.
    Filter,
    /// The view cannot become a filter: the table drops everything from the interface.
    Closed(ViewError),
}

/// Runs `nft -f -` with `input`: one transaction, all or nothing (a refused input leaves the
/// table as it was).
fn run(iface: &str, input: &str) -> Result<(), NftError> {
    if !valid_iface(iface) {
        return Err(NftError::BadInterface(iface.to_owned()));
    }
    let mut child = Command::new(NFT)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(NftError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A write error (nft exited early) shows in its status and stderr below.
        let _ = stdin.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(NftError::Spawn)?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(NftError::Refused {
        iface: iface.to_owned(),
        status: out.status.to_string(),
        stderr: stderr
            .trim()
            .lines()
            .take(8)
            .collect::<Vec<_>>()
            .join(" | "),
    })
}

/// Replaces `iface`'s table with the filter of `view` in one transaction (`None`: removes
/// it; a view that cannot become a filter: the closed table).
pub fn install(iface: &str, view: Option<&NodeView>) -> Result<Installed, NftError> {
    let Some(v) = view else {
        run(iface, &ruleset(iface, None))?;
        return Ok(Installed::Removed);
    };
    match NodeFilter::new(v) {
        Ok(_) => {
            run(iface, &filter_ruleset(iface, v))?;
            Ok(Installed::Filter)
        }
        Err(e) => {
            run(iface, &closed_ruleset(iface))?;
            Ok(Installed::Closed(e))
        }
    }
}

/// Replaces `iface`'s table with one that drops everything arriving on it.
pub fn install_closed(iface: &str) -> Result<(), NftError> {
    run(iface, &closed_ruleset(iface))
}

/// Removes `iface`'s table (nothing to do when there is none).
pub fn remove(iface: &str) -> Result<(), NftError> {
    run(iface, &ruleset(iface, None))
}

/// Whether `iface`'s table exists (the worker asks every reconcile: `nft list tables`
/// prints only the names, never the table's elements).
pub fn exists(iface: &str) -> Result<bool, NftError> {
    if !valid_iface(iface) {
        return Err(NftError::BadInterface(iface.to_owned()));
    }
    let out = Command::new(NFT)
        .args(["list", "tables", "inet"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(NftError::Spawn)?;
    if !out.status.success() {
        return Err(NftError::Refused {
            iface: iface.to_owned(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    let line = format!("table inet {}", table_name(iface));
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == line))
}

/// The kernel backend's [`super::contract::Mesh::set_policy`]: installs the view's filter,
/// or removes the table for no policy. Fail closed: a view that cannot become a filter, or
/// a filter nft refuses, leaves the closed table (everything from the interface dropped)
/// and answers `Err`, on which the daemon configures no peers either (so even a closed table
/// nft could not install lets nothing through) and says so in its journal, metrics and
/// `plexd status`.
pub fn set_policy(iface: &str, policy: Option<&PolicyState>) -> std::io::Result<()> {
    let Some(policy) = policy else {
        return match remove(iface) {
            Ok(()) => Ok(()),
            // No nft, so no table plexd could have made: nothing to remove.
            Err(NftError::Spawn(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(std::io::Error::other(format!(
                "cannot remove the policy table ({e}); the last policy's filter stays in force until `nft delete table inet {}`",
                table_name(iface)
            ))),
        };
    };
    let version = policy.version;
    let why = match install(iface, Some(&policy.view)) {
        Ok(Installed::Filter | Installed::Removed) => {
            tracing::info!(interface = iface, policy_version = version, table = %table_name(iface), "policy: nftables filter installed");
            return Ok(());
        }
        Ok(Installed::Closed(e)) => {
            format!("the view of policy version {version} cannot become a filter ({e})")
        }
        Err(e) => match install_closed(iface) {
            Ok(()) => format!("cannot install the filter of policy version {version} ({e})"),
            Err(closed) => format!(
                "cannot install the filter of policy version {version} ({e}), nor the closed table ({closed})"
            ),
        },
    };
    tracing::error!(
        interface = iface,
        policy_version = version,
        "policy: {why}; nothing from any peer passes until a usable policy is installed"
    );
    Err(std::io::Error::other(format!(
        "{why}; nothing from any peer passes until a usable policy is installed"
    )))
}

/// Installs `policy` again when its table is gone (an `nft flush ruleset`, an
/// nftables.service restart); `Ok(true)` when it did. A table that exists is left as it is
/// (its rules are not compared). Cannot tell (nft fails): `Err`, nothing done.
pub fn restore(iface: &str, policy: &PolicyState) -> std::io::Result<bool> {
    match exists(iface) {
        Ok(true) => Ok(false),
        Ok(false) => set_policy(iface, Some(policy)).map(|()| true),
        Err(e) => Err(std::io::Error::other(format!(
            "cannot tell whether the policy table is in place ({e})"
        ))),
    }
}

/// `plexd leave` and `plexd uninstall`: the table goes with the interface. No nft means no
/// table plexd could have made.
pub fn remove_on_leave(iface: &str) -> Result<(), String> {
    match remove(iface) {
        Ok(()) => Ok(()),
        Err(NftError::Spawn(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!(
            "cannot remove the policy table ({e}); run `nft delete table inet {}`",
            table_name(iface)
        )),
    }
}
