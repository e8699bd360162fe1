//! The WireGuard mesh: the data plane behind the daemon's [`Mesh`] trait.
//!
//! - [`contract`]: what the daemon relies on ([`Mesh`], [`LivePeer`], [`MeshError`]) and the
//!   `none` backend; [`key`]: the public key type the diff and the rotation share.
//! - [`diff`]: the pure peer reconcile (desired peers vs the live interface -> the minimal
//!   update and the journal's list of changes), with [`endpoints`] choosing each peer's
//!   endpoint among its candidates.
//! - [`wg`]: the one wireguard-control code path both backends use; [`worker`]: the thread
//!   that makes those blocking calls and reconciles periodically.
//! - [`kernel`] (the `wireguard` module over netlink) and [`userspace`] (the embedded data
//!   plane in this process), chosen by `wireguard.backend` in [`open`]; [`netlink`] sets the
//!   interface's address, MTU and link state for both.
//!
//! The interface keeps the mesh IP with the mesh prefix (so the kernel routes the whole mesh
//! range to it), MTU `wireguard.mtu` (1420), link up. `plexd leave` removes it; SIGTERM leaves
//! it as it is, and a starting plexd adopts an existing interface of that name.

pub mod contract;
pub mod diff;
pub mod endpoints;
#[cfg(target_os = "linux")]
pub mod kernel;
pub mod key;
#[cfg(target_os = "linux")]
pub mod netlink;
#[cfg(target_os = "linux")]
pub mod userspace;
pub mod wg;
pub mod worker;

#[cfg(test)]
#[cfg(target_os = "linux")]
mod root_tests;

use std::fmt;
use std::net::IpAddr;

use plexsphere_wire::node::PeerSpec;

use crate::config::{Backend, WireguardConfig};
pub use contract::{LivePeer, Mesh, MeshError, NoneMesh};
use diff::MeshChange;

/// What the interface needs from the node's identity and key.
#[derive(Clone)]
pub struct NodeSetup {
    private_key: [u8; 32],
    pub mesh_ip: IpAddr,
    /// The mesh range's prefix length (from `mesh_cidr`).
    pub prefix: u8,
}

impl fmt::Debug for NodeSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NodeSetup({}/{}, private key <redacted>)",
            self.mesh_ip, self.prefix
        )
    }
}

impl NodeSetup {
    pub fn new(private_key: [u8; 32], mesh_ip: IpAddr, prefix: u8) -> Self {
        Self {
            private_key,
            mesh_ip,
            prefix,
        }
    }

    pub(crate) fn private_key(&self) -> [u8; 32] {
        self.private_key
    }
}

/// Why no data plane could be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The config asks for something this host cannot do (exit 78: restarting will not help).
    #[error("{0}")]
    Config(String),
    /// `wireguard.backend: kernel` on a host without the module.
    #[error("{0}")]
    ModuleMissing(String),
    /// The host refused (permissions, a port in use, no /dev/net/tun): worth a restart.
    #[error("{0}")]
    Runtime(String),
}

impl OpenError {
    /// True when a restart with the same config cannot help.
    pub fn is_config(&self) -> bool {
        matches!(self, OpenError::Config(_) | OpenError::ModuleMissing(_))
    }
}

/// Address, MTU and link up on the interface, for both backends.
#[cfg(target_os = "linux")]
pub(crate) fn setup_link(cfg: &WireguardConfig, node: &NodeSetup) -> Result<(), String> {
    let name = &cfg.interface;
    let index = netlink::index(name)
        .map_err(|e| format!("cannot look up {name} ({e})"))?
        .ok_or_else(|| format!("the interface {name} vanished while it was being set up"))?;
    netlink::set_address(index, node.mesh_ip, node.prefix).map_err(|e| {
        format!(
            "cannot set the address {}/{} on {name} ({e})",
            node.mesh_ip, node.prefix
        )
    })?;
    netlink::set_mtu_up(index, u32::from(cfg.mtu))
        .map_err(|e| format!("cannot set MTU {} and bring {name} up ({e})", cfg.mtu))?;
    tracing::info!(interface = %name, address = %format!("{}/{}", node.mesh_ip, node.prefix), mtu = cfg.mtu, "interface {name} up with {}/{}, MTU {}", node.mesh_ip, node.prefix, cfg.mtu);
    Ok(())
}

/// The data plane `wireguard.backend` asks for. `auto` prefers the kernel module and falls
/// back to the embedded userspace data plane, saying why.
#[cfg(target_os = "linux")]
pub fn open(cfg: &WireguardConfig, node: &NodeSetup) -> Result<Box<dyn Mesh>, OpenError> {
    match cfg.backend {
        Backend::None => {
            tracing::info!(
                backend = "none",
                "control-plane only: plexd tracks and reports the desired peers but carries no mesh traffic"
            );
            Ok(Box::new(NoneMesh::default()))
        }
        Backend::Kernel => match kernel::open(cfg, node) {
            Ok(m) => Ok(Box::new(m)),
            Err(OpenError::ModuleMissing(why)) => Err(OpenError::ModuleMissing(format!(
                "wireguard.backend is kernel, but {why}; install or load the module (`modprobe wireguard`), or set wireguard.backend: auto to use the userspace data plane"
            ))),
            Err(e) => Err(e),
        },
        Backend::Userspace => Ok(Box::new(userspace::open(cfg, node)?)),
        Backend::Auto => match kernel::open(cfg, node) {
            Ok(m) => Ok(Box::new(m)),
            Err(e) => {
                tracing::warn!(interface = %cfg.interface, "{e}; using the userspace data plane");
                Ok(Box::new(userspace::open(cfg, node)?))
            }
        },
    }
}

/// What `plexd leave` tears down when no daemon runs: a leftover interface, nothing started.
pub fn for_leave(cfg: &WireguardConfig) -> Box<dyn Mesh> {
    Box::new(Leftover::new(cfg))
}

/// What `plexd leave` tears down when no daemon runs: the interface, if one was left.
#[derive(Debug)]
pub struct Leftover {
    cfg: WireguardConfig,
}

impl Leftover {
    pub fn new(cfg: &WireguardConfig) -> Self {
        Self { cfg: cfg.clone() }
    }
}

impl Mesh for Leftover {
    fn backend(&self) -> &'static str {
        self.cfg.backend.as_str()
    }

    fn apply(&mut self, _desired: &[PeerSpec]) -> Result<Vec<MeshChange>, MeshError> {
        Ok(vec![])
    }

    fn live_peers(&self) -> Result<Vec<LivePeer>, MeshError> {
        Ok(vec![])
    }

    #[cfg(target_os = "linux")]
    fn teardown(&mut self) -> Result<(), MeshError> {
        if self.cfg.backend == Backend::None {
            return Ok(());
        }
        match netlink::delete_link(&self.cfg.interface) {
            Ok(true) => {
                tracing::info!(interface = %self.cfg.interface, "removed the WireGuard interface");
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => Err(MeshError {
                backend: self.backend(),
                interface: self.cfg.interface.clone(),
                what: format!(
                    "cannot delete the interface ({e}); run `ip link del {}`",
                    self.cfg.interface
                ),
            }),
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn teardown(&mut self) -> Result<(), MeshError> {
        Ok(())
    }
}
