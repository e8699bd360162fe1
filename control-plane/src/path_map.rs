//! The console's path views, pure (time is a parameter): a pair's link from both sides'
//! reports, the mesh map, a node's peers (docs/api.md "Paths"). The JSON of these types is
//! the contract with the console (`control-plane/console/`).

use std::collections::{BTreeMap, HashSet};

use plexsphere_wire::paths::PathKind;
use serde::Serialize;
use uuid::Uuid;

use crate::store::paths::{MapNode, PathRow};

/// RFC 3339 of a unix time (`None` for a time out of range).
pub(crate) fn rfc3339(t: i64) -> Option<String> {
    time::OffsetDateTime::from_unix_timestamp(t)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
}

/// A node on the map.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct MapNodeView {
    pub id: Uuid,
    pub name: String,
    pub mesh_ip: String,
    pub project_id: Uuid,
    pub online: bool,
    pub last_seen_at: Option<String>,
    pub version: String,
}

/// One unordered pair that has a report from either side (`a` < `b`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct LinkView {
    pub a: Uuid,
    pub b: Uuid,
    /// `direct`, `relay` or `none`.
    pub path: &'static str,
    pub relay: Option<String>,
    /// `udp` or `tcp` for a relayed path.
    pub transport: Option<&'static str>,
    pub rtt_ms: Option<f64>,
    pub updated_at: Option<String>,
}

/// `GET /v1/mesh/map`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct MapView {
    pub nodes: Vec<MapNodeView>,
    pub links: Vec<LinkView>,
}

/// Which of two reports of one pair the link shows: one with a path over one without, then
/// the newer.
fn better<'a>(x: &'a PathRow, y: &'a PathRow) -> &'a PathRow {
    let has = |r: &PathRow| !matches!(r.path, PathKind::None);
    match (has(x), has(y)) {
        (true, false) => x,
        (false, true) => y,
        _ if y.updated_at > x.updated_at => y,
        _ => x,
    }
}

/// The link of each pair in `rows` whose both nodes are in `seen`, by pair.
pub(crate) fn links(rows: &[PathRow], seen: &HashSet<Uuid>) -> Vec<LinkView> {
    let mut pairs: BTreeMap<(Uuid, Uuid), &PathRow> = BTreeMap::new();
    for r in rows {
        if r.node_id == r.peer_node_id
            || !seen.contains(&r.node_id)
            || !seen.contains(&r.peer_node_id)
        {
            continue;
        }
        let key = if r.node_id < r.peer_node_id {
            (r.node_id, r.peer_node_id)
        } else {
            (r.peer_node_id, r.node_id)
        };
        pairs
            .entry(key)
            .and_modify(|cur| *cur = better(cur, r))
            .or_insert(r);
    }
    pairs
        .into_iter()
        .map(|((a, b), r)| link_of(a, b, r))
        .collect()
}

fn link_of(a: Uuid, b: Uuid, r: &PathRow) -> LinkView {
    let (relay, transport) = match &r.path {
        PathKind::Relay { relay, transport } => (Some(relay.clone()), Some(transport.as_str())),
        _ => (None, None),
    };
    LinkView {
        a,
        b,
        path: r.path.as_str(),
        relay,
        transport,
        rtt_ms: r.rtt_ms,
        updated_at: rfc3339(r.updated_at),
    }
}

/// The map of `nodes` (already filtered to what the caller sees) and their links.
pub(crate) fn map(nodes: &[MapNode], rows: &[PathRow], now: i64, offline_after: i64) -> MapView {
    let seen: HashSet<Uuid> = nodes.iter().map(|n| n.id).collect();
    MapView {
        nodes: nodes
            .iter()
            .map(|n| node_view(n, now, offline_after))
            .collect(),
        links: links(rows, &seen),
    }
}

/// A node as the map shows it.
pub(crate) fn node_view(n: &MapNode, now: i64, offline_after: i64) -> MapNodeView {
    MapNodeView {
        id: n.id,
        name: n.name.clone(),
        mesh_ip: n.mesh_ip.to_string(),
        project_id: n.project_id,
        online: n.last_seen_at.is_some_and(|s| now - s <= offline_after),
        last_seen_at: n.last_seen_at.and_then(rfc3339),
        version: n.version.clone(),
    }
}

/// One peer on a node's page.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct PeerPathView {
    pub peer_node_id: Uuid,
    pub peer_name: Option<String>,
    pub path: &'static str,
    pub relay: Option<String>,
    pub transport: Option<&'static str>,
    pub endpoint: Option<String>,
    pub rtt_ms: Option<f64>,
    pub last_handshake_at: Option<String>,
    pub updated_at: Option<String>,
}

pub(crate) fn peer_view(r: &PathRow, peer_name: Option<String>) -> PeerPathView {
    let l = link_of(r.node_id, r.peer_node_id, r);
    PeerPathView {
        peer_node_id: r.peer_node_id,
        peer_name,
        path: l.path,
        relay: l.relay,
        transport: l.transport,
        endpoint: match &r.path {
            PathKind::Direct { endpoint } => Some(endpoint.to_string()),
            _ => None,
        },
        rtt_ms: r.rtt_ms,
        last_handshake_at: r.last_handshake_at.and_then(rfc3339),
        updated_at: l.updated_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexsphere_wire::paths::PathTransport;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn row(from: u128, to: u128, path: PathKind, at: i64) -> PathRow {
        PathRow {
            node_id: id(from),
            peer_node_id: id(to),
            path,
            rtt_ms: Some(1.5),
            last_handshake_at: None,
            updated_at: at,
            seq: 1,
        }
    }

    fn direct() -> PathKind {
        PathKind::Direct {
            endpoint: "192.0.2.1:51820".parse().unwrap_or_else(|_| unreachable!()),
        }
    }

    #[test]
    fn a_pair_is_one_link_from_the_side_with_a_path_then_the_newer() {
        let seen: HashSet<Uuid> = [id(1), id(2), id(3)].into();
        let relay = PathKind::Relay {
            relay: "r1".into(),
            transport: PathTransport::Tcp,
        };
        let rows = vec![
            row(2, 1, PathKind::None, 20),
            row(1, 2, direct(), 10),
            row(1, 3, direct(), 10),
            row(3, 1, relay, 11),
        ];
        let l = links(&rows, &seen);
        assert_eq!(l.len(), 2);
        assert_eq!((l[0].a, l[0].b, l[0].path), (id(1), id(2), "direct"));
        assert_eq!((l[1].a, l[1].b, l[1].path), (id(1), id(3), "relay"));
        assert_eq!(l[1].relay.as_deref(), Some("r1"));
        assert_eq!(l[1].transport, Some("tcp"));
        let json = serde_json::to_value(&l[1]).unwrap_or_default();
        assert_eq!(json["updated_at"], "1970-01-01T00:00:11Z");
    }

    #[test]
    fn links_to_nodes_the_caller_does_not_see_are_left_out() {
        let seen: HashSet<Uuid> = [id(1), id(2)].into();
        let rows = vec![
            row(1, 2, direct(), 1),
            row(1, 3, direct(), 1),
            row(3, 4, direct(), 1),
        ];
        let l = links(&rows, &seen);
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].a, l[0].b), (id(1), id(2)));
    }
}
