//! Each peer's path as a node sees it (issue 28, docs/api.md "Paths"): the node's report and
//! the limits both sides check.
//!
//! | call | path |
//! |---|---|
//! | path report (node) | `PUT /v1/nodes/{id}/paths` ([`PathsReport`] -> [`PathsAck`]) |
//! | a node's paths (operator) | `GET /v1/nodes/{id}/paths` |
//! | the mesh map (operator) | `GET /v1/mesh/map?domain=` |
//!
//! plexd sends a report when a peer's path changes (after [`PATHS_DEBOUNCE_MS`] of quiet),
//! again at most every [`PATHS_REFRESH_SECS`] while RTTs drift, and never two within
//! [`PATHS_MIN_GAP_MS`]; the control plane refuses a report sooner than that with 429. A
//! control plane without the route answers 404: plexd logs it once and stops reporting.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The most peers one report carries (the rest are left out, peers without a path first);
/// the control plane refuses a longer report. At ~200 bytes a peer this stays well inside
/// the node body limit (`node::MAX_NODE_BODY`).
pub const MAX_PATH_PEERS: usize = 1024;
/// Two reports of one node are at least this far apart (the control plane answers 429
/// `rate_limited` to a sooner one).
pub const PATHS_MIN_GAP_MS: u64 = 2000;
/// A changed path is reported once nothing else changed for this long (a path flapping
/// during a probe round is one report, not several).
pub const PATHS_DEBOUNCE_MS: u64 = 500;
/// While only RTTs or handshakes moved, a report at most this often.
pub const PATHS_REFRESH_SECS: u64 = 10;
/// The longest relay name a report may carry.
pub const MAX_RELAY_NAME: usize = 128;

/// How a relay connection is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathTransport {
    Udp,
    /// TCP with TLS.
    Tcp,
}

impl PathTransport {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Udp => "udp",
            Self::Tcp => "tcp",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "udp" => Some(Self::Udp),
            "tcp" => Some(Self::Tcp),
            _ => None,
        }
    }
}

/// The path a peer's WireGuard traffic takes: `{"kind":"direct","endpoint":"192.0.2.7:51820"}`,
/// `{"kind":"relay","relay":"r1","transport":"udp"}` or `{"kind":"none"}` (the shape
/// `plexd status` shows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PathKind {
    /// Nothing answered yet.
    None,
    /// Straight to this address.
    Direct { endpoint: SocketAddr },
    /// Through this relay (by name), over UDP or TCP.
    Relay {
        relay: String,
        transport: PathTransport,
    },
}

impl PathKind {
    /// `direct`, `relay` or `none` (the map's `path`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Direct { .. } => "direct",
            Self::Relay { .. } => "relay",
        }
    }
}

/// One peer in a report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerPath {
    pub peer_node_id: Uuid,
    pub path: PathKind,
    /// The round trip of the last disco ping on that path, in milliseconds.
    #[serde(default)]
    pub rtt_ms: Option<f64>,
    /// The data plane's last WireGuard handshake with the peer, unix seconds.
    #[serde(default)]
    pub last_handshake_at: Option<i64>,
}

/// `PUT /v1/nodes/{id}/paths`: every peer's path as this node sees it now. A report replaces
/// the node's previous one (a peer left out has no path from this side).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PathsReport {
    pub peers: Vec<PeerPath>,
}

/// The answer to a report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathsAck {
    /// Peers stored.
    pub stored: u32,
    /// Peers left out: not in the node's Domain (or gone).
    pub ignored: u32,
}

/// Why a report is refused as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadReport {
    #[error("the report names {0} peers; at most {MAX_PATH_PEERS} are allowed")]
    TooManyPeers(usize),
    #[error("peer {0} appears twice in the report")]
    Duplicate(Uuid),
    #[error("peer {0}: a relay name must be 1 to {MAX_RELAY_NAME} printable characters")]
    RelayName(Uuid),
    #[error("peer {0}: rtt_ms must be a finite number from 0 to 600000")]
    Rtt(Uuid),
}

/// The checks of a report that need no database: the peer count, duplicates, relay names and
/// RTTs.
pub fn check_report(r: &PathsReport) -> Result<(), BadReport> {
    if r.peers.len() > MAX_PATH_PEERS {
        return Err(BadReport::TooManyPeers(r.peers.len()));
    }
    let mut seen = std::collections::HashSet::with_capacity(r.peers.len());
    for p in &r.peers {
        if !seen.insert(p.peer_node_id) {
            return Err(BadReport::Duplicate(p.peer_node_id));
        }
        if let PathKind::Relay { relay, .. } = &p.path
            && (relay.is_empty()
                || relay.chars().count() > MAX_RELAY_NAME
                || relay.chars().any(char::is_control))
        {
            return Err(BadReport::RelayName(p.peer_node_id));
        }
        if let Some(rtt) = p.rtt_ms
            && !(rtt.is_finite() && (0.0..=600_000.0).contains(&rtt))
        {
            return Err(BadReport::Rtt(p.peer_node_id));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> Uuid {
        Uuid::from_bytes([n; 16])
    }

    #[test]
    fn the_report_json_is_pinned() {
        let r = PathsReport {
            peers: vec![
                PeerPath {
                    peer_node_id: id(1),
                    path: PathKind::Direct {
                        endpoint: "192.0.2.7:51820".parse().unwrap_or_else(|_| unreachable!()),
                    },
                    rtt_ms: Some(3.5),
                    last_handshake_at: Some(1_700_000_000),
                },
                PeerPath {
                    peer_node_id: id(2),
                    path: PathKind::Relay {
                        relay: "r1".into(),
                        transport: PathTransport::Tcp,
                    },
                    rtt_ms: None,
                    last_handshake_at: None,
                },
                PeerPath {
                    peer_node_id: id(3),
                    path: PathKind::None,
                    rtt_ms: None,
                    last_handshake_at: None,
                },
            ],
        };
        let json = r#"{"peers":[{"peer_node_id":"01010101-0101-0101-0101-010101010101","path":{"kind":"direct","endpoint":"192.0.2.7:51820"},"rtt_ms":3.5,"last_handshake_at":1700000000},{"peer_node_id":"02020202-0202-0202-0202-020202020202","path":{"kind":"relay","relay":"r1","transport":"tcp"},"rtt_ms":null,"last_handshake_at":null},{"peer_node_id":"03030303-0303-0303-0303-030303030303","path":{"kind":"none"},"rtt_ms":null,"last_handshake_at":null}]}"#;
        assert_eq!(serde_json::to_string(&r).ok().as_deref(), Some(json));
        let back: PathsReport = serde_json::from_str(json).unwrap_or_default();
        assert_eq!(back, r);
        // Optional fields may be left out.
        let short = r#"{"peers":[{"peer_node_id":"03030303-0303-0303-0303-030303030303","path":{"kind":"none"}}]}"#;
        let parsed: PathsReport = serde_json::from_str(short).unwrap_or_default();
        assert_eq!(parsed.peers.len(), 1);
        let ack = r#"{"stored":2,"ignored":1}"#;
        let a = PathsAck {
            stored: 2,
            ignored: 1,
        };
        assert_eq!(serde_json::to_string(&a).ok().as_deref(), Some(ack));
    }

    #[test]
    fn bad_reports_are_refused_with_the_reason() {
        let peer = |n: u8, path: PathKind, rtt: Option<f64>| PeerPath {
            peer_node_id: id(n),
            path,
            rtt_ms: rtt,
            last_handshake_at: None,
        };
        let ok = PathsReport {
            peers: vec![peer(1, PathKind::None, Some(0.0))],
        };
        assert_eq!(check_report(&ok), Ok(()));
        let dup = PathsReport {
            peers: vec![peer(1, PathKind::None, None), peer(1, PathKind::None, None)],
        };
        assert_eq!(check_report(&dup), Err(BadReport::Duplicate(id(1))));
        let relay = |name: &str| PathKind::Relay {
            relay: name.into(),
            transport: PathTransport::Udp,
        };
        for bad in ["", "r\u{7}", &"r".repeat(MAX_RELAY_NAME + 1)] {
            let r = PathsReport {
                peers: vec![peer(2, relay(bad), None)],
            };
            assert_eq!(
                check_report(&r),
                Err(BadReport::RelayName(id(2))),
                "{bad:?}"
            );
        }
        for rtt in [f64::NAN, -1.0, f64::INFINITY, 600_001.0] {
            let r = PathsReport {
                peers: vec![peer(3, PathKind::None, Some(rtt))],
            };
            assert_eq!(check_report(&r), Err(BadReport::Rtt(id(3))), "{rtt}");
        }
        let many = PathsReport {
            peers: (0..=MAX_PATH_PEERS)
                .map(|i| PeerPath {
                    peer_node_id: Uuid::from_u128(i as u128),
                    path: PathKind::None,
                    rtt_ms: None,
                    last_handshake_at: None,
                })
                .collect(),
        };
        assert_eq!(
            check_report(&many),
            Err(BadReport::TooManyPeers(MAX_PATH_PEERS + 1))
        );
    }
}
