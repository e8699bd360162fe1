//! The data plane behind a small trait: apply the desired peers, read the live ones, tear
//! down. Issue 4 adds the WireGuard backends (kernel through wireguard-control, and the
//! embedded userspace data plane); today the honest implementation is `none`: control plane
//! only, no traffic carried.

use std::net::SocketAddr;
use std::time::SystemTime;

use plexsphere_wire::node::PeerSpec;

use super::peers::{self, PeerChange};
use crate::config::{Backend, WireguardConfig};

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

/// The data plane the config asks for. Until issue 4 lands every choice ends at `none`;
/// `auto` says so at warn, an explicit `kernel`/`userspace` at error (traffic was asked for).
pub fn open(cfg: &WireguardConfig) -> Box<dyn Mesh> {
    match cfg.backend {
        Backend::None => {}
        Backend::Auto => tracing::warn!(
            interface = %cfg.interface,
            "wireguard.backend auto: no WireGuard backend is built into this plexd yet; running control-plane only (backend none)"
        ),
        b @ (Backend::Kernel | Backend::Userspace) => tracing::error!(
            interface = %cfg.interface,
            backend = b.as_str(),
            "wireguard.backend {} is not built into this plexd yet; running control-plane only (backend none)",
            b.as_str()
        ),
    }
    tracing::info!(
        backend = "none",
        "control-plane only: plexd tracks and reports the desired peers but carries no mesh traffic"
    );
    Box::new(NoneMesh::default())
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
        assert_eq!(open(&WireguardConfig::default()).backend(), "none");
    }
}
