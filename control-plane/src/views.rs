//! Stored rows -> the wire views operators see. Pure functions; time is a parameter.

use plexsphere_wire::admin::{
    CandidateKind, CandidateView, CloneView, NatView, NodeStatus, NodeView, TokenStatus, TokenView,
};
use plexsphere_wire::secret::TokenKind;

use crate::store::nodes::NodeRow;
use crate::store::tokens::TokenRow;
use crate::store::{StoreError, from_unix};

/// A token's status at `now`: revoked and consumed (every use taken) win over expired; a
/// reusable token with uses left stays active.
pub(crate) fn token_status(row: &TokenRow, now: i64) -> TokenStatus {
    if row.revoked_at.is_some() {
        TokenStatus::Revoked
    } else if row.consumed_at.is_some() || row.used_up() {
        TokenStatus::Consumed
    } else if row.expires_at <= now {
        TokenStatus::Expired
    } else {
        TokenStatus::Active
    }
}

pub(crate) fn token_view(row: &TokenRow, now: i64) -> Result<TokenView, StoreError> {
    Ok(TokenView {
        id: row.id.clone(),
        project_id: row.project_id,
        kind: TokenKind::parse(&row.kind)
            .ok_or_else(|| StoreError::corrupt("bootstrap_tokens.kind", &row.kind))?,
        env_prefix: row.env_prefix.clone(),
        status: token_status(row, now),
        created_at: from_unix("bootstrap_tokens.created_at", row.created_at)?,
        expires_at: from_unix("bootstrap_tokens.expires_at", row.expires_at)?,
        consumed_at: row
            .consumed_at
            .map(|t| from_unix("bootstrap_tokens.consumed_at", t))
            .transpose()?,
        consumed_by_node: row.consumed_by_node,
        revoked_at: row
            .revoked_at
            .map(|t| from_unix("bootstrap_tokens.revoked_at", t))
            .transpose()?,
        resource_id: row.resource_id,
        uses: row.uses,
        max_uses: row.usage.max_uses,
        ephemeral_offline_secs: row.usage.ephemeral_offline_secs,
        nodes: Vec::new(),
        tags: row.tags.clone(),
    })
}

/// A node is online while its last authenticated call is at most `offline_after` seconds old
/// (three heartbeat intervals unless configured).
pub(crate) fn node_status(row: &NodeRow, now: i64, offline_after: i64) -> NodeStatus {
    match (row.revoked_at, row.last_seen_at) {
        (Some(_), _) => NodeStatus::Revoked,
        (None, None) => NodeStatus::Registered,
        (None, Some(seen)) if now - seen <= offline_after => NodeStatus::Online,
        (None, Some(_)) => NodeStatus::Offline,
    }
}

pub(crate) fn node_view(
    row: &NodeRow,
    now: i64,
    offline_after: i64,
) -> Result<NodeView, StoreError> {
    Ok(NodeView {
        id: row.id,
        domain_id: row.domain_id,
        project_id: row.project_id,
        hostname: row.hostname.clone(),
        name: Some(row.dns_name.clone()),
        arch: row.arch.clone(),
        plexd_version: row.plexd_version.clone(),
        mesh_ip: row.mesh_ip,
        wireguard_public_key: row.wireguard_public_key.clone(),
        resource_handle: row.resource_handle.clone(),
        status: node_status(row, now, offline_after),
        registered_at: from_unix("nodes.registered_at", row.registered_at)?,
        last_seen_at: row
            .last_seen_at
            .map(|t| from_unix("nodes.last_seen_at", t))
            .transpose()?,
        endpoints: row.endpoints.iter().map(ToString::to_string).collect(),
        last_heartbeat_at: row
            .report
            .last_heartbeat_at
            .map(|t| from_unix("nodes.last_heartbeat_at", t))
            .transpose()?,
        uptime_secs: row.report.uptime_secs,
        applied_state_version: row.report.applied_state_version,
        peers_configured: row.report.peers_configured,
        peers_connected: row.report.peers_connected,
        observations_dropped: row.report.observations_dropped,
        candidates: candidates(row),
        home_relay: row.reach.home_relay.clone(),
        nat: row.reach.nat.as_ref().map(|n| NatView {
            mapping: n.mapping,
            udp_blocked: n.udp_blocked,
        }),
        key_rotated_at: row
            .rotation
            .key_rotated_at
            .map(|t| from_unix("nodes.key_rotated_at", t))
            .transpose()?,
        credential_rotated_at: row
            .rotation
            .credential_rotated_at
            .map(|t| from_unix("nodes.credential_rotated_at", t))
            .transpose()?,
        clone: None,
        ephemeral_offline_secs: row.origin.ephemeral_offline_secs,
        udp_offload: row.udp_offload,
        tags: row.tags.clone(),
    })
}

/// The refused requests from another host, as operators see them (`NodeView::clone`).
pub(crate) fn clone_view(
    c: &crate::store::nodes::hosts::CloneRecord,
) -> Result<CloneView, StoreError> {
    Ok(CloneView {
        first_seen_at: from_unix("nodes.clone_first_seen_at", c.first_seen_at)?,
        last_seen_at: from_unix("nodes.clone_last_seen_at", c.last_seen_at)?,
        requests: c.requests,
        last_addr: c.addr.clone(),
        last_fingerprint: c.fingerprint.clone(),
    })
}

/// A node's stored candidates by kind: local, then reflexive, then observed.
fn candidates(row: &NodeRow) -> Vec<CandidateView> {
    let c = &row.reach.candidates;
    let tagged =
        |kind: CandidateKind| move |a: &std::net::SocketAddr| CandidateView { kind, address: *a };
    c.local
        .iter()
        .map(tagged(CandidateKind::Local))
        .chain(c.reflexive.iter().map(tagged(CandidateKind::Reflexive)))
        .chain(c.observed.iter().map(tagged(CandidateKind::Observed)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::nodes::NodeReport;
    use uuid::Uuid;

    fn token() -> TokenRow {
        TokenRow {
            id: "0123456789abcdef".into(),
            project_id: Uuid::from_u128(1),
            kind: "node".into(),
            env_prefix: "lab".into(),
            secret_sha256: String::new(),
            created_at: 100,
            expires_at: 200,
            consumed_at: None,
            consumed_by_node: None,
            revoked_at: None,
            resource_id: None,
            usage: crate::store::tokens::TokenUsage::default(),
            uses: 0,
            tags: Vec::new(),
        }
    }

    #[test]
    fn node_statuses() {
        let mut n = NodeRow {
            registered_at: 100,
            listen_port: Some(51820),
            ..NodeRow::for_test(1, "10.64.0.1")
        };
        assert_eq!(node_status(&n, 500, 90), NodeStatus::Registered);
        let fresh = node_view(&n, 500, 90).unwrap();
        assert_eq!(fresh.last_heartbeat_at, None);
        assert_eq!((fresh.uptime_secs, fresh.peers_connected), (None, None));
        assert_eq!(fresh.observations_dropped, 0);
        n.last_seen_at = Some(410);
        assert_eq!(node_status(&n, 500, 90), NodeStatus::Online);
        assert_eq!(node_status(&n, 501, 90), NodeStatus::Offline);
        assert_eq!(
            node_view(&n, 500, 90).unwrap().endpoints,
            vec!["192.0.2.1:51820"]
        );
        n.revoked_at = Some(450);
        assert_eq!(node_status(&n, 420, 90), NodeStatus::Revoked);
    }

    #[test]
    fn node_view_shows_the_last_heartbeat_and_dropped_observations() {
        let n = NodeRow {
            // Any authenticated call moves last_seen_at; only a heartbeat moves the report.
            last_seen_at: Some(480),
            report: NodeReport {
                last_heartbeat_at: Some(450),
                uptime_secs: Some(3600),
                applied_state_version: Some(7),
                peers_configured: Some(3),
                peers_connected: Some(2),
                observations_dropped: 5,
            },
            ..NodeRow::for_test(1, "10.64.0.1")
        };
        let v = node_view(&n, 500, 90).unwrap();
        assert_eq!(v.last_seen_at.map(|t| t.unix_timestamp()), Some(480));
        assert_eq!(v.last_heartbeat_at.map(|t| t.unix_timestamp()), Some(450));
        assert_eq!(v.uptime_secs, Some(3600));
        assert_eq!(v.applied_state_version, Some(7));
        assert_eq!((v.peers_configured, v.peers_connected), (Some(3), Some(2)));
        assert_eq!(v.observations_dropped, 5);
        // Node status still follows last_seen_at, not the heartbeat.
        assert_eq!(v.status, NodeStatus::Online);
    }

    #[test]
    fn token_statuses() {
        let t = token();
        assert_eq!(token_status(&t, 150), TokenStatus::Active);
        assert_eq!(token_status(&t, 200), TokenStatus::Expired);
        let used = TokenRow {
            consumed_at: Some(150),
            ..t.clone()
        };
        assert_eq!(token_status(&used, 500), TokenStatus::Consumed);
        let revoked = TokenRow {
            revoked_at: Some(150),
            ..t
        };
        assert_eq!(token_status(&revoked, 500), TokenStatus::Revoked);
        assert_eq!(
            token_view(&revoked, 500).unwrap().status,
            TokenStatus::Revoked
        );
        // A reusable token stays active until its last use is taken.
        let reusable = TokenRow {
            usage: crate::store::tokens::TokenUsage {
                max_uses: 3,
                ephemeral_offline_secs: Some(1800),
            },
            uses: 2,
            ..token()
        };
        assert_eq!(token_status(&reusable, 150), TokenStatus::Active);
        let v = token_view(&reusable, 150).unwrap();
        assert_eq!(
            (v.uses, v.max_uses, v.ephemeral_offline_secs),
            (2, 3, Some(1800))
        );
        let full = TokenRow {
            uses: 3,
            ..reusable
        };
        assert_eq!(token_status(&full, 150), TokenStatus::Consumed);
    }
}
