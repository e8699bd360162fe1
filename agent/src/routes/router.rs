//! The router's and the exit user's netfilter and sysctls: forwarding while this node serves a
//! route (the values found are put back when it stops), and plexd's own nftables table
//! `inet plexd_<iface>_nat`, replaced in one `nft -f -` transaction:
//!
//! - `postrouting` (nat): `ip saddr <mesh range> oifname != <iface> masquerade` while this
//!   node serves a route or is an exit and `routes.snat` is on. (A postrouting hook has no
//!   input interface; a source in the mesh range is what came from the mesh.)
//! - `mark_out` (route, output) and `mark_in` (prerouting) while this node uses an exit:
//!   plexd's own WireGuard packets (its UDP listen ports) get the mark
//!   [`super::plan::EXIT_FWMARK`], kept on the flow in conntrack, so the exit's rule `not fwmark
//!   lookup <table>` sends them out the normal way and their replies pass the reverse path
//!   check (`src_valid_mark`), as wg-quick does with the interface's `fwmark`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ipnet::IpNet;

use super::plan::EXIT_FWMARK;
use crate::mesh::nft::{NFT, table_name};

/// The sysctls forwarding needs.
pub(crate) const FORWARDING: [&str; 2] = [
    "/proc/sys/net/ipv4/conf/all/forwarding",
    "/proc/sys/net/ipv6/conf/all/forwarding",
];
/// The sysctl that lets the reverse path check see the exit mark.
pub(crate) const SRC_VALID_MARK: &str = "/proc/sys/net/ipv4/conf/all/src_valid_mark";

/// Sysctl values as plexd found them, to put back.
#[derive(Debug, Default)]
pub struct Saved(Vec<(PathBuf, String)>);

/// Sets each file to `value`, remembering what it held; a file that does not exist (no IPv6)
/// is skipped.
pub(crate) fn set_sysctls(files: &[&str], value: &str) -> Result<Saved, String> {
    let mut saved = Saved::default();
    for f in files {
        let path = Path::new(f);
        let old = match std::fs::read_to_string(path) {
            Ok(v) => v.trim().to_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                restore(&mut saved);
                return Err(format!("cannot read {f}: {e}"));
            }
        };
        if old != value {
            if let Err(e) = std::fs::write(path, value) {
                restore(&mut saved);
                return Err(format!("cannot set {f} to {value}: {e}"));
            }
            saved.0.push((path.to_path_buf(), old));
        }
    }
    Ok(saved)
}

/// Puts the saved values back (logs what it cannot).
pub fn restore(saved: &mut Saved) {
    for (path, old) in saved.0.drain(..).rev() {
        if let Err(e) = std::fs::write(&path, &old) {
            tracing::warn!(
                "cannot put {} back to {old}: {e}; set it by hand",
                path.display()
            );
        }
    }
}

/// The nat table's name for `iface`.
pub(crate) fn nat_table(iface: &str) -> String {
    format!("{}_nat", table_name(iface))
}

/// What the nat table holds; `None` when it has nothing to hold.
pub(crate) fn nat_ruleset(
    iface: &str,
    mesh: IpNet,
    masquerade: bool,
    mark_ports: &[u16],
) -> Option<String> {
    if !masquerade && mark_ports.is_empty() {
        return None;
    }
    let table = nat_table(iface);
    let mut out = String::new();
    let _ = writeln!(out, "table inet {table}\ndelete table inet {table}");
    let _ = writeln!(out, "table inet {table} {{");
    if masquerade {
        let family = match mesh {
            IpNet::V4(_) => "ip",
            IpNet::V6(_) => "ip6",
        };
        let _ = writeln!(
            out,
            "  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    {family} saddr {mesh} oifname != \"{iface}\" masquerade\n  }}"
        );
    }
    if !mark_ports.is_empty() {
        let ports: Vec<String> = mark_ports.iter().map(u16::to_string).collect();
        let _ = writeln!(
            out,
            "  chain mark_out {{\n    type route hook output priority mangle; policy accept;\n    udp sport {{ {} }} meta mark set {EXIT_FWMARK:#x} ct mark set {EXIT_FWMARK:#x}\n  }}",
            ports.join(", ")
        );
        let _ = writeln!(
            out,
            "  chain mark_in {{\n    type filter hook prerouting priority mangle; policy accept;\n    ct mark {EXIT_FWMARK:#x} meta mark set ct mark\n  }}"
        );
    }
    out.push_str("}\n");
    Some(out)
}

/// Removes the nat table (missing is fine).
pub(crate) fn remove_ruleset(iface: &str) -> String {
    let table = nat_table(iface);
    format!("table inet {table}\ndelete table inet {table}\n")
}

/// Why `nft -f -` did not take the nat table. [`remove_on_leave`] decides on the kind: no
/// `nft` at all means no table plexd could have made.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// `nft` could not be started (not installed: `NotFound`).
    #[error("cannot run {NFT} ({0}); install Debian's nftables package")]
    Spawn(std::io::Error),
    /// `nft` started but its exit could not be read.
    #[error("cannot run {NFT} ({0})")]
    Wait(std::io::Error),
    /// `nft` ran and refused the input; `stderr` is its output on one line (` | ` between lines).
    #[error("{NFT} refused the nat table ({status}): {stderr}")]
    Refused {
        status: std::process::ExitStatus,
        stderr: String,
    },
}

impl NftError {
    /// "No such file or directory": `nft` is not installed (the spawn failed with
    /// `NotFound`), or the kernel answered ENOENT (nothing of plexd's to remove).
    fn is_missing(&self) -> bool {
        match self {
            Self::Spawn(e) | Self::Wait(e) => e.kind() == std::io::ErrorKind::NotFound,
            Self::Refused { stderr, .. } => stderr.contains("No such file"),
        }
    }
}

/// Runs `nft -f -` with `input` (one transaction).
pub fn nft(input: &str) -> Result<(), NftError> {
    let mut child = Command::new(NFT)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(NftError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(NftError::Wait)?;
    if out.status.success() {
        return Ok(());
    }
    Err(NftError::Refused {
        status: out.status,
        stderr: String::from_utf8_lossy(&out.stderr)
            .trim()
            .replace('\n', " | "),
    })
}

/// `plexd leave` and `plexd uninstall`: the nat table goes with the interface (no nft: no
/// table plexd could have made).
pub(crate) fn remove_on_leave(iface: &str) -> Result<(), String> {
    match nft(&remove_ruleset(iface)) {
        Ok(()) => Ok(()),
        Err(e) if e.is_missing() => Ok(()),
        Err(e) => Err(format!(
            "{e}; run `nft delete table inet {}`",
            nat_table(iface)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ruleset_holds_what_is_asked() {
        let mesh: IpNet = "10.64.0.0/16".parse().expect("net");
        assert_eq!(nat_ruleset("plexd0", mesh, false, &[]), None);
        let r = nat_ruleset("plexd0", mesh, true, &[]).expect("masquerade");
        assert!(r.contains("table inet plexd_plexd0_nat {"), "{r}");
        assert!(
            r.contains("ip saddr 10.64.0.0/16 oifname != \"plexd0\" masquerade"),
            "{r}"
        );
        assert!(!r.contains("mark_out"), "{r}");
        let r = nat_ruleset("plexd0", mesh, false, &[51820, 51821]).expect("mark");
        assert!(!r.contains("masquerade"), "{r}");
        assert!(
            r.contains("udp sport { 51820, 51821 } meta mark set 0x706c ct mark set 0x706c"),
            "{r}"
        );
        assert!(r.starts_with("table inet plexd_plexd0_nat\ndelete table inet plexd_plexd0_nat\n"));
    }

    #[test]
    fn an_nft_error_reads_as_before_and_only_a_missing_one_is_no_table() {
        use std::os::unix::process::ExitStatusExt as _;
        let gone = NftError::Spawn(std::io::Error::from_raw_os_error(2));
        assert_eq!(
            gone.to_string(),
            "cannot run nft (No such file or directory (os error 2)); install Debian's nftables package"
        );
        assert!(gone.is_missing());
        let denied = NftError::Spawn(std::io::Error::from_raw_os_error(13));
        assert!(!denied.is_missing(), "{denied}");
        let refused = NftError::Refused {
            status: std::process::ExitStatus::from_raw(256),
            stderr: "Error: syntax error | table inet x".to_owned(),
        };
        assert_eq!(
            refused.to_string(),
            "nft refused the nat table (exit status: 1): Error: syntax error | table inet x"
        );
        assert!(!refused.is_missing());
        let enoent = NftError::Refused {
            status: std::process::ExitStatus::from_raw(256),
            stderr: "Error: Could not process rule: No such file or directory".to_owned(),
        };
        assert!(enoent.is_missing(), "{enoent}");
    }
}
