//! What `plexd status` answers (the report the core builds; JSON for `--output json`) and the
//! one-line `STATUS=` summary systemd shows. Ages are in whole seconds at the moment the
//! daemon answered. The human table is the shell's (`daemon/status.rs`).

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::reach::io::{Path, Transport};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub node_id: Uuid,
    pub mesh_ip: IpAddr,
    pub mesh_cidr: String,
    pub domain_id: Uuid,
    pub project_id: Uuid,
    pub plexd_version: String,
    pub uptime_secs: u64,
    pub api: ApiStatus,
    pub last_heartbeat_age_secs: Option<u64>,
    pub last_event_age_secs: Option<u64>,
    pub event_stream_connected: bool,
    /// Times the event stream ended since plexd started (each is retried after a backoff).
    #[serde(default)]
    pub event_stream_disconnects: u64,
    /// The last event seq applied (the stream resumes after it).
    pub last_event_id: u64,
    pub state_version: Option<u64>,
    pub backend: String,
    pub interface: String,
    pub ingest: IngestStatus,
    pub peers: Vec<PeerStatus>,
    /// UDP GSO/GRO of the WireGuard socket (absent from older daemons).
    #[serde(default)]
    pub udp_offload: UdpOffloadStatus,
    /// The Domain signing keys the node trusts (absent from older daemons).
    #[serde(default)]
    pub domain_key: DomainKeyStatus,
    /// The GSO path probe's latest results (embedded data plane only; absent otherwise and
    /// from older daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gso_probe: Option<GsoProbeStatus>,
    /// The access policy: version, filter installed or closed, drops (absent from older
    /// daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<super::policy_status::PolicyStatus>,
    /// The resolver for mesh names (docs/dns.md): absent with `dns.enabled: false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<crate::dns::runtime::DnsStatus>,
    /// Subnet routes and exits: what this node offers, serves and routes (absent from older
    /// daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<crate::routes::status::RoutesStatus>,
}

/// The pinned Domain key and, during a rotation's overlap, the announced next one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainKeyStatus {
    /// The pinned public key, standard base64.
    pub public_key: String,
    /// Its generation; `None` for a key pinned at registration and never rotated since.
    pub generation: Option<u64>,
    /// The announced next key (generation, public key, `active_from`).
    pub next: Option<plexsphere_wire::signing_keys::SigningKey>,
}

/// What the signed state asks of UDP GSO/GRO and what the data plane's socket does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UdpOffloadStatus {
    /// The signed state's `udp_offload`: `on`, `off` or `default` (not set: on).
    pub setting: String,
    /// Whether the socket sends with UDP GSO; `None` without the embedded data plane.
    pub gso: Option<bool>,
    /// Whether the socket has `UDP_GRO` set, read back from the kernel; `None` as above.
    pub gro: Option<bool>,
    /// Whether the data plane applied the latest setting (it does within one poll interval).
    pub applied: Option<bool>,
}

/// What `plexd status` shows of the probe.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GsoProbeStatus {
    /// Rounds run since plexd started.
    pub rounds: u64,
    pub last_round_age_secs: Option<u64>,
    /// The latest result per peer.
    pub peers: Vec<GsoProbePeer>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GsoProbePeer {
    pub public_key: String,
    pub mesh_ip: IpAddr,
    /// `ok`, `segmented_lost` or `inconclusive`.
    pub verdict: String,
    /// Echo requests sent each way, and the replies to the segmented and the single ones.
    pub sent: usize,
    pub segmented_replies: usize,
    pub single_replies: usize,
    /// The inner packet size of each request (the interface MTU).
    pub size: usize,
    pub age_secs: u64,
}

/// Observations on their way to `POST /ingest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestStatus {
    /// Queued or in the batch being sent (a batch whose call failed is sent again as it is).
    pub waiting: usize,
    /// Dropped (the queue was full) and not yet reported to the control plane.
    pub dropped_unreported: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiStatus {
    pub url: String,
    /// Whether the last call reached the API and was answered.
    pub reachable: bool,
    pub last_success_age_secs: Option<u64>,
    pub last_error: Option<String>,
    pub last_error_age_secs: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerStatus {
    pub node_id: Uuid,
    pub hostname: String,
    /// WireGuard public key, standard base64.
    #[serde(default)]
    pub public_key: String,
    pub mesh_ip: IpAddr,
    /// The data plane's endpoint for the peer (a relayed peer's is the data plane's relay
    /// endpoint in `100::/64`, over UDP or on a relay's TLS link, or a loopback forwarder with
    /// the kernel backend; docs/reach.md).
    pub endpoint: Option<SocketAddr>,
    /// The path its traffic takes (the reach runtime's choice).
    #[serde(default)]
    pub path: PeerPath,
    /// The round trip of the last probe on that path, in milliseconds.
    #[serde(default)]
    pub rtt_ms: Option<u64>,
    pub last_handshake_age_secs: Option<u64>,
    /// The same age under the name the reach docs use.
    #[serde(default)]
    pub last_handshake_secs_ago: Option<u64>,
    /// Why the path is what it is ("pong in 3 ms", "3 pings unanswered").
    #[serde(default)]
    pub reason: String,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// A peer's path as status shows it: `{"kind":"direct","endpoint":"192.0.2.7:51820"}`,
/// `{"kind":"relay","relay":"r1","transport":"udp"}` or `{"kind":"none"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PeerPath {
    #[default]
    None,
    Direct {
        endpoint: SocketAddr,
    },
    Relay {
        relay: String,
        transport: PathTransport,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathTransport {
    Udp,
    Tcp,
}

impl From<&Path> for PeerPath {
    fn from(p: &Path) -> Self {
        match p {
            Path::None => Self::None,
            Path::Direct { endpoint } => Self::Direct {
                endpoint: *endpoint,
            },
            Path::Relay { relay, transport } => Self::Relay {
                relay: relay.clone(),
                transport: match transport {
                    Transport::Udp => PathTransport::Udp,
                    Transport::Tcp => PathTransport::Tcp,
                },
            },
        }
    }
}

impl std::fmt::Display for PeerPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::Direct { endpoint } => write!(f, "direct {endpoint}"),
            Self::Relay { relay, transport } => {
                let t = match transport {
                    PathTransport::Udp => "udp",
                    PathTransport::Tcp => "tcp",
                };
                write!(f, "relay {relay} over {t}")
            }
        }
    }
}

/// The one-line STATUS= summary.
pub fn status_line(node: &str, mesh_ip: &str, peers: usize, connected: bool) -> String {
    let s = if peers == 1 { "" } else { "s" };
    let stream = if connected {
        "connected"
    } else {
        "disconnected"
    };
    format!("node {node} mesh_ip {mesh_ip}: {peers} peer{s}, event stream {stream}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_line_reads_well() {
        assert_eq!(
            status_line("n1", "10.64.1.2", 3, true),
            "node n1 mesh_ip 10.64.1.2: 3 peers, event stream connected"
        );
        assert_eq!(
            status_line("n1", "10.64.1.2", 1, false),
            "node n1 mesh_ip 10.64.1.2: 1 peer, event stream disconnected"
        );
    }
}
