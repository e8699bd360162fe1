//! Nodes by name: every command that takes a node id also takes its name, the NAME column of
//! `plexctl node list` (its DNS name; when none matches, its resource handle when it has one,
//! else its hostname; `NodeView::name`). A name must match exactly one node the token can see; an unknown or
//! ambiguous name is an error that lists the candidates.

use plexsphere_wire::admin::{List, NodeView};
use uuid::Uuid;

use crate::client::Api;
use crate::failure::Failure;

/// The most candidates an error lists; more are counted, not shown.
const MAX_CANDIDATES_SHOWN: usize = 10;

/// A node given by id is used as is; a name is looked up in `GET /v1/nodes`.
pub async fn node_id(api: &Api, given: &str) -> Result<Uuid, Failure> {
    let given = given.trim();
    if let Ok(id) = Uuid::parse_str(given) {
        return Ok(id);
    }
    check_name(given)?;
    let list: List<NodeView> = api.get(&["v1", "nodes"], &[]).await?;
    node_by_name(&list.items, given)
}

/// Refuses what cannot be a name before asking the server (names are hostnames or handles).
fn check_name(given: &str) -> Result<(), Failure> {
    let ok = (1..=253).contains(&given.len())
        && given
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if ok {
        Ok(())
    } else {
        Err(Failure::Usage(format!(
            "`{given}` is neither a node id (a UUID) nor a node name; see the ID and NAME columns of `plexctl node list`"
        )))
    }
}

/// Finds the one node named `name` (pure). Revoked nodes count only when no live node has
/// the name, so a name reused after a revocation means the live node.
pub fn node_by_name(nodes: &[NodeView], name: &str) -> Result<Uuid, Failure> {
    use plexsphere_wire::admin::NodeStatus;
    let mut named: Vec<&NodeView> = nodes.iter().filter(|n| n.name() == name).collect();
    if named.is_empty() {
        // The name before DNS names (resource handle, else hostname) still finds a node.
        named = nodes.iter().filter(|n| n.legacy_name() == name).collect();
    }
    let live: Vec<&NodeView> = named
        .iter()
        .copied()
        .filter(|n| n.status != NodeStatus::Revoked)
        .collect();
    let found = if live.is_empty() { named } else { live };
    match found.as_slice() {
        [one] => Ok(one.id),
        [] => Err(Failure::NotFound(format!(
            "no node is named `{name}`{}; see `plexctl node list`",
            similar(nodes, name)
        ))),
        many => Err(Failure::Usage(format!(
            "the name `{name}` matches {} nodes: {}; give the node's id",
            many.len(),
            candidates(many)
        ))),
    }
}

/// `id (hostname, mesh IP, status)` for each, at most [`MAX_CANDIDATES_SHOWN`].
fn candidates(nodes: &[&NodeView]) -> String {
    let mut shown: Vec<String> = nodes
        .iter()
        .take(MAX_CANDIDATES_SHOWN)
        .map(|n| {
            format!(
                "{} ({}, {}, {})",
                n.id,
                n.hostname,
                n.mesh_ip,
                n.status.as_str()
            )
        })
        .collect();
    if nodes.len() > MAX_CANDIDATES_SHOWN {
        shown.push(format!("and {} more", nodes.len() - MAX_CANDIDATES_SHOWN));
    }
    shown.join(", ")
}

/// `; names that start the same: a, b` when some node names share the first characters.
fn similar(nodes: &[NodeView], name: &str) -> String {
    let prefix: String = name.chars().take(3).collect();
    let mut close: Vec<&str> = nodes
        .iter()
        .map(NodeView::name)
        .filter(|n| n.starts_with(&prefix))
        .collect();
    close.sort_unstable();
    close.dedup();
    close.truncate(MAX_CANDIDATES_SHOWN);
    if close.is_empty() {
        String::new()
    } else {
        format!(" (names that start the same: {})", close.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use plexsphere_wire::admin::NodeStatus;

    use super::*;

    fn node(n: u128, hostname: &str, handle: Option<&str>, status: NodeStatus) -> NodeView {
        let v = serde_json::json!({
            "id": Uuid::from_u128(n), "domain_id": Uuid::from_u128(100),
            "project_id": Uuid::from_u128(200), "hostname": hostname, "arch": "amd64",
            "plexd_version": "0.1.0", "mesh_ip": format!("10.64.0.{n}"),
            "wireguard_public_key": "k", "resource_handle": handle, "status": status,
            "registered_at": "2026-11-30T10:00:00Z",
        });
        match serde_json::from_value(v) {
            Ok(v) => v,
            Err(e) => panic!("a test node view: {e}"),
        }
    }

    #[test]
    fn a_name_is_the_handle_else_the_hostname() {
        let nodes = [
            node(1, "ip-10-0-0-1", Some("web-1"), NodeStatus::Online),
            node(2, "db-1", None, NodeStatus::Online),
        ];
        assert_eq!(node_by_name(&nodes, "web-1").ok(), Some(Uuid::from_u128(1)));
        assert_eq!(node_by_name(&nodes, "db-1").ok(), Some(Uuid::from_u128(2)));
        // A node with a handle is not found by its hostname.
        let e = node_by_name(&nodes, "ip-10-0-0-1")
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("no node is named `ip-10-0-0-1`; see `plexctl node list`")
        );
    }

    #[test]
    fn unknown_and_ambiguous_names_list_candidates() {
        let nodes = [
            node(1, "web-1", None, NodeStatus::Online),
            node(2, "web-1", None, NodeStatus::Offline),
            node(3, "web-2", None, NodeStatus::Online),
        ];
        let e = node_by_name(&nodes, "web-1").err();
        assert!(matches!(e, Some(Failure::Usage(_))), "{e:?}");
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.starts_with(
                "the name `web-1` matches 2 nodes: 00000000-0000-0000-0000-000000000001 (web-1, "
            ),
            "{text}"
        );
        assert!(
            text.contains("00000000-0000-0000-0000-000000000002"),
            "{text}"
        );
        assert!(text.ends_with("; give the node's id"), "{text}");
        let e = node_by_name(&nodes, "web-3").err();
        assert!(matches!(e, Some(Failure::NotFound(_))), "{e:?}");
        assert_eq!(
            e.map(|e| e.to_string()).as_deref(),
            Some(
                "no node is named `web-3` (names that start the same: web-1, web-2); see `plexctl node list`"
            )
        );
    }

    #[test]
    fn a_live_node_wins_over_a_revoked_one_of_the_same_name() {
        let nodes = [
            node(1, "web-1", None, NodeStatus::Revoked),
            node(2, "web-1", None, NodeStatus::Online),
        ];
        assert_eq!(node_by_name(&nodes, "web-1").ok(), Some(Uuid::from_u128(2)));
        let only_revoked = [node(1, "web-1", None, NodeStatus::Revoked)];
        assert_eq!(
            node_by_name(&only_revoked, "web-1").ok(),
            Some(Uuid::from_u128(1))
        );
    }

    #[test]
    fn what_cannot_be_a_name_is_refused_before_any_request() {
        assert!(check_name("web-1.lab_a").is_ok());
        for bad in ["", "web 1", "web/1", &"a".repeat(254)] {
            assert!(matches!(check_name(bad), Err(Failure::Usage(_))), "{bad:?}");
        }
    }
}
