//! The test fixture of a `nodes` row ([`NodeRow::for_test`]), for the crate's unit tests.

use std::net::SocketAddr;

use uuid::Uuid;

use super::{NodeOrigin, NodeReach, NodeReport, NodeRotation, NodeRow};

impl NodeRow {
    /// A node for unit tests: `n` names it (id, hostname `node-<n>`, key `key-<n>`), in Domain
    /// 100 and Project 200, registered at 1, never seen, with one endpoint.
    pub(crate) fn for_test(n: u128, mesh_ip: &str) -> Self {
        NodeRow {
            id: Uuid::from_u128(n),
            domain_id: Uuid::from_u128(100),
            project_id: Uuid::from_u128(200),
            hostname: format!("node-{n}"),
            arch: "amd64".into(),
            plexd_version: "0.1.0".into(),
            mesh_ip: match mesh_ip.parse() {
                Ok(ip) => ip,
                Err(e) => panic!("a test node's mesh IP {mesh_ip:?}: {e}"),
            },
            wireguard_public_key: format!("key-{n}"),
            resource_handle: None,
            credential_sha256: String::new(),
            registered_at: 1,
            last_seen_at: None,
            revoked_at: None,
            listen_port: None,
            endpoints: vec![SocketAddr::from(([192, 0, 2, 1], 51820))],
            report: NodeReport::default(),
            reach: NodeReach::default(),
            rotation: NodeRotation::default(),
            host_fingerprint: None,
            origin: NodeOrigin::default(),
            udp_offload: None,
            tags: Vec::new(),
            dns_name: format!("node-{n}"),
        }
    }
}
