//! The operator API (`plexctl` <-> `plexsphere`), authenticated with `Authorization: Bearer pxop_...`.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::secret::TokenKind;

/// `POST /v1/projects/{project_id}/bootstrap-tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssueTokenRequest {
    pub kind: TokenKind,
    /// 1-16 characters of `a-z0-9`; appears in the token's text (`pxbt_<env>_...`).
    pub env_prefix: String,
    /// Lifetime in seconds (at least 60, at most 30 days).
    pub ttl_secs: u64,
    /// How many nodes may register with the token, 1-1000; absent: 1 (single use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uses: Option<u32>,
    /// Makes the token's nodes ephemeral: the control plane removes one once it has been
    /// offline this many seconds (120 to 7 days). Absent: not ephemeral.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_offline_secs: Option<u64>,
    /// Tags every node the token makes gets at registration (`tag:` optional; at most 32).
    /// Absent: none. An older server refuses the field (it knows no tags).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

/// The answer to issuing a token: the only time its text is ever shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedToken {
    pub id: String,
    pub token: String,
    pub project_id: Uuid,
    pub kind: TokenKind,
    pub env_prefix: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// How many nodes may register with it (1 from older servers).
    #[serde(default = "one")]
    pub max_uses: u32,
    /// Set when its nodes are ephemeral: removed after this many seconds offline.
    #[serde(default)]
    pub ephemeral_offline_secs: Option<u64>,
    /// The tags its nodes get at registration (names without `tag:`; empty from older
    /// servers).
    #[serde(default)]
    pub tags: Vec<String>,
}

/// What older servers mean by a token's use limit: single use.
fn one() -> u32 {
    1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenStatus {
    Active,
    Consumed,
    Expired,
    Revoked,
}

impl TokenStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenStatus::Active => "active",
            TokenStatus::Consumed => "consumed",
            TokenStatus::Expired => "expired",
            TokenStatus::Revoked => "revoked",
        }
    }
}

/// One bootstrap token as `bootstrap-token list` shows it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenView {
    pub id: String,
    pub project_id: Uuid,
    pub kind: TokenKind,
    pub env_prefix: String,
    pub status: TokenStatus,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option", default)]
    pub consumed_at: Option<OffsetDateTime>,
    /// The node that took the token's last use (its only one for a single-use token).
    #[serde(default)]
    pub consumed_by_node: Option<Uuid>,
    #[serde(with = "time::serde::rfc3339::option", default)]
    pub revoked_at: Option<OffsetDateTime>,
    /// The resource the broker minted this token for, if any.
    #[serde(default)]
    pub resource_id: Option<Uuid>,
    /// Nodes registered with it so far, and how many may (1 and 0/1 from older servers).
    #[serde(default)]
    pub uses: u32,
    #[serde(default = "one")]
    pub max_uses: u32,
    /// Set when its nodes are ephemeral: removed after this many seconds offline.
    #[serde(default)]
    pub ephemeral_offline_secs: Option<u64>,
    /// The nodes it made that still exist, oldest first (empty from older servers).
    #[serde(default)]
    pub nodes: Vec<Uuid>,
    /// The tags its nodes get at registration, fixed when it was issued (names without
    /// `tag:`; empty from older servers).
    #[serde(default)]
    pub tags: Vec<String>,
}

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

/// What an operator token may do (docs/api.md, "Operator token scopes"); ordered, each scope
/// allows everything the ones before it allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OperatorScope {
    /// Reads only (`GET`).
    ReadOnly,
    /// Day-to-day work: bootstrap tokens, nodes, resources (machines).
    Operator,
    /// Everything, operator tokens and cloud credentials included.
    Admin,
}

impl OperatorScope {
    pub const ALL: [OperatorScope; 3] = [
        OperatorScope::ReadOnly,
        OperatorScope::Operator,
        OperatorScope::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OperatorScope::ReadOnly => "read-only",
            OperatorScope::Operator => "operator",
            OperatorScope::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<OperatorScope> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatorTokenStatus {
    Active,
    Expired,
    Revoked,
}

/// One operator token as `GET /v1/operator-tokens` and `GET /v1/operator-tokens/self` show it
/// (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorTokenView {
    pub id: String,
    pub name: String,
    pub scope: OperatorScope,
    /// The one project the token is limited to; `None`: every project.
    #[serde(default)]
    pub project_id: Option<Uuid>,
    /// Created before scopes existed: admin, never expires; replace it with a scoped token.
    #[serde(default)]
    pub legacy: bool,
    pub status: OperatorTokenStatus,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// `None`: never expires (admin and legacy tokens only).
    #[serde(with = "time::serde::rfc3339::option", default)]
    pub expires_at: Option<OffsetDateTime>,
    /// Recorded at most once a minute per token.
    #[serde(with = "time::serde::rfc3339::option", default)]
    pub last_used_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339::option", default)]
    pub revoked_at: Option<OffsetDateTime>,
}

/// `POST /v1/operator-tokens` (admin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateOperatorToken {
    pub name: String,
    pub scope: OperatorScope,
    #[serde(default)]
    pub project_id: Option<Uuid>,
    /// `90d`, `12h`, `1d12h`... or `never` (admin only); absent: 90 days.
    #[serde(default)]
    pub expires_in: Option<String>,
}

/// The answer to creating an operator token: the only time its text is ever shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedOperatorToken {
    pub token: String,
    #[serde(flatten)]
    pub view: OperatorTokenView,
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
    fn operator_token_view_json_is_pinned() {
        let json = r#"{"id":"0123456789abcdef","name":"ci","scope":"read-only","project_id":"019a0816-0000-7000-8000-000000000002","legacy":false,"status":"active","created_at":"2026-11-30T10:00:00Z","expires_at":"2027-02-28T10:00:00Z","last_used_at":null,"revoked_at":null}"#;
        let v: OperatorTokenView = serde_json::from_str(json).unwrap();
        assert_eq!(v.scope, OperatorScope::ReadOnly);
        assert_eq!(serde_json::to_string(&v).unwrap(), json);
        assert!(OperatorScope::ReadOnly < OperatorScope::Operator);
        assert!(OperatorScope::Operator < OperatorScope::Admin);
        for s in OperatorScope::ALL {
            assert_eq!(OperatorScope::parse(s.as_str()), Some(s));
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
        let req: CreateOperatorToken =
            serde_json::from_str(r#"{"name":"ci","scope":"operator"}"#).unwrap();
        assert_eq!((req.project_id, req.expires_in), (None, None));
    }

    #[test]
    fn token_view_json_is_pinned() {
        let json = r#"{"id":"0123456789abcdef","project_id":"019a0816-0000-7000-8000-000000000002","kind":"node","env_prefix":"lab","status":"consumed","created_at":"2026-11-30T10:00:00Z","expires_at":"2026-11-30T11:00:00Z","consumed_at":"2026-11-30T10:05:00Z","consumed_by_node":"019a0816-0000-7000-8000-0000000000aa","revoked_at":null,"resource_id":null,"uses":3,"max_uses":3,"ephemeral_offline_secs":1800,"nodes":["019a0816-0000-7000-8000-0000000000aa"],"tags":["ci"]}"#;
        let v: TokenView = serde_json::from_str(json).unwrap();
        assert_eq!(v.status, TokenStatus::Consumed);
        assert_eq!((v.uses, v.max_uses), (3, 3));
        assert_eq!(serde_json::to_string(&v).unwrap(), json);
    }

    #[test]
    fn a_token_view_from_an_older_server_is_single_use() {
        let json = r#"{"id":"0123456789abcdef","project_id":"019a0816-0000-7000-8000-000000000002","kind":"node","env_prefix":"lab","status":"active","created_at":"2026-11-30T10:00:00Z","expires_at":"2026-11-30T11:00:00Z","consumed_at":null,"consumed_by_node":null,"revoked_at":null,"resource_id":null}"#;
        let v: TokenView = serde_json::from_str(json).unwrap();
        assert_eq!((v.uses, v.max_uses, v.ephemeral_offline_secs), (0, 1, None));
        assert!(v.nodes.is_empty());
        assert!(v.tags.is_empty());
    }

    #[test]
    fn issue_token_request_json_is_pinned_and_the_new_fields_are_optional() {
        let json = r#"{"kind":"node","env_prefix":"asg","ttl_secs":3600,"max_uses":50,"ephemeral_offline_secs":1800}"#;
        let r: IssueTokenRequest = serde_json::from_str(json).unwrap();
        assert_eq!(
            (r.max_uses, r.ephemeral_offline_secs),
            (Some(50), Some(1800))
        );
        assert_eq!(serde_json::to_string(&r).unwrap(), json);
        let tagged =
            r#"{"kind":"node","env_prefix":"asg","ttl_secs":3600,"tags":["tag:ci","web"]}"#;
        let r: IssueTokenRequest = serde_json::from_str(tagged).unwrap();
        assert_eq!(r.tags, vec!["tag:ci", "web"]);
        assert_eq!(serde_json::to_string(&r).unwrap(), tagged);
        let old = r#"{"kind":"node","env_prefix":"lab","ttl_secs":3600}"#;
        let r: IssueTokenRequest = serde_json::from_str(old).unwrap();
        assert_eq!((r.max_uses, r.ephemeral_offline_secs), (None, None));
        assert_eq!(serde_json::to_string(&r).unwrap(), old);
    }

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

    #[test]
    fn issue_request_is_strict() {
        let ok: IssueTokenRequest =
            serde_json::from_str(r#"{"kind":"node","env_prefix":"lab","ttl_secs":3600}"#).unwrap();
        assert_eq!(ok.kind, TokenKind::Node);
        assert!(
            serde_json::from_str::<IssueTokenRequest>(
                r#"{"kind":"user","env_prefix":"lab","ttl_secs":1}"#
            )
            .is_err()
        );
        assert!(
            serde_json::from_str::<IssueTokenRequest>(
                r#"{"kind":"node","env_prefix":"lab","ttl_secs":1,"x":1}"#
            )
            .is_err()
        );
    }
}
