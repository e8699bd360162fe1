//! The interface's address, MTU and link state, set the same way for both WireGuard backends.

use super::netlink;
use super::setup::NodeSetup;
use crate::config::WireguardConfig;

/// Address, MTU and link up on the interface, for both backends.
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
