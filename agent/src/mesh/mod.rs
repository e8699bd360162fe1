//! The WireGuard mesh: the data plane behind the daemon's [`Mesh`] trait.
//!
//! - [`contract`]: what the daemon relies on ([`Mesh`], [`LivePeer`], [`MeshError`]) and the
//!   `none` backend. Peers are named by `plexsphere_wire::key::PublicKey` (one type with the
//!   data plane and reach).
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
#[cfg(target_os = "linux")]
pub mod link;
#[cfg(target_os = "linux")]
pub mod netlink;
#[cfg(target_os = "linux")]
pub mod nft;
pub mod setup;
#[cfg(target_os = "linux")]
pub mod shared_port;
#[cfg(target_os = "linux")]
pub mod userspace;
pub mod wg;
pub mod worker;

#[cfg(test)]
#[cfg(target_os = "linux")]
mod nft_life_tests;
#[cfg(test)]
#[cfg(target_os = "linux")]
mod nft_root_tests;
#[cfg(test)]
#[cfg(target_os = "linux")]
mod nft_routes_root_tests;
#[cfg(test)]
#[cfg(target_os = "linux")]
mod nft_routes_tests;
#[cfg(test)]
#[cfg(target_os = "linux")]
mod nft_tests;
#[cfg(test)]
#[cfg(target_os = "linux")]
mod reach_root_tests;
#[cfg(test)]
#[cfg(target_os = "linux")]
mod root_tests;
#[cfg(test)]
#[cfg(target_os = "linux")]
mod shared_port_root_tests;
#[cfg(test)]
#[cfg(target_os = "linux")]
mod worker_tests;

use std::sync::Arc;

use plexsphere_wire::node::PeerSpec;

use crate::config::{Backend, WireguardConfig};
pub use contract::{LivePeer, Mesh, MeshError, NoneMesh};
use diff::MeshChange;
pub use setup::{NodeSetup, OpenError};

/// The data plane `wireguard.backend` asks for. `auto` prefers the kernel module and falls
/// back to the embedded userspace data plane, saying why: when the module cannot be used, or
/// when `nft` (which the kernel backend's policy filter needs) is not on the `PATH`.
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
        Backend::Userspace => {
            no_kernel_table(cfg);
            Ok(Box::new(userspace::open(cfg, node)?))
        }
        // The kernel backend filters peers' traffic with nft; without it the filter could
        // only stay closed, so `auto` takes the userspace data plane, which filters itself.
        Backend::Auto if nft::find_nft(std::env::var_os("PATH").as_deref()).is_none() => {
            tracing::warn!(
                interface = %cfg.interface,
                "the kernel backend filters peers' traffic with {}, which is not on PATH (install Debian's nftables package to use it); using the userspace data plane",
                nft::NFT
            );
            Ok(Box::new(userspace::open(cfg, node)?))
        }
        Backend::Auto => match kernel::open(cfg, node) {
            Ok(m) => Ok(Box::new(m)),
            Err(e) => {
                tracing::warn!(interface = %cfg.interface, "{e}; using the userspace data plane");
                no_kernel_table(cfg);
                Ok(Box::new(userspace::open(cfg, node)?))
            }
        },
    }
}

/// The userspace data plane filters on its own: a table the kernel backend left on this
/// interface name (a node switched backends) would filter its TUN device with a stale view.
#[cfg(target_os = "linux")]
fn no_kernel_table(cfg: &WireguardConfig) {
    if let Err(e) = nft::remove_on_leave(&cfg.interface) {
        tracing::warn!(interface = %cfg.interface, "policy: the kernel backend's table is still there: {e}");
    }
}

/// Removes what else a run left for an interface name (the routes' tables and rules:
/// `crate::routes::remove_leftovers`, passed in so the mesh does not depend on the routes).
pub type LeftoverCleanup = fn(&str) -> Result<(), String>;

/// What `plexd leave` tears down when no daemon runs: a leftover interface, nothing started,
/// and what `also` removes for it.
pub fn for_leave(cfg: &WireguardConfig, also: LeftoverCleanup) -> Box<dyn Mesh> {
    Box::new(Leftover::new(cfg, also))
}

/// What `plexd leave` tears down when no daemon runs: the interface, if one was left.
#[derive(Debug)]
pub struct Leftover {
    cfg: WireguardConfig,
    also: LeftoverCleanup,
}

impl Leftover {
    pub fn new(cfg: &WireguardConfig, also: LeftoverCleanup) -> Self {
        Self {
            cfg: cfg.clone(),
            also,
        }
    }
}

impl Mesh for Leftover {
    fn backend(&self) -> &'static str {
        self.cfg.backend.as_str()
    }

    fn apply(&mut self, _desired: Arc<Vec<PeerSpec>>) -> Result<Vec<MeshChange>, MeshError> {
        Ok(vec![])
    }

    fn live_peers(&self) -> Result<Vec<LivePeer>, MeshError> {
        Ok(vec![])
    }

    /// A leftover interface is only torn down, never configured: nothing to filter.
    fn set_policy(
        &mut self,
        _policy: Option<&plexsphere_wire::node::PolicyState>,
    ) -> Result<(), MeshError> {
        Ok(())
    }

    #[cfg(target_os = "linux")]
    fn teardown(&mut self) -> Result<(), MeshError> {
        if self.cfg.backend == Backend::None {
            return Ok(());
        }
        let error = |what: String| MeshError {
            backend: self.backend(),
            interface: self.cfg.interface.clone(),
            what,
        };
        match netlink::delete_link(&self.cfg.interface) {
            Ok(true) => {
                tracing::info!(interface = %self.cfg.interface, "removed the WireGuard interface");
            }
            Ok(false) => {}
            Err(e) => {
                return Err(error(format!(
                    "cannot delete the interface ({e}); run `ip link del {}`",
                    self.cfg.interface
                )));
            }
        }
        // The routes' nat table and exit rules a crashed run may have left.
        if let Err(e) = (self.also)(&self.cfg.interface) {
            tracing::warn!(interface = %self.cfg.interface, "routes: {e}");
        }
        // The kernel backend's policy table (`nft`); any backend may have left one behind.
        nft::remove_on_leave(&self.cfg.interface).map_err(error)
    }

    #[cfg(not(target_os = "linux"))]
    fn teardown(&mut self) -> Result<(), MeshError> {
        Ok(())
    }
}
