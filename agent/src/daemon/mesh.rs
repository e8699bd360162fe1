//! The data plane behind a small trait: apply the desired peers, read the live ones, tear
//! down. The WireGuard backends (kernel through wireguard-control, and the embedded userspace
//! data plane) live in `crate::mesh`; `none` (control plane only, no traffic) lives here.

use std::net::SocketAddr;
use std::time::SystemTime;

use plexsphere_wire::node::PeerSpec;

use super::peers::{self, PeerChange};
use crate::config::WireguardConfig;

/// A peer as the interface sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePeer {
    pub public_key: String,
    pub endpoint: Option<SocketAddr>,
    pub last_handshake: Option<SystemTime>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("the {backend} data plane on {interface}: {what}")]
pub struct MeshError {
    pub backend: &'static str,
    pub interface: String,
    pub what: String,
}

/// A data plane. Calls are quick for `none`; blocking backends run them on a blocking thread.
pub trait Mesh: Send {
    /// `none`, `kernel` or `userspace`.
    fn backend(&self) -> &'static str;
    /// Makes the interface's peers equal to `desired`; returns what changed.
    fn apply(&mut self, desired: &[PeerSpec]) -> Result<Vec<PeerChange>, MeshError>;
    /// The peers as configured on the interface, with their counters.
    fn live_peers(&self) -> Result<Vec<LivePeer>, MeshError>;
    /// Removes the interface (leave). SIGTERM never calls this: the mesh keeps working.
    fn teardown(&mut self) -> Result<(), MeshError>;
}

/// `wireguard.backend: none`: records the desired peers, reports no handshakes.
#[derive(Debug, Default)]
pub struct NoneMesh {
    peers: Vec<PeerSpec>,
}

impl Mesh for NoneMesh {
    fn backend(&self) -> &'static str {
        "none"
    }

    fn apply(&mut self, desired: &[PeerSpec]) -> Result<Vec<PeerChange>, MeshError> {
        let changes = peers::diff(&self.peers, desired);
        self.peers = desired.to_vec();
        Ok(changes)
    }

    fn live_peers(&self) -> Result<Vec<LivePeer>, MeshError> {
        Ok(self
            .peers
            .iter()
            .map(|p| LivePeer {
                public_key: p.public_key.clone(),
                endpoint: peers::first_endpoint(p),
                last_handshake: None,
                rx_bytes: 0,
                tx_bytes: 0,
            })
            .collect())
    }

    fn teardown(&mut self) -> Result<(), MeshError> {
        self.peers.clear();
        Ok(())
    }
}

/// The data plane the config asks for (see `crate::mesh::open`): `kernel`, `userspace`,
/// `auto` (the kernel module when present, else userspace) or `none`.
pub fn open(
    cfg: &WireguardConfig,
    node: &crate::mesh::NodeSetup,
) -> Result<Box<dyn Mesh>, crate::mesh::OpenError> {
    crate::mesh::open(cfg, node)
}

/// What `plexd leave` tears down when no daemon runs: a leftover interface, nothing started.
pub fn for_leave(cfg: &WireguardConfig) -> Box<dyn Mesh> {
    Box::new(crate::mesh::Leftover::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::super::accept::tests::peer;
    use super::*;

    #[test]
    fn none_records_peers_and_reports_no_handshakes() {
        let mut m = NoneMesh::default();
        let changes = m.apply(&[peer(3), peer(4)]).unwrap();
        assert_eq!(changes.len(), 2);
        assert!(m.apply(&[peer(3), peer(4)]).unwrap().is_empty());
        let live = m.live_peers().unwrap();
        assert_eq!(live.len(), 2);
        assert!(
            live.iter()
                .all(|p| p.last_handshake.is_none() && p.rx_bytes == 0)
        );
        assert_eq!(live[0].endpoint, peer(3).endpoints.first().copied());
        let removed = m.apply(&[]).unwrap();
        assert!(matches!(removed[0], PeerChange::Removed(_)));
        m.teardown().unwrap();
        assert!(m.live_peers().unwrap().is_empty());
        let none = WireguardConfig {
            backend: crate::config::Backend::None,
            ..WireguardConfig::default()
        };
        let node = crate::mesh::NodeSetup::new([1; 32], "10.64.0.2".parse().unwrap(), 16);
        assert_eq!(open(&none, &node).unwrap().backend(), "none");
        assert_eq!(for_leave(&none).backend(), "none");
    }
}
