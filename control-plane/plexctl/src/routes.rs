//! `plexctl route list|approve|deny` and `plexctl dns suffix get|set` (issue 27,
//! docs/routes.md, docs/dns.md).

use clap::Subcommand;
use plexsphere_wire::routes::{DnsSettings, RouteDecision, RouteEntry, check_suffix};
use time::OffsetDateTime;

use crate::config::Settings;
use crate::failure::Failure;
use crate::names::node_id;
use crate::output::{Format, render, table, text, time};
use crate::session::operator_api;

#[derive(Debug, Subcommand)]
pub enum DnsCommand {
    /// Show or set the Domain's DNS suffix
    #[command(subcommand)]
    Suffix(SuffixCommand),
}

#[derive(Debug, Subcommand)]
pub enum SuffixCommand {
    /// Print the suffix
    Get {
        /// The Domain's id or slug (may be left out when the token sees one Domain)
        #[arg(long, value_name = "DOMAIN")]
        domain: Option<String>,
    },
    /// Set the suffix (needs an admin token not limited to a project); every node of the
    /// Domain answers the new names at once
    Set {
        /// Dot-separated labels of a-z, 0-9 and '-', e.g. mesh.internal
        #[arg(value_name = "SUFFIX")]
        suffix: String,
        /// The Domain's id or slug (may be left out when the token sees one Domain)
        #[arg(long, value_name = "DOMAIN")]
        domain: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum RouteCommand {
    /// List every route and exit with its routers: primary first, then standbys and the
    /// inactive ones, each with why
    List,
    /// Approve a node's route (or its exit: CIDR 0.0.0.0/0)
    Approve {
        /// The router's id or name (the NAME column of `node list`)
        #[arg(value_name = "NODE")]
        node: String,
        /// The route, e.g. 10.1.0.0/24; 0.0.0.0/0 (or ::/0) is the node's exit
        #[arg(value_name = "CIDR")]
        cidr: String,
    },
    /// Deny a node's route (or exit); a denied route stays denied until approved
    Deny {
        /// The router's id or name (the NAME column of `node list`)
        #[arg(value_name = "NODE")]
        node: String,
        /// The route, e.g. 10.1.0.0/24; 0.0.0.0/0 (or ::/0) is the node's exit
        #[arg(value_name = "CIDR")]
        cidr: String,
    },
}

pub async fn dns(cmd: &DnsCommand, format: Format, settings: &Settings) -> Result<String, Failure> {
    let api = &operator_api(settings)?;
    let DnsCommand::Suffix(cmd) = cmd;
    let shown = match cmd {
        SuffixCommand::Get { domain } => {
            let domain = crate::policy::domain_of(api, domain.as_deref()).await?;
            let got: DnsSettings = api.get(&["v1", "domains", &domain, "dns"], &[]).await?;
            got
        }
        SuffixCommand::Set { suffix, domain } => {
            check_suffix(suffix).map_err(Failure::Usage)?;
            let domain = crate::policy::domain_of(api, domain.as_deref()).await?;
            let body = DnsSettings {
                suffix: suffix.clone(),
            };
            let got: DnsSettings = api.put(&["v1", "domains", &domain, "dns"], &body).await?;
            got
        }
    };
    render(format, &shown, |s| format!("{}\n", s.suffix))
}

pub async fn run(
    cmd: &RouteCommand,
    format: Format,
    settings: &Settings,
) -> Result<String, Failure> {
    let api = &operator_api(settings)?;
    match cmd {
        RouteCommand::List => {
            let list: Vec<RouteEntry> = api.get(&["v1", "routes"], &[]).await?;
            render(format, list.as_slice(), routes_table)
        }
        RouteCommand::Approve { node, cidr } | RouteCommand::Deny { node, cidr } => {
            let cidr = cidr.trim().parse().map_err(|e| {
                Failure::Usage(format!(
                    "`{cidr}` is not a CIDR ({e}); write it as 10.1.0.0/24, or 0.0.0.0/0 for an exit"
                ))
            })?;
            let body = RouteDecision {
                node_id: node_id(api, node).await?,
                cidr,
            };
            let what = match cmd {
                RouteCommand::Approve { .. } => "approve",
                _ => "deny",
            };
            let entry: RouteEntry = api.post(&["v1", "routes", what], Some(&body)).await?;
            render(format, &entry, |e| routes_table(std::slice::from_ref(e)))
        }
    }
}

fn unix(secs: i64) -> String {
    OffsetDateTime::from_unix_timestamp(secs).map_or_else(|_| "-".to_owned(), time)
}

/// One line per router: the route's CIDR, the router, its approval, role, health, last
/// report and why it has that role.
pub fn routes_table(items: &[RouteEntry]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .flat_map(|e| {
            e.routers.iter().map(move |r| {
                vec![
                    e.cidr.to_string(),
                    text(&r.name),
                    format!("{:?}", r.approval).to_lowercase(),
                    format!("{:?}", r.role).to_lowercase(),
                    if r.healthy { "yes" } else { "no" }.to_owned(),
                    unix(r.last_report),
                    text(&r.reason),
                ]
            })
        })
        .collect();
    table(
        &[
            "CIDR",
            "ROUTER",
            "APPROVAL",
            "ROLE",
            "HEALTHY",
            "LAST REPORT",
            "REASON",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexsphere_wire::routes::{Approval, RouterRole, RouterStatus};
    use uuid::Uuid;

    #[test]
    fn the_route_table_lists_each_router_with_its_role_and_reason() {
        let entry = RouteEntry {
            domain_id: Uuid::from_u128(1),
            cidr: "10.1.0.0/24".parse().unwrap(),
            routers: vec![
                RouterStatus {
                    node_id: Uuid::from_u128(2),
                    name: "r1".into(),
                    approval: Approval::Approved,
                    role: RouterRole::Primary,
                    healthy: true,
                    probe: None,
                    last_report: 0,
                    reason: "primary since 1970-01-01T00:00:00Z".into(),
                },
                RouterStatus {
                    node_id: Uuid::from_u128(3),
                    name: "r2".into(),
                    approval: Approval::Pending,
                    role: RouterRole::Inactive,
                    healthy: true,
                    probe: None,
                    last_report: 0,
                    reason: "pending approval".into(),
                },
            ],
        };
        let out = routes_table(&[entry]);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("CIDR"));
        assert!(lines[1].contains("r1") && lines[1].contains("primary"));
        assert!(lines[2].contains("r2") && lines[2].contains("pending approval"));
    }
}
