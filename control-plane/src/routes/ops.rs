//! Subnet routes and exits (issue 27, docs/routes.md "Control plane"): a node's route report,
//! an operator's approval or denial, the route list, and the leader's sweep; one transaction
//! each. Each runs the primary selection ([`super::select`]) over the Domain's rows and writes
//! back which rows carry traffic; when that set, or a node's exit, changes it appends ONE
//! Domain `resync` (every node pulls its new signed state: the routers' `served_routes`,
//! the clients' allowed IPs and views). A `peer_updated` cannot say it: a router's allowed
//! IPs differ per receiver (each sees the prefixes the policy grants it).

use std::collections::HashSet;

use ipnet::IpNet;
use plexsphere_policy::{RouteInfo, RouteInventory};
use plexsphere_wire::node::EventKind;
use plexsphere_wire::routes::{
    Approval, MAX_ADVERTISED_ROUTES, ROUTE_RENEW_SECS, RouteEntry, RouteStatus, RouterRole,
    RouterStatus, RoutesAck, RoutesReport, ServedRoute, check_label, check_route,
};
use sqlx::AnyConnection;
use uuid::Uuid;

use crate::bus::EventBus;
use crate::error::Error;
use crate::routes::select::{self, Verdict};
use crate::store::routes::{self as rows, Kind, RouteRow, Router};
use crate::store::{self, Store, StoreError, domains, events, nodes};

/// The most advertised rows (routes, and two per exit) a Domain holds: each costs every view
/// of the Domain a little (docs/routes.md "Limits"); a report past it is refused.
pub(crate) const MAX_ROUTES_PER_DOMAIN: i64 = 1_024;

/// The exit prefixes: a node that offers itself as an exit has one row of each.
pub(crate) fn exit_prefixes() -> [IpNet; 2] {
    [
        IpNet::V4(ipnet::Ipv4Net::default()),
        IpNet::V6(ipnet::Ipv6Net::default()),
    ]
}

/// What a report asks for, checked: (cidr, kind, probe, healthy). Every refused route is
/// named in one message; nothing is stored then.
pub(crate) fn check_report(report: &RoutesReport, mesh: IpNet) -> Result<Vec<Router>, String> {
    let mut problems = Vec::new();
    let mut seen: HashSet<IpNet> = HashSet::new();
    let mut out = Vec::new();
    let total = report.advertise.len() + if report.exit { 2 } else { 0 };
    if total > MAX_ADVERTISED_ROUTES {
        problems.push(format!(
            "{total} routes advertised (an exit counts as 2); a node advertises at most {MAX_ADVERTISED_ROUTES}"
        ));
    }
    for a in &report.advertise {
        if !seen.insert(a.cidr) {
            problems.push(format!("{}: advertised twice", a.cidr));
            continue;
        }
        if let Err(e) = check_route(a.cidr, mesh) {
            problems.push(e.to_string());
            continue;
        }
        if let Some(p) = a.probe
            && !a.cidr.contains(&p)
        {
            problems.push(format!(
                "{}: the probe {p} is outside the route; probe a host inside it",
                a.cidr
            ));
            continue;
        }
        out.push(router(a.cidr, Kind::Route, a.probe, a.healthy));
    }
    if report.exit {
        for p in exit_prefixes() {
            out.push(router(p, Kind::Exit, None, true));
        }
    }
    if let Some(e) = &report.use_exit
        && Uuid::parse_str(e).is_err()
        && let Err(err) = check_label(e)
    {
        problems.push(format!(
            "use_exit: {err}; name the exit by its node name or id"
        ));
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(format!(
            "the route report was refused, nothing was stored: {}",
            problems.join("; ")
        ))
    }
}

fn router(cidr: IpNet, kind: Kind, probe: Option<std::net::IpAddr>, healthy: bool) -> Router {
    Router {
        node_id: Uuid::nil(),
        cidr,
        kind,
        probe,
        advertised: true,
        healthy,
        healthy_since: None,
        last_report: 0,
        approval: Approval::Pending,
        approved_at: None,
        primary_since: None,
    }
}

/// The routes of a Domain in service, for the policy compile: each subnet route's primary,
/// each exit in service with the live nodes whose `use_exit` names it (by DNS name or id).
pub(crate) async fn route_inventory(
    conn: &mut AnyConnection,
    domain: Uuid,
) -> Result<RouteInventory, StoreError> {
    let all = rows::in_domain(conn, domain).await?;
    let carrying: Vec<&Router> = all
        .iter()
        .map(|r| &r.router)
        .filter(|r| r.primary_since.is_some())
        .collect();
    if carrying.is_empty() {
        return Ok(RouteInventory::default());
    }
    let mesh = domains::get(conn, domain)
        .await?
        .map(|d| vec![d.mesh_cidr])
        .unwrap_or_default();
    let users = rows::exit_users(conn, domain).await?;
    let mut routes = Vec::new();
    for r in carrying {
        match r.kind {
            Kind::Route => routes.push(RouteInfo {
                router: r.node_id,
                cidr: r.cidr,
                exit: false,
                users: Vec::new(),
            }),
            Kind::Exit if r.cidr.addr().is_ipv4() => {
                let name = nodes::get(conn, r.node_id)
                    .await?
                    .map(|n| n.dns_name)
                    .unwrap_or_default();
                let id = r.node_id.to_string();
                let mut u: Vec<Uuid> = users
                    .iter()
                    .filter(|(user, named)| *user != r.node_id && (*named == name || *named == id))
                    .map(|(user, _)| *user)
                    .collect();
                u.sort_unstable();
                routes.push(RouteInfo {
                    router: r.node_id,
                    cidr: r.cidr,
                    exit: true,
                    users: u,
                });
            }
            Kind::Exit => {}
        }
    }
    Ok(RouteInventory { mesh, routes })
}

/// The routes `node` carries now (its `NodeState::served_routes`).
pub(crate) async fn served(
    conn: &mut AnyConnection,
    node: Uuid,
) -> Result<Vec<ServedRoute>, StoreError> {
    let Some(me) = nodes::get(conn, node).await? else {
        return Ok(Vec::new());
    };
    Ok(rows::in_domain(conn, me.domain_id)
        .await?
        .into_iter()
        .filter(|r| r.router.node_id == node && r.router.primary_since.is_some())
        .map(|r| ServedRoute {
            cidr: r.router.cidr,
            role: RouterRole::Primary,
        })
        .collect())
}

/// Runs the selection over a Domain's rows at `now` and writes back every changed
/// `primary_since`; answers the verdicts (in `all`'s order) and whether the set of rows
/// carrying traffic changed.
pub(crate) async fn reselect(
    conn: &mut AnyConnection,
    all: &mut [RouteRow],
    now: i64,
) -> Result<(Vec<Verdict>, bool), StoreError> {
    let routers: Vec<Router> = all.iter().map(|r| r.router.clone()).collect();
    let verdicts = select::select(&routers, now);
    let mut changed = false;
    for (row, v) in all.iter_mut().zip(&verdicts) {
        if row.router.primary_since != v.primary_since {
            if row.router.primary_since.is_some() != v.primary_since.is_some() {
                changed = true;
            }
            rows::set_primary_since(conn, row.router.node_id, &row.router.cidr, v.primary_since)
                .await?;
            row.router.primary_since = v.primary_since;
        }
    }
    Ok((verdicts, changed))
}

/// The route operations over one store and bus.
pub(crate) struct RouteOps<'a> {
    pub store: &'a Store,
    pub bus: &'a dyn EventBus,
}

impl RouteOps<'_> {
    /// `PUT /v1/nodes/{id}/routes`: stores the report, runs the selection, answers the
    /// node's routes with their roles.
    pub async fn report(
        &self,
        node_id: Uuid,
        report: &RoutesReport,
        now: i64,
    ) -> Result<RoutesAck, Error> {
        let (ack, notify) = store::retry("route report", Error::is_lost_race, || {
            self.report_attempt(node_id, report, now)
        })
        .await?;
        if let Some((domain, seq)) = notify {
            tracing::info!(node_id = %node_id, seq, "routes in service changed; every node of the Domain pulls its new state");
            self.bus.notify(domain, seq);
        }
        Ok(ack)
    }

    async fn report_attempt(
        &self,
        node_id: Uuid,
        report: &RoutesReport,
        now: i64,
    ) -> Result<(RoutesAck, Option<(Uuid, u64)>), Error> {
        let mut tx = self.store.begin().await?;
        let me = nodes::get(&mut tx, node_id)
            .await?
            .filter(|n| n.revoked_at.is_none())
            .ok_or(Error::NodeRevoked)?;
        let domain = domains::get(&mut tx, me.domain_id)
            .await?
            .ok_or_else(|| Error::Internal(format!("node {node_id} names a missing domain")))?;
        let wanted = check_report(report, domain.mesh_cidr).map_err(Error::RouteRefused)?;
        let mut all = rows::in_domain(&mut tx, domain.id).await?;
        let before_advertised = all.iter().filter(|r| r.router.advertised).count();
        let mine_before = all
            .iter()
            .filter(|r| r.router.node_id == node_id && r.router.advertised)
            .count();
        let growth = wanted.len().saturating_sub(mine_before);
        let after = i64::try_from(before_advertised + growth).unwrap_or(i64::MAX);
        if growth > 0 && after > MAX_ROUTES_PER_DOMAIN {
            return Err(Error::RouteRefused(format!(
                "the Domain would hold {after} advertised routes, the limit is {MAX_ROUTES_PER_DOMAIN}; withdraw routes elsewhere first"
            )));
        }
        let approver = crate::routes::approve::AutoApprover::load(&mut tx, &me).await?;
        for w in &wanted {
            let existing = all
                .iter_mut()
                .find(|r| r.router.node_id == node_id && r.router.cidr == w.cidr);
            match existing {
                Some(row) => {
                    let x = &mut row.router;
                    let lease_lapsed = !x.advertised
                        || now.saturating_sub(x.last_report)
                            > plexsphere_wire::routes::ROUTE_LEASE_SECS as i64;
                    x.healthy_since = match (w.healthy, x.healthy_since) {
                        (false, _) => None,
                        (true, Some(t)) if !lease_lapsed && x.healthy => Some(t),
                        (true, _) => Some(now),
                    };
                    x.probe = w.probe;
                    x.healthy = w.healthy;
                    x.advertised = true;
                    x.last_report = now;
                    if x.approval == Approval::Pending && approver.approves(w.cidr, w.kind) {
                        x.approval = Approval::Approved;
                        x.approved_at = Some(now);
                        row.approved_by = Some(crate::routes::approve::AUTO_APPROVER.into());
                    }
                    rows::update(&mut tx, row).await?;
                }
                None => {
                    let auto = approver.approves(w.cidr, w.kind);
                    let row = RouteRow {
                        domain_id: domain.id,
                        approved_by: auto.then(|| crate::routes::approve::AUTO_APPROVER.into()),
                        router: Router {
                            node_id,
                            healthy_since: w.healthy.then_some(now),
                            last_report: now,
                            approval: if auto {
                                Approval::Approved
                            } else {
                                Approval::Pending
                            },
                            approved_at: auto.then_some(now),
                            ..w.clone()
                        },
                    };
                    rows::insert(&mut tx, &row).await?;
                    all.push(row);
                }
            }
        }
        // Rows the report no longer names: withdrawn (kept while decided, else deleted).
        let mut kept = Vec::with_capacity(all.len());
        for mut row in all {
            let named = wanted.iter().any(|w| w.cidr == row.router.cidr);
            if row.router.node_id != node_id || named || !row.router.advertised {
                kept.push(row);
                continue;
            }
            if row.router.approval == Approval::Pending {
                rows::delete(&mut tx, node_id, &row.router.cidr).await?;
                continue;
            }
            row.router.advertised = false;
            row.router.healthy_since = None;
            rows::update(&mut tx, &row).await?;
            kept.push(row);
        }
        let mut all = kept;
        let (verdicts, mut changed) = reselect(&mut tx, &mut all, now).await?;
        let old_exit = crate::routes::approve::use_exit_of(&mut tx, node_id).await?;
        if old_exit != report.use_exit {
            rows::set_use_exit(&mut tx, node_id, report.use_exit.as_deref()).await?;
            changed = true;
        }
        let use_exit_error = match &report.use_exit {
            None => None,
            Some(e) => use_exit_problem(&mut tx, &all, domain.id, node_id, e).await?,
        };
        let routes = all
            .iter()
            .zip(&verdicts)
            .filter(|(r, _)| r.router.node_id == node_id && r.router.advertised)
            .map(|(r, v)| RouteStatus {
                cidr: r.router.cidr,
                approval: r.router.approval,
                role: v.role,
                reason: v.reason.clone(),
            })
            .collect();
        let mut notify = None;
        if changed {
            let resync = EventKind::Resync {
                reason: format!("the routes of node {node_id} changed"),
            };
            let seq = events::append(&mut tx, domain.id, None, Uuid::nil(), &resync, now).await?;
            notify = Some((domain.id, seq));
        }
        tx.commit().await.map_err(StoreError::from)?;
        Ok((
            RoutesAck {
                routes,
                renew_secs: ROUTE_RENEW_SECS,
                use_exit_error,
            },
            notify,
        ))
    }
}

/// Why the exit `named` is not in effect for `me`, or `None` when it is.
async fn use_exit_problem(
    conn: &mut AnyConnection,
    all: &[RouteRow],
    domain: Uuid,
    me: Uuid,
    named: &str,
) -> Result<Option<String>, StoreError> {
    let live = nodes::live_in_domain(conn, domain).await?;
    let Some(exit) = live
        .iter()
        .find(|n| n.dns_name == named || n.id.to_string() == named)
    else {
        return Ok(Some(format!(
            "no live node of the Domain is named {named:?}"
        )));
    };
    if exit.id == me {
        return Ok(Some("a node cannot be its own exit".into()));
    }
    let row = all
        .iter()
        .find(|r| r.router.node_id == exit.id && r.router.kind == Kind::Exit);
    Ok(match row {
        None => Some(format!(
            "{named} does not offer itself as an exit (routes.exit: true)"
        )),
        Some(r) if r.router.primary_since.is_none() => Some(format!(
            "{named} is not an exit in service: {}",
            match r.router.approval {
                Approval::Approved => "it is unhealthy or stopped reporting",
                Approval::Pending => "it waits for approval (plexctl route approve NODE 0.0.0.0/0)",
                Approval::Denied => "an operator denied it",
            }
        )),
        Some(_) => None,
    })
}

/// The [`RouteEntry`] list of rows (grouped by Domain and cidr, primary first), with the
/// router names of `names`.
pub(crate) fn entries(
    all: &[RouteRow],
    verdicts: &[Verdict],
    names: &dyn Fn(Uuid) -> String,
) -> Vec<RouteEntry> {
    let mut out: Vec<RouteEntry> = Vec::new();
    for (row, v) in all.iter().zip(verdicts) {
        let x = &row.router;
        if !x.advertised {
            continue;
        }
        let status = RouterStatus {
            node_id: x.node_id,
            name: names(x.node_id),
            approval: x.approval,
            role: v.role,
            healthy: x.healthy,
            probe: x.probe,
            last_report: x.last_report,
            reason: v.reason.clone(),
        };
        match out
            .iter_mut()
            .find(|e| e.domain_id == row.domain_id && e.cidr == x.cidr)
        {
            Some(e) => e.routers.push(status),
            None => out.push(RouteEntry {
                domain_id: row.domain_id,
                cidr: x.cidr,
                routers: vec![status],
            }),
        }
    }
    let rank = |r: &RouterStatus| match r.role {
        RouterRole::Primary => 0,
        RouterRole::Standby => 1,
        RouterRole::Inactive => 2,
    };
    for e in &mut out {
        e.routers.sort_by_key(|r| (rank(r), r.name.clone()));
    }
    out
}
