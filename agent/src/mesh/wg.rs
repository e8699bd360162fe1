//! The kernel backend's way to the interface: read the live peers and apply a [`MeshUpdate`]
//! through `wireguard-control` (`Backend::Kernel` over netlink; `Backend::Userspace` over a
//! UAPI socket works too, which the bench's "before" used). Every call here blocks; only the
//! mesh worker thread makes them. The userspace backend writes into its data plane directly
//! (`super::userspace::DirectControl`).

use std::io;
use std::str::FromStr as _;

use ipnet::IpNet;
use wireguard_control::PeerConfigBuilder;
use wireguard_control::{AllowedIp, Backend, Device, DeviceUpdate, InterfaceName, Key};

use super::diff::{LiveConfig, MeshUpdate, PeerOp, PublicKey};

/// An interface and the backend that configures it.
#[derive(Debug, Clone, Copy)]
pub struct WgControl {
    pub iface: InterfaceName,
    pub backend: Backend,
}

/// The interface name as wireguard-control wants it.
pub fn iface_name(name: &str) -> io::Result<InterfaceName> {
    InterfaceName::from_str(name).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{name}` is not an interface name ({e})"),
        )
    })
}

fn allowed(ip: &IpNet) -> AllowedIp {
    AllowedIp {
        address: ip.addr(),
        cidr: ip.prefix_len(),
    }
}

/// Our update as wireguard-control's: removals and per-peer changes, never `replace_peers`
/// (that would drop every session for one change).
pub fn to_device_update(update: &MeshUpdate) -> DeviceUpdate {
    let mut out = DeviceUpdate::new();
    for op in &update.ops {
        out = match op {
            PeerOp::Remove(key) => out.remove_peer_by_key(&Key(key.0)),
            PeerOp::Set {
                key,
                endpoint,
                allowed_ips,
                keepalive,
            } => {
                let mut b = PeerConfigBuilder::new(&Key(key.0));
                if let Some(ep) = endpoint {
                    b = b.set_endpoint(*ep);
                }
                if let Some(ips) = allowed_ips {
                    let ips: Vec<AllowedIp> = ips.iter().map(allowed).collect();
                    b = b.replace_allowed_ips().add_allowed_ips(&ips);
                }
                if let Some(k) = keepalive {
                    b = b.set_persistent_keepalive_interval(*k);
                }
                out.add_peer(b)
            }
        };
    }
    out
}

impl super::worker::Control for WgControl {
    fn live(&self) -> io::Result<Vec<LiveConfig>> {
        WgControl::live(self)
    }

    fn apply(&self, update: &MeshUpdate) -> io::Result<()> {
        WgControl::apply(self, update)
    }

    fn set_private_key(&self, key: [u8; 32]) -> io::Result<()> {
        DeviceUpdate::new()
            .set_private_key(Key(key))
            .apply(&self.iface, self.backend)
    }

    /// The nftables table of the interface (`super::nft`); elsewhere than Linux there is
    /// none, so a policy is refused (the daemon then applies no peers: fail closed).
    fn set_policy(&self, policy: Option<&plexsphere_wire::node::PolicyState>) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            super::nft::set_policy(&self.iface.as_str_lossy(), policy)
        }
        #[cfg(not(target_os = "linux"))]
        match policy {
            None => Ok(()),
            Some(p) => Err(io::Error::other(format!(
                "policy enforcement needs nftables (Linux); policy version {} is not enforced, so no peer is configured",
                p.version
            ))),
        }
    }

    /// The table is back if an `nft flush ruleset` (or anything else) removed it.
    #[cfg(target_os = "linux")]
    fn restore_policy(&self, policy: &plexsphere_wire::node::PolicyState) -> io::Result<bool> {
        super::nft::restore(&self.iface.as_str_lossy(), policy)
    }
}

impl WgControl {
    /// The peers on the interface, with their counters.
    pub fn live(&self) -> io::Result<Vec<LiveConfig>> {
        let dev = Device::get(&self.iface, self.backend)?;
        Ok(dev
            .peers
            .into_iter()
            .map(|p| LiveConfig {
                key: PublicKey(p.config.public_key.0),
                endpoint: p.config.endpoint,
                allowed_ips: p
                    .config
                    .allowed_ips
                    .iter()
                    .filter_map(|a| IpNet::new(a.address, a.cidr).ok())
                    .collect(),
                keepalive: p.config.persistent_keepalive_interval.unwrap_or(0),
                last_handshake: p.stats.last_handshake_time,
                rx_bytes: p.stats.rx_bytes,
                tx_bytes: p.stats.tx_bytes,
            })
            .collect())
    }

    /// Applies a peer update (nothing for an empty one).
    pub fn apply(&self, update: &MeshUpdate) -> io::Result<()> {
        if update.is_empty() {
            return Ok(());
        }
        to_device_update(update).apply(&self.iface, self.backend)
    }

    /// Sets the interface's private key and listen port.
    pub fn set_identity(&self, private_key: [u8; 32], listen_port: u16) -> io::Result<()> {
        DeviceUpdate::new()
            .set_private_key(Key(private_key))
            .set_listen_port(listen_port)
            .apply(&self.iface, self.backend)
    }

    /// The listen port the interface reports.
    pub fn listen_port(&self) -> io::Result<Option<u16>> {
        Ok(Device::get(&self.iface, self.backend)?.listen_port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_each_operation() {
        let ep = "192.0.2.1:51820".parse().unwrap();
        let update = MeshUpdate {
            ops: vec![
                PeerOp::Remove(PublicKey([1; 32])),
                PeerOp::Set {
                    key: PublicKey([2; 32]),
                    endpoint: Some(ep),
                    allowed_ips: Some(vec!["10.64.0.2/32".parse().unwrap()]),
                    keepalive: Some(0),
                },
                PeerOp::Set {
                    key: PublicKey([3; 32]),
                    endpoint: None,
                    allowed_ips: None,
                    keepalive: None,
                },
            ],
        };
        let u = to_device_update(&update);
        // DeviceUpdate keeps its fields private; its Debug shows what will be sent.
        let text = format!("{u:?}");
        assert!(text.contains("remove_me: true"), "{text}");
        assert!(text.contains("replace_allowed_ips: true"), "{text}");
        assert!(text.contains("192.0.2.1:51820"), "{text}");
        assert!(
            text.contains("persistent_keepalive_interval: Some(0)"),
            "{text}"
        );
        assert!(!text.contains("replace_peers: true"), "{text}");
        assert_eq!(text.matches("PeerConfigBuilder").count(), 3, "{text}");
        assert!(iface_name("plexd0").is_ok());
        assert!(iface_name("much-too-long-for-linux").is_err());
    }
}
