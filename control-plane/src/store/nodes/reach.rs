//! The reach columns of the `nodes` table (schema version 7): a node's candidates by kind,
//! its home relay and its NAT report, as its last endpoint report gave them.

use std::net::SocketAddr;

use plexsphere_wire::node::{NatMapping, NatReport};
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use crate::candidates::Candidates;
use crate::store::{StoreError, parse_col};

/// What a node's last endpoint report said of its reach (all empty until it reports).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeReach {
    pub candidates: Candidates,
    pub home_relay: Option<String>,
    /// `None` until the node reports (or from before schema version 7).
    pub nat: Option<NatReport>,
}

/// The reach columns of a node row (NULL columns are empty).
pub(super) fn reach_from_row(row: &sqlx::any::AnyRow) -> Result<NodeReach, StoreError> {
    let observed = row
        .try_get::<Option<String>, _>("observed_endpoint")?
        .map(|t| parse_col("nodes.observed_endpoint", &t))
        .transpose()?;
    let nat = match row.try_get::<Option<String>, _>("nat_mapping")? {
        None => None,
        Some(text) => Some(NatReport {
            mapping: nat_mapping_from(&text)
                .ok_or_else(|| StoreError::corrupt("nodes.nat_mapping", &text))?,
            udp_blocked: row.try_get::<Option<i64>, _>("udp_blocked")?.unwrap_or(0) != 0,
        }),
    };
    Ok(NodeReach {
        candidates: Candidates {
            local: json_list(row, "local_endpoints", "nodes.local_endpoints")?,
            reflexive: json_list(row, "reflexive_endpoints", "nodes.reflexive_endpoints")?,
            observed,
        },
        home_relay: row.try_get("home_relay")?,
        nat,
    })
}

fn json_text(list: &[SocketAddr], what: &'static str) -> Result<String, StoreError> {
    serde_json::to_string(list).map_err(|e| StoreError::corrupt(what, e))
}

/// The stored text of a NAT mapping (the wire's snake_case name).
fn nat_mapping_text(m: NatMapping) -> &'static str {
    match m {
        NatMapping::Unknown => "unknown",
        NatMapping::None => "none",
        NatMapping::EndpointIndependent => "endpoint_independent",
        NatMapping::EndpointDependent => "endpoint_dependent",
    }
}

fn nat_mapping_from(text: &str) -> Option<NatMapping> {
    [
        NatMapping::Unknown,
        NatMapping::None,
        NatMapping::EndpointIndependent,
        NatMapping::EndpointDependent,
    ]
    .into_iter()
    .find(|m| nat_mapping_text(*m) == text)
}

/// Stores the node's listen port, advertised endpoints and what it reported of its reach.
pub async fn set_endpoints(
    conn: &mut AnyConnection,
    id: Uuid,
    listen_port: u16,
    endpoints: &[SocketAddr],
    reach: &NodeReach,
) -> Result<(), StoreError> {
    let c = &reach.candidates;
    sqlx::query(
        "UPDATE nodes SET listen_port = $1, endpoints = $2, local_endpoints = $3, reflexive_endpoints = $4, \
         observed_endpoint = $5, home_relay = $6, nat_mapping = $7, udp_blocked = $8 WHERE id = $9",
    )
    .bind(i64::from(listen_port))
    .bind(json_text(endpoints, "nodes.endpoints (serializing)")?)
    .bind(json_text(&c.local, "nodes.local_endpoints (serializing)")?)
    .bind(json_text(&c.reflexive, "nodes.reflexive_endpoints (serializing)")?)
    .bind(c.observed.map(|a| a.to_string()))
    .bind(reach.home_relay.clone())
    .bind(reach.nat.as_ref().map(|n| nat_mapping_text(n.mapping).to_owned()))
    .bind(reach.nat.as_ref().map(|n| i64::from(n.udp_blocked)))
    .bind(id.to_string())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A nullable JSON array of `ip:port` (NULL is empty).
pub(super) fn json_list(
    row: &sqlx::any::AnyRow,
    column: &str,
    what: &'static str,
) -> Result<Vec<SocketAddr>, StoreError> {
    match row.try_get::<Option<String>, _>(column)? {
        None => Ok(Vec::new()),
        Some(text) => serde_json::from_str(&text).map_err(|e| StoreError::corrupt(what, e)),
    }
}
