//! The mesh contract the daemon drives: the [`Mesh`] trait (make the interface's peers equal
//! to the wanted ones, read the live peers, tear down), [`LivePeer`], [`MeshError`], and the
//! `none` backend ([`NoneMesh`]: control plane only, no traffic). The WireGuard backends
//! implement it in [`super::worker`].
//!
//! What `apply` returns is what the one diff ([`super::diff::diff`]) found: the changes it
//! made on the interface, never a second diff of the wanted sets.

use crate::reach::io::{NoReach, ReachHandle};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use plexsphere_wire::node::{PeerSpec, PolicyState};

use super::diff::{self, LiveConfig, MeshChange, PeerOp};
use super::endpoints::EndpointBook;

/// A peer as the interface sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePeer {
    pub public_key: String,
    pub endpoint: Option<SocketAddr>,
    pub last_handshake: Option<SystemTime>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

impl From<&LiveConfig> for LivePeer {
    fn from(l: &LiveConfig) -> Self {
        LivePeer {
            public_key: l.key.to_base64(),
            endpoint: l.endpoint,
            last_handshake: l.last_handshake,
            rx_bytes: l.rx_bytes,
            tx_bytes: l.tx_bytes,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {backend} data plane on {interface}: {what}")]
pub struct MeshError {
    pub backend: &'static str,
    pub interface: String,
    pub what: String,
}

/// A data plane. Calls may block (the WireGuard backends wait for their worker thread with a
/// bound); the daemon makes them on its mesh thread, never on its event loop.
pub trait Mesh: Send {
    /// `none`, `kernel` or `userspace`.
    fn backend(&self) -> &'static str;
    /// Makes the interface's peers equal to `desired`; returns what changed on it. The set
    /// is shared, not copied: a WireGuard backend hands it to its worker thread as it is.
    fn apply(&mut self, desired: Arc<Vec<PeerSpec>>) -> Result<Vec<MeshChange>, MeshError>;
    /// The peers as configured on the interface, with their counters.
    fn live_peers(&self) -> Result<Vec<LivePeer>, MeshError>;
    /// Removes the interface (leave). SIGTERM never calls this: the mesh keeps working.
    fn teardown(&mut self) -> Result<(), MeshError>;
    /// Installs the access policy's filter (the signed state's `policy`): every packet a peer
    /// sends is checked against what the view lets it open on this node, and what this node
    /// sends against what it may open (docs/policy.md "On the node"). `None` (a server older
    /// than policies) removes the filter: every peer reaches every port, as before.
    ///
    /// Fail closed: on `Err` the backend lets no packet from a peer through (a closed
    /// filter, or no filter and the caller applies no peers; see `daemon::mesh_thread`), and
    /// the daemon says so in its journal, metrics and `plexd status`. There is deliberately
    /// no default: a WireGuard backend that forgot this would run unfiltered.
    fn set_policy(&mut self, policy: Option<&PolicyState>) -> Result<(), MeshError>;
    /// Replaces the interface's private key (a key rotation): the peers stay and handshake
    /// again with the new key; the reach runtime takes it too. Backends without a key (`none`)
    /// have nothing to change.
    fn set_private_key(&mut self, _key: [u8; 32]) -> Result<(), MeshError> {
        Ok(())
    }
    /// The reach runtime of this interface (paths, relays, STUN); the daemon takes it once at
    /// start, before the mesh moves to its thread. Backends without one answer [`NoReach`].
    fn reach(&self) -> Arc<dyn ReachHandle> {
        Arc::new(NoReach)
    }
    /// The switch of the data plane's UDP GSO/GRO (the signed state's `udp_offload`), taken
    /// once at start like [`Mesh::reach`]. Only the embedded data plane has one; the kernel
    /// module decides its offloads itself.
    fn udp_offload(&self) -> Option<Arc<plexd_dataplane::UdpOffloadSwitch>> {
        None
    }
    /// The data plane's segmentation probe (does the path carry GSO super-datagrams?), taken
    /// once at start like [`Mesh::udp_offload`]. Only the embedded data plane has one; the
    /// kernel backend does not probe.
    fn gso_prober(&self) -> Option<plexd_dataplane::Prober> {
        None
    }
    /// The policy filter's drop counters and flow table, taken once at start like
    /// [`Mesh::udp_offload`]. Only the embedded data plane counts per packet here.
    fn policy_reader(&self) -> Option<plexd_dataplane::PolicyReader> {
        None
    }
}

/// `wireguard.backend: none`: an interface in memory. It runs the same diff as the real
/// backends (each peer at its first candidate endpoint: nothing ever completes a handshake
/// here, so nothing rotates) and reports no handshakes.
#[derive(Debug, Default)]
pub struct NoneMesh {
    peers: Vec<LiveConfig>,
    /// The policy version last set (nothing carries packets here, so nothing is filtered).
    policy: Option<u64>,
}

impl NoneMesh {
    /// The version of the policy last set (tests check the daemon's order through it).
    pub fn policy_version(&self) -> Option<u64> {
        self.policy
    }
}

impl Mesh for NoneMesh {
    fn backend(&self) -> &'static str {
        "none"
    }

    fn apply(&mut self, desired: Arc<Vec<PeerSpec>>) -> Result<Vec<MeshChange>, MeshError> {
        let d = diff::diff(
            &desired,
            &self.peers,
            &mut EndpointBook::new(),
            Instant::now(),
            SystemTime::UNIX_EPOCH,
        );
        for op in d.update.ops {
            match op {
                PeerOp::Remove(key) => self.peers.retain(|p| p.key != key),
                PeerOp::Set {
                    key,
                    endpoint,
                    allowed_ips,
                    keepalive,
                } => {
                    let at = match self.peers.iter().position(|p| p.key == key) {
                        Some(i) => i,
                        None => {
                            self.peers.push(LiveConfig {
                                key,
                                endpoint: None,
                                allowed_ips: vec![],
                                keepalive: 0,
                                last_handshake: None,
                                rx_bytes: 0,
                                tx_bytes: 0,
                            });
                            self.peers.len() - 1
                        }
                    };
                    let p = &mut self.peers[at];
                    if endpoint.is_some() {
                        p.endpoint = endpoint;
                    }
                    if let Some(ips) = allowed_ips {
                        p.allowed_ips = ips;
                    }
                    if let Some(k) = keepalive {
                        p.keepalive = k;
                    }
                }
            }
        }
        Ok(d.changes)
    }

    fn live_peers(&self) -> Result<Vec<LivePeer>, MeshError> {
        Ok(self.peers.iter().map(LivePeer::from).collect())
    }

    fn teardown(&mut self) -> Result<(), MeshError> {
        self.peers.clear();
        Ok(())
    }

    /// No packet ever crosses this backend: the version is kept, nothing is installed.
    fn set_policy(&mut self, policy: Option<&PolicyState>) -> Result<(), MeshError> {
        self.policy = policy.map(|p| p.version);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(n: u8) -> PeerSpec {
        use base64::Engine as _;
        PeerSpec {
            node_id: uuid::Uuid::from_u128(u128::from(n)),
            hostname: format!("node-{n}"),
            public_key: base64::engine::general_purpose::STANDARD.encode([n; 32]),
            mesh_ip: std::net::IpAddr::from([10, 64, 1, n]),
            allowed_ips: vec![format!("10.64.1.{n}/32").parse().unwrap()],
            endpoints: vec![format!("192.0.2.{n}:51820").parse().unwrap()],
            persistent_keepalive_secs: None,
            home_relay: None,
            dns_name: None,
        }
    }

    #[test]
    fn none_records_peers_and_reports_no_handshakes() {
        let mut m = NoneMesh::default();
        let changes = m.apply(Arc::new(vec![peer(3), peer(4)])).unwrap();
        assert_eq!(changes.len(), 2);
        assert!(
            m.apply(Arc::new(vec![peer(3), peer(4)]))
                .unwrap()
                .is_empty()
        );
        let live = m.live_peers().unwrap();
        assert_eq!(live.len(), 2);
        assert!(
            live.iter()
                .all(|p| p.last_handshake.is_none() && p.rx_bytes == 0)
        );
        assert!(
            live.iter()
                .any(|l| l.endpoint == peer(3).endpoints.first().copied())
        );
        let removed = m.apply(Arc::default()).unwrap();
        assert!(matches!(removed[0], MeshChange::Removed { .. }));
        m.teardown().unwrap();
        assert!(m.live_peers().unwrap().is_empty());
    }
}
