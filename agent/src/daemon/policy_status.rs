//! What `plexd status` and `plexd policy` show of the access policy (docs/policy.md "On the
//! node"): the version the signed state carries, whether its filter is installed or closed
//! (and why), the data plane's drop counters and flow table, and the view's own lines.

use std::fmt::Write as _;

pub use super::core::policy_status::{DropCount, FilterState, PolicyReport, PolicyStatus};

/// Why the policy of `version` keeps this node from pinging `peer` (named `name`), if it
/// does: the view has no document, so the answer names the rule that would be needed.
pub fn ping_refusal(
    view: &plexsphere_policy::view::NodeView,
    version: u64,
    peer: uuid::Uuid,
    name: &str,
) -> Option<String> {
    let Some(p) = view.peers.iter().find(|p| p.id == peer) else {
        return Some(format!(
            "{name} is not a peer of this node: no rule of policy version {version} connects this node and {name} in either direction (plexctl policy explain shows why)"
        ));
    };
    let icmp = view.grant(p.outbound).is_some_and(|g| g.access.icmp);
    (!icmp).then(|| {
        format!(
            "no rule of policy version {version} lets this node open icmp to {name}; a rule such as `- {{src: node:{}, dst: node:{name}, proto: icmp}}` would (plexd policy lists what it may open)",
            view.node
        )
    })
}

/// The data plane's drop counters and flow count, read when a report is answered.
pub fn add_counters(status: &mut PolicyStatus, reader: &plexd_dataplane::PolicyReader) {
    status.flows = Some(reader.flows());
    status.drops = reader
        .drops()
        .into_iter()
        .map(|(reason, inbound, outbound)| DropCount {
            reason: reason.to_owned(),
            inbound,
            outbound,
        })
        .collect();
}

/// The `policy` lines of `plexd status`.
pub fn status_lines(p: &PolicyStatus) -> Vec<String> {
    let version = p
        .version
        .map_or_else(|| "none".to_owned(), |v| format!("version {v}"));
    let mut out = vec![match p.filter {
        FilterState::Pending => {
            "no state applied yet (the embedded data plane lets nothing through until one is)"
                .to_owned()
        }
        FilterState::None => {
            "none: the control plane sends no policy; nothing is filtered".to_owned()
        }
        FilterState::Installed => format!("{version}, filter installed, {} peers", p.peers),
        FilterState::Closed => format!(
            "{version}, filter CLOSED (nothing passes to or from any peer): {}",
            p.why.as_deref().unwrap_or("unknown reason")
        ),
    }];
    if let Some(n) = p.flows {
        out.push(format!("{n} flows in the flow table"));
    }
    let dropped: Vec<String> = p
        .drops
        .iter()
        .filter(|d| d.inbound + d.outbound > 0)
        .map(|d| format!("{} {} in / {} out", d.reason, d.inbound, d.outbound))
        .collect();
    if !p.drops.is_empty() {
        out.push(if dropped.is_empty() {
            "dropped nothing".to_owned()
        } else {
            format!("dropped: {}", dropped.join(", "))
        });
    }
    out
}

/// `plexd policy`'s text.
pub fn render_report(r: &PolicyReport) -> String {
    let mut out = String::new();
    for line in status_lines(&r.status) {
        let _ = writeln!(out, "policy  {line}");
    }
    for line in &r.lines {
        let _ = writeln!(out, "  {line}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_and_drops_are_said() {
        let p = PolicyStatus {
            version: Some(4),
            filter: FilterState::Closed,
            why: Some("the view is corrupt".into()),
            peers: 2,
            flows: Some(3),
            drops: vec![
                DropCount {
                    reason: "no_rule".into(),
                    inbound: 5,
                    outbound: 1,
                },
                DropCount {
                    reason: "spoofed_source".into(),
                    inbound: 0,
                    outbound: 0,
                },
            ],
        };
        let lines = status_lines(&p);
        assert!(lines[0].contains("version 4, filter CLOSED"), "{lines:?}");
        assert!(lines[0].contains("the view is corrupt"));
        assert_eq!(lines[2], "dropped: no_rule 5 in / 1 out");
        let none = status_lines(&PolicyStatus {
            filter: FilterState::None,
            ..PolicyStatus::default()
        });
        assert!(none[0].contains("nothing is filtered"));
    }

    #[test]
    fn ping_names_the_rule_that_would_be_needed() {
        use plexsphere_policy::{Compiled, Inventory, NodeInfo, ProjectInfo, parse};
        let project = uuid::Uuid::from_u128(100);
        let node = |i: u128, name: &str| NodeInfo {
            id: uuid::Uuid::from_u128(i),
            name: name.into(),
            project_id: project,
            project_slug: "p".into(),
            tags: vec![name.into()],
            ipv4: Some(std::net::Ipv4Addr::new(10, 64, 0, i as u8)),
            ipv6: None,
        };
        let inv = Inventory {
            projects: vec![ProjectInfo {
                id: project,
                slug: "p".into(),
            }],
            nodes: vec![node(1, "web"), node(2, "db"), node(3, "ci")],
            tags: vec![],
        };
        let doc = "rules:\n  - {src: tag:web, dst: tag:db, proto: tcp, ports: 5432}\n  - {src: tag:ci, dst: tag:db, proto: icmp}\n";
        let c = Compiled::new(&parse(doc).unwrap(), &inv);
        let web = c.node_view(uuid::Uuid::from_u128(1)).unwrap();
        let db = uuid::Uuid::from_u128(2);
        let why = ping_refusal(&web, 9, db, "db").unwrap();
        assert!(
            why.starts_with("no rule of policy version 9 lets this node open icmp to db"),
            "{why}"
        );
        assert!(why.contains("dst: node:db, proto: icmp"), "{why}");
        let ci = uuid::Uuid::from_u128(3);
        let why = ping_refusal(&web, 9, ci, "ci").unwrap();
        assert!(why.contains("ci is not a peer of this node"), "{why}");
        let ci_view = c.node_view(ci).unwrap();
        assert_eq!(ping_refusal(&ci_view, 9, db, "db"), None, "ci may ping db");
    }
}
