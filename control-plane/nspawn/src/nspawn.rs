//! The systemd-nspawn command line that boots a machine. Every flag is here for a reason:
//!
//! - `--boot`: run the image's systemd as PID 1 (real journald, real units, real cloud-init).
//! - `--register=no --keep-unit`: no machined and no transient scope; this host may not run
//!   systemd as PID 1 at all. (`--property=` then has no scope to apply to; it is kept for
//!   hosts where nspawn does create one.)
//! - `--console=read-only`: the machine's console goes to nspawn's stdout, our console.log,
//!   whether or not a terminal is attached.
//! - `--link-journal=no`: the machine's journal stays inside it (`journalctl` run by the
//!   machine's own systemd, see `crate::guest_systemd`).
//! - `--network-bridge=`: a veth pair, `host0` inside, `vb-<name>` on the host bridge.
//! - `--bind=/dev/net/tun`: TUN for plexd's userspace WireGuard data plane.

use std::ffi::OsString;
use std::path::Path;

/// The arguments of `systemd-nspawn` for machine `name` rooted at `merged` on `bridge`.
pub fn nspawn_args(merged: &Path, name: &str, bridge: &str) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["-D".into(), merged.as_os_str().to_os_string()];
    args.extend(
        [
            "--boot",
            "--register=no",
            "--keep-unit",
            "--console=read-only",
            "--link-journal=no",
            "-M",
            name,
        ]
        .map(OsString::from),
    );
    args.push(format!("--network-bridge={bridge}").into());
    args.push("--bind=/dev/net/tun".into());
    args.push("--property=DeviceAllow=/dev/net/tun rwm".into());
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_boots_on_its_bridge_with_tun() {
        let args = nspawn_args(Path::new("/s/machines/a/merged"), "a", "plexbr0");
        let args: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(args[..2], ["-D", "/s/machines/a/merged"]);
        for flag in [
            "--boot",
            "--register=no",
            "--keep-unit",
            "--console=read-only",
            "--network-bridge=plexbr0",
            "--bind=/dev/net/tun",
            "--property=DeviceAllow=/dev/net/tun rwm",
        ] {
            assert!(
                args.iter().any(|a| a == flag),
                "{flag} missing from {args:?}"
            );
        }
        let m = args.iter().position(|a| a == "-M").unwrap();
        assert_eq!(args[m + 1], "a");
    }
}
