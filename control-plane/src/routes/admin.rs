//! The operator's side of routes (issue 27): approve, deny, list, and the leader's sweep
//! that lets leases expire (`maintenance`), each re-running the selection of the Domain.

use ipnet::IpNet;
use plexsphere_wire::node::EventKind;
use plexsphere_wire::routes::{Approval, RouteEntry};
use uuid::Uuid;

use crate::error::Error;
use crate::routes::ops::{RouteOps, entries, reselect};
use crate::routes::select;
use crate::store::routes::{self as rows, Kind, RouteRow, Router};
use crate::store::{self, StoreError, events, nodes};

/// How often the leader re-runs the selection of every Domain with routes (a lease expiry
/// is noticed within this of [`plexsphere_wire::routes::ROUTE_LEASE_SECS`]).
pub(crate) const ROUTE_SWEEP_SECS: u64 = 1;

impl RouteOps<'_> {
    /// Approves or denies `node`'s route `cidr` (`0.0.0.0/0` or `::/0`: its exit, both
    /// rows). Answers the route's entry as it is now; `None` when the node has no such row.
    pub(crate) async fn decide(
        &self,
        node: Uuid,
        cidr: IpNet,
        approval: Approval,
        by: &str,
        now: i64,
    ) -> Result<Option<RouteEntry>, Error> {
        let done = store::retry("route decision", Error::is_lost_race, || {
            self.decide_attempt(node, cidr, approval, by, now)
        })
        .await?;
        let Some((entry, notify)) = done else {
            return Ok(None);
        };
        if let Some((domain, seq)) = notify {
            self.bus.notify(domain, seq);
        }
        Ok(Some(entry))
    }

    async fn decide_attempt(
        &self,
        node: Uuid,
        cidr: IpNet,
        approval: Approval,
        by: &str,
        now: i64,
    ) -> Result<Option<(RouteEntry, Option<(Uuid, u64)>)>, Error> {
        let mut tx = self.store.begin().await?;
        let Some(me) = nodes::get(&mut tx, node).await? else {
            return Ok(None);
        };
        let mut all = rows::in_domain(&mut tx, me.domain_id).await?;
        let exit = cidr.prefix_len() == 0;
        let mut found = false;
        for row in all.iter_mut().filter(|r| r.router.node_id == node) {
            let hit = if exit {
                row.router.kind == Kind::Exit
            } else {
                row.router.cidr == cidr
            };
            if !hit {
                continue;
            }
            found = true;
            row.router.approval = approval;
            row.router.approved_at = Some(now);
            row.approved_by = Some(by.to_owned());
            rows::update(&mut tx, row).await?;
        }
        if !found {
            return Ok(None);
        }
        let (verdicts, changed) = reselect(&mut tx, &mut all, now).await?;
        let notify = if changed {
            let resync = EventKind::Resync {
                reason: format!("route {cidr} of node {node} {approval:?}"),
            };
            let seq =
                events::append(&mut tx, me.domain_id, None, Uuid::nil(), &resync, now).await?;
            Some((me.domain_id, seq))
        } else {
            None
        };
        let names = names_of(&mut tx, me.domain_id).await?;
        tx.commit().await.map_err(StoreError::from)?;
        let shown = if exit { exit_v4() } else { cidr };
        let entry = entries(&all, &verdicts, &|id| lookup(&names, id))
            .into_iter()
            .find(|e| e.cidr == shown)
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "node {node} does not advertise {cidr} (withdrawn); the decision is stored for when it does"
                ))
            })?;
        tracing::info!(node_id = %node, %cidr, ?approval, by, "route decided by an operator");
        Ok(Some((entry, notify)))
    }

    /// Every route of the Domains `domains`, with roles as of `now` (read only).
    pub async fn list(&self, domains: &[Uuid], now: i64) -> Result<Vec<RouteEntry>, Error> {
        let mut conn = self.store.acquire().await?;
        let mut out = Vec::new();
        for &d in domains {
            let all = rows::in_domain(&mut conn, d).await?;
            if all.is_empty() {
                continue;
            }
            let routers: Vec<Router> = all.iter().map(|r| r.router.clone()).collect();
            let verdicts = select::select(&routers, now);
            let names = names_of(&mut conn, d).await?;
            out.extend(entries(&all, &verdicts, &|id| lookup(&names, id)));
        }
        Ok(out)
    }

    /// Re-runs the selection of every Domain with routes at `now` (the leader's 1 s sweep);
    /// answers how many Domains changed.
    pub(crate) async fn sweep(&self, now: i64) -> Result<usize, Error> {
        let domains = rows::domains(&mut *self.store.acquire().await?).await?;
        let mut changed = 0;
        for d in domains {
            let done = store::retry("route sweep", Error::is_lost_race, || async move {
                let mut tx = self.store.begin().await?;
                let mut all: Vec<RouteRow> = rows::in_domain(&mut tx, d).await?;
                let (_, moved) = reselect(&mut tx, &mut all, now).await?;
                if !moved {
                    return Ok::<_, Error>(None);
                }
                let resync = EventKind::Resync {
                    reason: "a route's primary changed (lease or health)".into(),
                };
                let seq = events::append(&mut tx, d, None, Uuid::nil(), &resync, now).await?;
                tx.commit().await.map_err(StoreError::from)?;
                Ok(Some(seq))
            })
            .await?;
            if let Some(seq) = done {
                tracing::info!(domain_id = %d, seq, "a route moved to another router; every node of the Domain pulls its new state");
                self.bus.notify(d, seq);
                changed += 1;
            }
        }
        Ok(changed)
    }
}

fn exit_v4() -> IpNet {
    crate::routes::ops::exit_prefixes()[0]
}

async fn names_of(
    conn: &mut sqlx::AnyConnection,
    domain: Uuid,
) -> Result<Vec<(Uuid, String)>, StoreError> {
    Ok(nodes::live_in_domain(conn, domain)
        .await?
        .into_iter()
        .map(|n| (n.id, n.dns_name))
        .collect())
}

fn lookup(names: &[(Uuid, String)], id: Uuid) -> String {
    names
        .iter()
        .find(|(n, _)| *n == id)
        .map_or_else(|| id.to_string(), |(_, name)| name.clone())
}
