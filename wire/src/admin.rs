//! The operator API (`plexctl` <-> `plexsphere`), authenticated with `Authorization: Bearer pxop_...`.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

pub use crate::tokens_admin::{
    CreateOperatorToken, CreatedOperatorToken, IssueTokenRequest, IssuedToken, OperatorScope,
    OperatorTokenStatus, OperatorTokenView, TokenStatus, TokenView,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    /// Registered, never heard from since.
    Registered,
    Online,
    Offline,
    Revoked,
}

impl NodeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Registered => "registered",
            NodeStatus::Online => "online",
            NodeStatus::Offline => "offline",
            NodeStatus::Revoked => "revoked",
        }
    }
}

/// One node as `node list` / `node get` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    pub id: Uuid,
    pub domain_id: Uuid,
    pub project_id: Uuid,
    pub hostname: String,
    /// The node's DNS name in its Domain (`<name>.<suffix>`, docs/dns.md); absent from
    /// servers older than names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arch: String,
    pub plexd_version: String,
    pub mesh_ip: IpAddr,
    pub wireguard_public_key: String,
    #[serde(default)]
    pub resource_handle: Option<String>,
    pub status: NodeStatus,
    #[serde(with = "time::serde::rfc3339")]
    pub registered_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option", default)]
    pub last_seen_at: Option<OffsetDateTime>,
    /// The endpoints the server advertises for the node, best first, `ip:port`: its local
    /// candidates, then the reflexive ones, then the observed one (see `candidates`).
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// When the node last heartbeated (only heartbeats move it, unlike `last_seen_at`).
    #[serde(with = "time::serde::rfc3339::option", default)]
    pub last_heartbeat_at: Option<OffsetDateTime>,
    /// The plexd process's uptime as of the last heartbeat, in seconds.
    #[serde(default)]
    pub uptime_secs: Option<u64>,
    /// The signed state version the node last applied, as of the last heartbeat.
    #[serde(default)]
    pub applied_state_version: Option<u64>,
    /// WireGuard peers configured on the node, as of the last heartbeat.
    #[serde(default)]
    pub peers_configured: Option<u32>,
    /// Of those, peers with a recent handshake, as of the last heartbeat.
    #[serde(default)]
    pub peers_connected: Option<u32>,
    /// Observations the node dropped before it could send them, summed over every batch.
    #[serde(default)]
    pub observations_dropped: u64,
    /// The candidates of the node's last endpoint report, by kind: its local addresses, then
    /// the reflexive ones its STUN servers saw, then the one the server observed (each with
    /// the port peers send to). Empty until the node reports (and from older servers).
    #[serde(default)]
    pub candidates: Vec<CandidateView>,
    /// The relay the node keeps a connection to, as it last reported.
    #[serde(default)]
    pub home_relay: Option<String>,
    /// What the node's NAT does to its mappings, as the node last measured it; null until it
    /// reports (and from older servers).
    #[serde(default)]
    pub nat: Option<NatView>,
    /// Set when the node's credential was used from another host than the one it is bound
    /// to (its state directory was copied): those requests were refused. Null otherwise (and
    /// from older servers).
    #[serde(default)]
    pub clone: Option<CloneView>,
    /// When the node last rotated its WireGuard key; absent when it never did.
    #[serde(
        with = "time::serde::rfc3339::option",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub key_rotated_at: Option<OffsetDateTime>,
    /// When the node last rotated its credential; absent when it never did.
    #[serde(
        with = "time::serde::rfc3339::option",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub credential_rotated_at: Option<OffsetDateTime>,
    /// Set when the node is ephemeral: the control plane removes it once it has been offline
    /// this many seconds. Absent for other nodes (and from older servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_offline_secs: Option<u64>,
    /// The operator's UDP GSO/GRO switch for the node (`PUT /v1/nodes/{id}/udp-offload`);
    /// absent: the node's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_offload: Option<crate::node::UdpOffload>,
    /// The node's tags, names without `tag:`, sorted (`PUT /v1/nodes/{id}/tags`; empty from
    /// older servers). Access policy rules select nodes by them.
    #[serde(default)]
    pub tags: Vec<String>,
}

impl NodeView {
    /// The node's name as operators see and type it: its DNS name (`name`), or from a
    /// server older than names its resource handle when it has one, else its hostname.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_else(|| self.legacy_name())
    }

    /// What [`NodeView::name`] was before DNS names: the resource handle, else the hostname
    /// (`plexctl` still finds a node by it when no DNS name matches).
    pub fn legacy_name(&self) -> &str {
        self.resource_handle.as_deref().unwrap_or(&self.hostname)
    }
}

/// Requests refused because they came with another host's fingerprint than the node's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneView {
    #[serde(with = "time::serde::rfc3339")]
    pub first_seen_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub last_seen_at: OffsetDateTime,
    /// Refused requests recorded (the server records at most one per node every few
    /// seconds, so a burst counts once).
    pub requests: u64,
    /// The client address of the last recorded one.
    pub last_addr: String,
    /// The host fingerprint it carried (64 hex), or null when it carried none.
    #[serde(default)]
    pub last_fingerprint: Option<String>,
}

/// Where a candidate endpoint of a node comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CandidateKind {
    /// An interface address the node reported, with its listen port.
    Local,
    /// Where a STUN server saw the node's WireGuard socket come from.
    Reflexive,
    /// Where the control plane saw the endpoint report come from, with the listen port.
    Observed,
}

impl CandidateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CandidateKind::Local => "local",
            CandidateKind::Reflexive => "reflexive",
            CandidateKind::Observed => "observed",
        }
    }
}

/// One candidate endpoint of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CandidateView {
    pub kind: CandidateKind,
    pub address: SocketAddr,
}

/// What a node measured of its NAT ([`crate::node::NatReport`] as operators see it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NatView {
    pub mapping: crate::node::NatMapping,
    /// No STUN server answered over UDP.
    #[serde(default)]
    pub udp_blocked: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainView {
    pub id: Uuid,
    pub slug: String,
    pub mesh_cidr: IpNet,
    /// The Domain's Ed25519 public key, standard base64.
    pub signing_public_key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectView {
    pub id: Uuid,
    pub domain_id: Uuid,
    pub slug: String,
    #[serde(default)]
    pub display_name: Option<String>,
    #[serde(default)]
    pub sub_range_cidr: Option<IpNet>,
}

/// `GET /v1/nodes/{node_id}/observations`: what the node reported through ingest, newest
/// first (the server keeps the newest 500 per node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservationList {
    pub node_id: Uuid,
    /// Observations the node dropped before it could send them (its queue was full while the
    /// API was away), summed over every batch it sent.
    pub dropped: u64,
    pub items: Vec<ObservationView>,
}

/// One stored observation: when the server received it, the node's own time, and what it saw
/// (`type` is `handshake`, `traffic` or `error`, with that kind's fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservationView {
    #[serde(with = "time::serde::rfc3339")]
    pub received_at: OffsetDateTime,
    /// The node's clock, unix seconds, as the node reported it.
    pub at: i64,
    #[serde(flatten)]
    pub kind: crate::node::ObservationKind,
}

/// `GET /v1/version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    pub name: String,
    pub version: String,
}

/// Every list endpoint answers `{"items":[...]}`, so fields can be added beside the items later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct List<T> {
    pub items: Vec<T>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_view_json_is_pinned() {
        let json = r#"{"id":"019a0816-0000-7000-8000-0000000000aa","domain_id":"019a0816-0000-7000-8000-000000000000","project_id":"019a0816-0000-7000-8000-000000000002","hostname":"edge-1","arch":"amd64","plexd_version":"0.2.0","mesh_ip":"10.64.1.1","wireguard_public_key":"k","resource_handle":null,"status":"online","registered_at":"2026-11-30T10:00:00Z","last_seen_at":"2026-11-30T10:05:00Z","endpoints":["192.0.2.10:51820"],"last_heartbeat_at":"2026-11-30T10:04:30Z","uptime_secs":3600,"applied_state_version":7,"peers_configured":3,"peers_connected":2,"observations_dropped":5,"candidates":[{"kind":"local","address":"192.0.2.10:51820"},{"kind":"reflexive","address":"198.51.100.7:40001"},{"kind":"observed","address":"198.51.100.7:51820"}],"home_relay":"r1","nat":{"mapping":"endpoint_independent","udp_blocked":false},"clone":null,"tags":["db","prod"]}"#;
        let v: NodeView = serde_json::from_str(json).unwrap();
        assert_eq!(v.status, NodeStatus::Online);
        assert_eq!(v.candidates[1].kind, CandidateKind::Reflexive);
        assert_eq!(
            v.nat.as_ref().map(|n| n.mapping),
            Some(crate::node::NatMapping::EndpointIndependent)
        );
        assert_eq!(
            (
                v.uptime_secs,
                v.applied_state_version,
                v.peers_configured,
                v.peers_connected
            ),
            (Some(3600), Some(7), Some(3), Some(2))
        );
        assert_eq!(serde_json::to_string(&v).unwrap(), json);
    }

    #[test]
    fn a_suspected_clone_json_is_pinned() {
        let json = r#"{"first_seen_at":"2026-12-02T03:10:04Z","last_seen_at":"2026-12-02T03:10:12Z","requests":2,"last_addr":"198.51.100.9","last_fingerprint":null}"#;
        let c: CloneView = serde_json::from_str(json).unwrap();
        assert_eq!((c.requests, c.last_addr.as_str()), (2, "198.51.100.9"));
        assert_eq!(serde_json::to_string(&c).unwrap(), json);
    }

    #[test]
    fn node_view_from_an_older_server_reads_without_the_heartbeat_fields() {
        let json = r#"{"id":"019a0816-0000-7000-8000-0000000000aa","domain_id":"019a0816-0000-7000-8000-000000000000","project_id":"019a0816-0000-7000-8000-000000000002","hostname":"edge-1","arch":"amd64","plexd_version":"0.1.0","mesh_ip":"10.64.1.1","wireguard_public_key":"k","status":"registered","registered_at":"2026-11-30T10:00:00Z"}"#;
        let v: NodeView = serde_json::from_str(json).unwrap();
        assert_eq!(v.last_heartbeat_at, None);
        assert_eq!(
            (
                v.uptime_secs,
                v.applied_state_version,
                v.peers_configured,
                v.peers_connected
            ),
            (None, None, None, None)
        );
        assert_eq!(v.observations_dropped, 0);
        assert!(v.candidates.is_empty());
        assert_eq!((v.home_relay.as_deref(), v.nat.as_ref()), (None, None));
        assert_eq!(v.clone, None);
        assert!(v.tags.is_empty());
        let back: serde_json::Value = serde_json::to_value(&v).unwrap();
        assert_eq!(back["last_heartbeat_at"], serde_json::Value::Null);
        assert_eq!(back["observations_dropped"], 0);
    }

    #[test]
    fn observation_list_json_is_pinned() {
        let json = r#"{"node_id":"019a0816-0000-7000-8000-0000000000aa","dropped":2,"items":[{"received_at":"2026-11-30T10:00:05Z","at":1796032800,"type":"handshake","peer_node_id":"019a0816-0000-7000-8000-0000000000bb","endpoint":"192.0.2.7:51820"},{"received_at":"2026-11-30T10:00:05Z","at":1796032799,"type":"traffic","peer_node_id":"019a0816-0000-7000-8000-0000000000bb","rx_bytes":10,"tx_bytes":20},{"received_at":"2026-11-30T10:00:05Z","at":1796032798,"type":"error","message":"no route"}]}"#;
        let v: ObservationList = serde_json::from_str(json).unwrap();
        assert_eq!(v.dropped, 2);
        assert_eq!(
            v.items[2].kind,
            crate::node::ObservationKind::Error {
                message: "no route".into()
            }
        );
        assert_eq!(serde_json::to_string(&v).unwrap(), json);
    }
}
