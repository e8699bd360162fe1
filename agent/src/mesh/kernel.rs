//! The kernel backend: the `wireguard` module through `wireguard-control`'s netlink backend.
//! Creates the interface (or adopts an existing WireGuard interface of that name), sets the
//! node's private key and listen port, then the address, MTU and link state.

use std::io;

use wireguard_control::{Backend, DeviceUpdate};

use super::link::setup_link;
use super::netlink;
use super::setup::{NodeSetup, OpenError};
use super::wg::{WgControl, iface_name};
use super::worker::{Plane, WgMesh};
use crate::config::WireguardConfig;

/// EOPNOTSUPP: what RTM_NEWLINK answers for a link kind no module provides.
const EOPNOTSUPP: i32 = 95;
/// EPERM.
const EPERM: i32 = 1;

/// Why the kernel backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "the wireguard kernel module is missing (RTM_NEWLINK kind wireguard for {iface}: {source}; the kernel found no module to load, as `modprobe wireguard` would)"
    )]
    ModuleMissing { iface: String, source: io::Error },
    #[error(
        "an interface named {iface} exists but is of kind {kind}, not wireguard; remove it (`ip link del {iface}`) or set wireguard.interface to another name"
    )]
    NotWireguard { iface: String, kind: String },
    #[error("cannot {what} {iface} ({source}){hint}")]
    Io {
        what: &'static str,
        iface: String,
        source: io::Error,
        hint: &'static str,
    },
}

fn io_err(what: &'static str, iface: &str, source: io::Error) -> KernelError {
    let hint = if source.raw_os_error() == Some(EPERM) {
        "; plexd needs CAP_NET_ADMIN (run it as root or through its systemd unit)"
    } else {
        ""
    };
    KernelError::Io {
        what,
        iface: iface.to_owned(),
        source,
        hint,
    }
}

/// Creates or adopts the kernel interface; see the module docs.
pub fn create(cfg: &WireguardConfig) -> Result<WgControl, KernelError> {
    let name = &cfg.interface;
    let iface = iface_name(name).map_err(|e| io_err("name", name, e))?;
    match netlink::link(name).map_err(|e| io_err("look up", name, e))? {
        Some(l) if l.kind.as_deref() == Some("wireguard") => {
            tracing::info!(interface = %name, "adopting the existing kernel WireGuard interface");
        }
        Some(l) => {
            return Err(KernelError::NotWireguard {
                iface: name.clone(),
                kind: l.kind.unwrap_or_else(|| "none".to_owned()),
            });
        }
        None => {
            // An empty update only creates the link (RTM_NEWLINK kind wireguard).
            DeviceUpdate::new()
                .apply(&iface, Backend::Kernel)
                .map_err(|source| match source.raw_os_error() {
                    Some(EOPNOTSUPP) => KernelError::ModuleMissing {
                        iface: name.clone(),
                        source,
                    },
                    _ => io_err("create the kernel WireGuard interface", name, source),
                })?;
            tracing::info!(interface = %name, "created the kernel WireGuard interface");
        }
    }
    Ok(WgControl {
        iface,
        backend: Backend::Kernel,
    })
}

struct KernelPlane {
    iface: String,
}

impl Plane for KernelPlane {
    fn check(&mut self) -> Result<(), String> {
        Ok(())
    }

    fn teardown(&mut self) -> Result<(), String> {
        match netlink::delete_link(&self.iface) {
            Ok(true) => {
                tracing::info!(interface = %self.iface, "removed the WireGuard interface");
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => Err(format!(
                "cannot delete the interface ({e}); run `ip link del {}`",
                self.iface
            )),
        }
    }
}

/// The kernel backend, configured and running.
pub fn open(cfg: &WireguardConfig, node: &NodeSetup) -> Result<WgMesh, OpenError> {
    let ctl = create(cfg).map_err(|e| match e {
        KernelError::ModuleMissing { .. } => OpenError::ModuleMissing(e.to_string()),
        KernelError::NotWireguard { .. } => OpenError::Config(e.to_string()),
        KernelError::Io { .. } => OpenError::Runtime(e.to_string()),
    })?;
    ctl.set_identity(node.private_key(), cfg.listen_port)
        .map_err(|e| {
            OpenError::Runtime(format!(
                "cannot set the private key and listen port {} on {} ({e}); is the port in use?",
                cfg.listen_port, cfg.interface
            ))
        })?;
    setup_link(cfg, node).map_err(OpenError::Runtime)?;
    WgMesh::start(
        "kernel",
        &cfg.interface,
        ctl,
        KernelPlane {
            iface: cfg.interface.clone(),
        },
    )
    .map_err(|e| OpenError::Runtime(e.to_string()))
}
