//! The node API: what an enrolled plexd sends and receives after registration, authenticated
//! with `Authorization: Bearer pxnk_...` (the credential registration handed out).
//!
//! | call | path |
//! |---|---|
//! | heartbeat | `POST /v1/nodes/{id}/heartbeat` ([`Heartbeat`] -> [`HeartbeatAck`]) |
//! | endpoint report | `POST /v1/nodes/{id}/endpoints` ([`EndpointReport`] -> [`EndpointAck`]) |
//! | state pull | `GET /v1/nodes/{id}/state` (`If-None-Match: "<version>"` -> 304, or a [`crate::signed::SignedEnvelope`] of [`NodeState`] with an `ETag`) |
//! | event stream | `GET /v1/nodes/{id}/events` (SSE; `id:` = [`Event::seq`], `data:` = a signed envelope of [`Event`]) |
//! | ingest | `POST /v1/nodes/{id}/ingest` ([`IngestBatch`] -> 202) |
//! | leave | `DELETE /v1/nodes/{id}` (-> 204) |

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::register::Intervals;

/// The largest body a node call accepts, in bytes.
pub const MAX_NODE_BODY: usize = 256 * 1024;
/// The persistent keepalive plexd sets towards a peer when a side is behind NAT, in seconds.
pub const NAT_KEEPALIVE_SECS: u16 = 25;
/// The server sends an SSE keep-alive comment this often, in seconds (inside a 15 s proxy idle timeout).
pub const SSE_KEEPALIVE_SECS: u64 = 10;

/// `POST /v1/nodes/{id}/heartbeat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    pub uptime_secs: u64,
    pub plexd_version: String,
    /// The version of the last signed state the node applied, if any.
    #[serde(default)]
    pub state_version: Option<u64>,
    pub peers: PeerSummary,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerSummary {
    /// Peers configured on the interface.
    pub configured: u32,
    /// Peers with a handshake in the last 3 minutes.
    pub connected: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatAck {
    /// The newest state version the server has for this node: pull when it differs.
    pub state_version: u64,
    /// The intervals the node should use from now on.
    pub intervals: Intervals,
    /// A fresh relay token (see [`NodeState::relay_token`]); a node uses the newest it has,
    /// so a token never runs out while the node heartbeats.
    #[serde(default)]
    pub relay_token: Option<crate::signed::SignedEnvelope>,
    /// An operator asked this node to rotate its WireGuard key (`plexctl node rotate-key`);
    /// the node does it by itself ([`crate::rotation`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rotate_key: bool,
    /// An operator asked this node to rotate its credential.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rotate_credential: bool,
}

/// `POST /v1/nodes/{id}/endpoints`: the node's own view of where it can be reached.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointReport {
    pub listen_port: u16,
    /// Local (interface) addresses, without loopback, link-local or the mesh address.
    pub addresses: Vec<IpAddr>,
    /// Reflexive candidates: where STUN servers saw the WireGuard socket come from.
    #[serde(default)]
    pub reflexive: Vec<SocketAddr>,
    /// The relay (by [`RelaySpec::name`]) this node keeps a connection to, if any.
    #[serde(default)]
    pub home_relay: Option<String>,
    /// What the node's NAT does to its mappings, as the node measured it.
    #[serde(default)]
    pub nat: NatReport,
}

/// The most addresses (local plus reflexive) one endpoint report may carry.
pub const MAX_CANDIDATES: usize = 16;

/// What the node measured of its NAT with two STUN servers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatReport {
    pub mapping: NatMapping,
    /// No STUN server answered over UDP (the node's network may block UDP).
    #[serde(default)]
    pub udp_blocked: bool,
}

/// How the node's NAT maps its WireGuard socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NatMapping {
    /// Not measured (fewer than two STUN servers answered).
    #[default]
    Unknown,
    /// The reflexive address equals a local one: no NAT.
    None,
    /// One mapping for every destination: direct paths can be punched.
    EndpointIndependent,
    /// A new mapping per destination: peers reach this node through a relay, or directly
    /// only when the other side has no NAT.
    EndpointDependent,
}

/// One relay a node may use, as its signed state lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySpec {
    /// Unique within the Domain; what `home_relay` names.
    pub name: String,
    /// The relay's X25519 public key, standard base64 (registration proofs are made with it).
    pub public_key: String,
    /// Where it takes relay frames (and STUN) over UDP.
    #[serde(default)]
    pub udp: Option<SocketAddr>,
    /// Where it takes relay frames over TCP with TLS (normally port 443).
    #[serde(default)]
    pub tls: Option<SocketAddr>,
    /// The name its TLS certificate is checked against (the node's CA settings apply).
    #[serde(default)]
    pub tls_server_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointAck {
    /// The reflexive candidate: the address the server saw the report come from, with the
    /// node's listen port.
    pub observed: SocketAddr,
    /// Every endpoint the server now advertises for this node, best first.
    pub endpoints: Vec<SocketAddr>,
}

/// One peer in a node's desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerSpec {
    pub node_id: Uuid,
    pub hostname: String,
    /// WireGuard public key, standard base64.
    pub public_key: String,
    pub mesh_ip: IpAddr,
    /// What the peer may send from and what this node sends to it: its mesh IPs as host
    /// routes first, then the subnet routes this node reaches through the peer (it is their
    /// primary router and the policy lets this node use them), then `0.0.0.0/0` and `::/0`
    /// when this node uses the peer as its exit (docs/routes.md).
    pub allowed_ips: Vec<IpNet>,
    /// Candidate endpoints, best first (reported local addresses, then the reflexive one).
    pub endpoints: Vec<SocketAddr>,
    #[serde(default)]
    pub persistent_keepalive_secs: Option<u16>,
    /// The relay the peer keeps a connection to (a [`RelaySpec::name`] of this state).
    #[serde(default)]
    pub home_relay: Option<String>,
    /// The peer's DNS label in its Domain (unique there): it answers as
    /// `<dns_name>.<NodeState::dns suffix>`. Absent from a server older than names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_name: Option<String>,
}

/// A node's whole desired state, signed by the Domain (context `NodeState`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    /// Increases with every change in the node's Domain; the `ETag` of the state call.
    pub version: u64,
    pub node_id: Uuid,
    pub domain_id: Uuid,
    pub mesh_ip: IpAddr,
    pub mesh_cidr: IpNet,
    pub listen_port: u16,
    pub peers: Vec<PeerSpec>,
    /// Unix seconds when the server produced this document.
    pub issued_at: i64,
    /// The relays this node may use, home relay candidates first.
    #[serde(default)]
    pub relays: Vec<RelaySpec>,
    /// This node's [`crate::reach::relay::RelayToken`], signed by the Domain (context
    /// `RelayToken`); what relays accept.
    #[serde(default)]
    pub relay_token: Option<crate::signed::SignedEnvelope>,
    /// STUN servers besides the relays' UDP ports (the control plane's own responder).
    #[serde(default)]
    pub stun: Vec<SocketAddr>,
    /// The operator's switch for UDP segmentation offload (GSO on send, GRO on receive) of
    /// the node's WireGuard socket; absent: the node's default (on where the kernel has it).
    /// Absent from the JSON when unset, so a document for an older node stays the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_offload: Option<UdpOffload>,
    /// The Domain's next signing key while a rotation's overlap lasts (this document is signed
    /// by the current one, which vouches for it): the node accepts documents signed by either
    /// and moves to the next key with the first document it signs. Absent outside an overlap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_signing_key: Option<crate::signing_keys::SigningKey>,
    /// The access policy this node enforces: the version of its Domain's policy document and
    /// the node's compiled share of it (its peer set and, per peer, what may be opened in each
    /// direction; docs/policy.md). `peers` holds exactly the view's peers. Absent only from a
    /// server older than policies: the node then filters nothing, as before. A view the node
    /// cannot turn into a filter closes the interface (fail closed), never opens it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyState>,
    /// This node's DNS name and its Domain's suffix (docs/dns.md). Absent from a server older
    /// than names: plexd then answers no names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<crate::routes::DnsState>,
    /// The subnet routes (and the exit's `0.0.0.0/0`, `::/0`) this node carries as a router,
    /// with its role in each (docs/routes.md). A router forwards and masquerades only for
    /// routes listed here; peers reach them through the CIDRs in its `allowed_ips`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub served_routes: Vec<crate::routes::ServedRoute>,
}

/// What [`NodeState::policy`] carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyState {
    /// The version of the Domain's policy document this view was compiled from.
    pub version: u64,
    pub view: plexsphere_policy::view::NodeView,
}

/// Whether a node's WireGuard socket uses UDP GSO and GRO (`"on"`/`"off"` in JSON). Some Linux
/// kernels have shipped GSO bugs that corrupt or lose segmented datagrams; `off` sends one
/// datagram per system call and asks the kernel for no coalescing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UdpOffload {
    On,
    Off,
}

impl UdpOffload {
    pub fn as_str(self) -> &'static str {
        match self {
            UdpOffload::On => "on",
            UdpOffload::Off => "off",
        }
    }

    /// Parses `on`/`off` (what the database column and `plexctl` hold).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "on" => Some(UdpOffload::On),
            "off" => Some(UdpOffload::Off),
            _ => None,
        }
    }
}

/// `PUT /v1/nodes/{id}/udp-offload` (operator): `{"udp_offload": "off"}` switches the node's
/// UDP GSO/GRO off, `"on"` on, `null` back to the node's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UdpOffloadRequest {
    pub udp_offload: Option<UdpOffload>,
}

/// One event on a node's stream, signed by the Domain (context `Event`). The SSE `id:` equals
/// `seq`; a client refuses an event whose signed `seq` differs from the frame's id, or whose
/// `node_id` is not its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    /// The node this copy of the event is addressed to.
    pub node_id: Uuid,
    #[serde(flatten)]
    pub kind: EventKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    PeerAdded {
        peer: PeerSpec,
    },
    PeerUpdated {
        peer: PeerSpec,
    },
    PeerRemoved {
        peer_node_id: Uuid,
        public_key: String,
    },
    EndpointChanged {
        peer_node_id: Uuid,
        endpoints: Vec<SocketAddr>,
        #[serde(default)]
        home_relay: Option<String>,
    },
    /// This node was revoked: stop using peers; the credential no longer works.
    NodeRevoked,
    /// The stream cannot resume from where the node asked: pull the full state.
    Resync {
        reason: String,
    },
}

impl EventKind {
    /// The SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::PeerAdded { .. } => "peer_added",
            EventKind::PeerUpdated { .. } => "peer_updated",
            EventKind::PeerRemoved { .. } => "peer_removed",
            EventKind::EndpointChanged { .. } => "endpoint_changed",
            EventKind::NodeRevoked => "node_revoked",
            EventKind::Resync { .. } => "resync",
        }
    }
}

/// `POST /v1/nodes/{id}/ingest`: observations batched by the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestBatch {
    /// Chosen by the node for each new batch and kept when the same batch is sent again after
    /// a failed call, so the server stores a batch once even when only its answer was lost.
    pub batch_id: Uuid,
    pub observations: Vec<Observation>,
    /// Observations the node dropped (oldest first) while the API was away.
    #[serde(default)]
    pub dropped: u64,
}

/// What `plexd join --result-file PATH` writes when a join fails, one JSON object:
/// `{"exit_code": 11, "message": "..."}`, the exit status and the one-line message plexd
/// printed. The broker reads it inside a machine whose cloud-init failed. Unknown fields are
/// accepted, so a later plexd may add some.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinResult {
    pub exit_code: i32,
    pub message: String,
}

/// (No `deny_unknown_fields` here: serde does not support it together with `flatten`.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// Unix seconds.
    pub at: i64,
    #[serde(flatten)]
    pub kind: ObservationKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ObservationKind {
    Handshake {
        peer_node_id: Uuid,
        endpoint: Option<SocketAddr>,
    },
    Traffic {
        peer_node_id: Uuid,
        rx_bytes: u64,
        tx_bytes: u64,
    },
    Error {
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_json_is_pinned() {
        let json = r#"{"seq":42,"node_id":"019a0816-0000-7000-8000-0000000000aa","type":"peer_removed","peer_node_id":"019a0816-0000-7000-8000-0000000000bb","public_key":"k"}"#;
        let e: Event = serde_json::from_str(json).unwrap();
        assert_eq!(e.seq, 42);
        assert_eq!(e.kind.name(), "peer_removed");
        assert_eq!(serde_json::to_string(&e).unwrap(), json);
        let revoked =
            r#"{"seq":7,"node_id":"019a0816-0000-7000-8000-0000000000aa","type":"node_revoked"}"#;
        let e: Event = serde_json::from_str(revoked).unwrap();
        assert_eq!(e.kind, EventKind::NodeRevoked);
    }

    #[test]
    fn udp_offload_is_absent_by_default_and_pinned_when_set() {
        let state = r#"{"version":3,"node_id":"019a0816-0000-7000-8000-0000000000aa","domain_id":"019a0816-0000-7000-8000-0000000000bb","mesh_ip":"10.1.0.2","mesh_cidr":"10.1.0.0/16","listen_port":51820,"peers":[],"issued_at":9,"relays":[],"relay_token":null,"stun":[]}"#;
        // A document from an older server (no field) is the default, and encodes unchanged.
        let mut s: NodeState = serde_json::from_str(state).unwrap();
        assert_eq!(s.udp_offload, None);
        assert_eq!(serde_json::to_string(&s).unwrap(), state);
        s.udp_offload = Some(UdpOffload::Off);
        let off = serde_json::to_string(&s).unwrap();
        assert_eq!(
            off,
            format!(r#"{},"udp_offload":"off"}}"#, &state[..state.len() - 1])
        );
        assert_eq!(serde_json::from_str::<NodeState>(&off).unwrap(), s);
        let req: UdpOffloadRequest = serde_json::from_str(r#"{"udp_offload":"on"}"#).unwrap();
        assert_eq!(req.udp_offload, Some(UdpOffload::On));
        let req: UdpOffloadRequest = serde_json::from_str(r#"{"udp_offload":null}"#).unwrap();
        assert_eq!(req.udp_offload, None);
        assert!(serde_json::from_str::<UdpOffloadRequest>(r#"{"udp_offload":"maybe"}"#).is_err());
        assert_eq!(UdpOffload::parse("off"), Some(UdpOffload::Off));
        assert_eq!(UdpOffload::parse("Off"), None);
    }

    #[test]
    fn heartbeat_is_strict() {
        let ok = r#"{"uptime_secs":5,"plexd_version":"0.1.0","state_version":3,"peers":{"configured":2,"connected":1}}"#;
        let h: Heartbeat = serde_json::from_str(ok).unwrap();
        assert_eq!(serde_json::to_string(&h).unwrap(), ok);
        assert!(serde_json::from_str::<Heartbeat>(r#"{"uptime_secs":5,"plexd_version":"x","peers":{"configured":0,"connected":0},"extra":1}"#).is_err());
    }

    #[test]
    fn observation_json_is_pinned() {
        let json = r#"{"batch_id":"5f0c7a4e-2b1d-4c3e-9a8b-7d6e5f4a3b2c","observations":[{"at":1,"type":"traffic","peer_node_id":"019a0816-0000-7000-8000-0000000000bb","rx_bytes":10,"tx_bytes":20}],"dropped":3}"#;
        let b: IngestBatch = serde_json::from_str(json).unwrap();
        assert_eq!(b.dropped, 3);
        assert_eq!(serde_json::to_string(&b).unwrap(), json);
        let unnamed = r#"{"observations":[],"dropped":0}"#;
        assert!(
            serde_json::from_str::<IngestBatch>(unnamed).is_err(),
            "a batch without its id cannot be told apart from its retry"
        );
    }
}
