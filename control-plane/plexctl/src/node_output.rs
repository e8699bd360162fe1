//! How plexctl prints nodes: the node list, one node in full (its status, reach, rotation,
//! observations and clone suspicion), a node's NAT as the control plane sees it, and uptimes.
//! The tables and the value spellings are [`crate::output`]'s.

use plexsphere_wire::admin::{CandidateKind, CloneView, NatView, NodeView};
use plexsphere_wire::node::NatMapping;

use crate::output::{details, opt, table, tags, text, time};

pub fn nodes(items: &[NodeView]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|n| {
            vec![
                n.id.to_string(),
                text(n.name()),
                text(&n.hostname),
                n.mesh_ip.to_string(),
                status_flagged(n),
                opt(n.last_seen_at, time),
                endpoints(&n.endpoints, ","),
                text(&n.plexd_version),
                n.project_id.to_string(),
                tags(&n.tags),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "NAME",
            "HOSTNAME",
            "MESH IP",
            "STATUS",
            "LAST SEEN",
            "ENDPOINTS",
            "VERSION",
            "PROJECT",
            "TAGS",
        ],
        &rows,
    )
}

/// A node's status, flagged `+clone` when requests with its credential came from another host
/// and `+ephemeral` when the control plane removes it once offline too long.
fn status_flagged(n: &NodeView) -> String {
    let mut s = n.status.as_str().to_owned();
    if n.clone.is_some() {
        s.push_str("+clone");
    }
    if n.ephemeral_offline_secs.is_some() {
        s.push_str("+ephemeral");
    }
    s
}

/// `clone suspected: <first seen>, <count> requests from <addr> (last <time>)`.
fn clone_line(c: &CloneView) -> String {
    format!(
        "{}, {} requests from {} (last {}); they were refused, see docs/operations.md \"Clones and golden images\"",
        time(c.first_seen_at),
        c.requests,
        text(&c.last_addr),
        time(c.last_seen_at)
    )
}

/// A node's endpoints, best first, or `-`.
fn endpoints(list: &[String], separator: &str) -> String {
    if list.is_empty() {
        "-".to_owned()
    } else {
        list.iter()
            .map(|e| text(e))
            .collect::<Vec<_>>()
            .join(separator)
    }
}

/// `node get`: every field of one node, one per line; the heartbeat's figures are `-` until
/// the node heartbeats, and `observations dropped` appears only when the node dropped some.
/// A `clone suspected` line follows the status when requests with the node's credential came
/// from another host (they were refused). Then what the node reported of its reach: its candidates by kind (`local`, `reflexive`,
/// `observed`), its home relay and what its NAT does to mappings, `-` until it reports.
pub fn node(n: &NodeView) -> String {
    let peers = match (n.peers_connected, n.peers_configured) {
        (Some(connected), Some(configured)) => format!("{connected} of {configured} connected"),
        _ => "-".to_owned(),
    };
    let mut pairs = vec![
        ("id", n.id.to_string()),
        ("name", text(n.name())),
        ("hostname", text(&n.hostname)),
        ("mesh ip", n.mesh_ip.to_string()),
        ("status", n.status.as_str().to_owned()),
    ];
    if let Some(secs) = n.ephemeral_offline_secs {
        pairs.push((
            "ephemeral",
            format!(
                "removed after {} offline",
                plexsphere_wire::duration::format(secs)
            ),
        ));
    }
    if let Some(c) = &n.clone {
        pairs.push(("clone suspected", clone_line(c)));
    }
    if let Some(u) = n.udp_offload {
        pairs.push(("udp offload", u.as_str().to_owned()));
    }
    if !n.tags.is_empty() {
        pairs.push(("tags", tags(&n.tags)));
    }
    pairs.extend([
        ("last seen", opt(n.last_seen_at, time)),
        ("last heartbeat", opt(n.last_heartbeat_at, time)),
        ("uptime", opt(n.uptime_secs, uptime)),
        (
            "state applied",
            opt(n.applied_state_version, |v| v.to_string()),
        ),
        ("peers", peers),
    ]);
    if n.observations_dropped > 0 {
        pairs.push(("observations dropped", n.observations_dropped.to_string()));
    }
    pairs.extend([
        ("registered", time(n.registered_at)),
        ("version", text(&n.plexd_version)),
        ("arch", text(&n.arch)),
        ("project", n.project_id.to_string()),
        ("domain", n.domain_id.to_string()),
        ("resource handle", opt(n.resource_handle.as_deref(), text)),
        ("wireguard key", text(&n.wireguard_public_key)),
        ("endpoints", endpoints(&n.endpoints, ", ")),
        ("local", candidates(n, CandidateKind::Local)),
        ("reflexive", candidates(n, CandidateKind::Reflexive)),
        ("observed", candidates(n, CandidateKind::Observed)),
        ("home relay", opt(n.home_relay.as_deref(), text)),
        ("nat", opt(n.nat.as_ref(), nat)),
    ]);
    // Only once a rotation happened (older servers and fresh nodes show nothing).
    if let Some(t) = n.key_rotated_at {
        pairs.push(("key rotated", time(t)));
    }
    if let Some(t) = n.credential_rotated_at {
        pairs.push(("credential rotated", time(t)));
    }
    details(&pairs)
}

/// A node's candidates of one kind, in its order, or `-`.
fn candidates(n: &NodeView, kind: CandidateKind) -> String {
    let list: Vec<String> = n
        .candidates
        .iter()
        .filter(|c| c.kind == kind)
        .map(|c| c.address.to_string())
        .collect();
    endpoints(&list, ", ")
}

/// What a node's NAT does to its mappings, and whether UDP is blocked.
pub fn nat(n: &NatView) -> String {
    let mapping = match n.mapping {
        NatMapping::EndpointIndependent => {
            "endpoint-independent mapping (direct paths can be punched)"
        }
        NatMapping::EndpointDependent => {
            "endpoint-dependent mapping (peers behind NAT reach it through a relay)"
        }
        NatMapping::None => "none (its address is its own)",
        NatMapping::Unknown => "unknown (fewer than two STUN servers answered)",
    };
    if n.udp_blocked {
        format!("{mapping}; UDP blocked (no STUN server answered: relayed over TCP)")
    } else {
        mapping.to_owned()
    }
}

/// A duration in seconds as days, hours, minutes and seconds, skipping zero parts:
/// `3d 4h 0m 5s` is shown as `3d 4h 5s`; zero is `0s`.
pub fn uptime(secs: u64) -> String {
    let parts = [
        (secs / 86_400, 'd'),
        (secs / 3_600 % 24, 'h'),
        (secs / 60 % 60, 'm'),
        (secs % 60, 's'),
    ];
    let shown: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    if shown.is_empty() {
        "0s".to_owned()
    } else {
        shown.join(" ")
    }
}

#[cfg(test)]
mod tests;
