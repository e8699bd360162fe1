//! Which router carries each subnet route, and which exits are in service (issue 27,
//! docs/routes.md "Failover"), pure: the rows and `now` in, every row's role and reason out.
//!
//! Per (Domain, cidr) one primary, so every peer sees the same one. A router is *eligible*
//! when its row is advertised, approved, healthy by its own probe, and its last report is at
//! most [`ROUTE_LEASE_SECS`] old. The current primary stays while eligible (no pre-emption: a
//! router that comes back does not take over, so nothing flaps). When it stops being
//! eligible the new primary is the eligible router healthy the longest that has been healthy
//! for at least [`ROUTE_HOLD_DOWN_SECS`]; only when none passes the hold-down, the longest
//! healthy eligible one anyway (a route is never left without a router to respect a
//! hold-down). Ties: the earliest approval, then the smallest node id.
//!
//! Exits are not shared: each node that uses one names it. An exit row is in service while
//! eligible (its role is then `primary`).

use std::collections::BTreeMap;

use ipnet::IpNet;
use plexsphere_wire::routes::{Approval, ROUTE_LEASE_SECS, RouterRole};

use crate::store::routes::{Kind, Router};

/// How long a router must have been healthy before it takes over from a failed primary
/// (unless no router has been healthy that long).
pub(crate) const ROUTE_HOLD_DOWN_SECS: i64 = 30;

/// What the selection decided for one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub role: RouterRole,
    /// For a person: why the row has this role.
    pub reason: String,
    /// The row's new `primary_since` (`None`: it does not carry traffic).
    pub primary_since: Option<i64>,
}

/// Why a row is not eligible at `now`, or `None` when it is.
pub(crate) fn ineligible(r: &Router, now: i64) -> Option<String> {
    let age = now.saturating_sub(r.last_report);
    if !r.advertised {
        return Some("withdrawn: the node no longer advertises it".into());
    }
    match r.approval {
        Approval::Denied => return Some("denied by an operator".into()),
        Approval::Pending => {
            return Some(
                "pending approval (plexctl route approve, or the policy's auto_approvers)".into(),
            );
        }
        Approval::Approved => {}
    }
    if age > ROUTE_LEASE_SECS as i64 {
        return Some(format!(
            "no report for {age} s (lease {ROUTE_LEASE_SECS} s): the router is gone or cut off"
        ));
    }
    if !r.healthy {
        return Some(match r.probe {
            Some(p) => format!("unhealthy: its probe of {p} fails"),
            None => "unhealthy by its own report".into(),
        });
    }
    None
}

fn healthy_for(r: &Router, now: i64) -> i64 {
    r.healthy_since.map_or(0, |t| now.saturating_sub(t).max(0))
}

/// Every row's verdict, in `rows`' order. Rows of different Domains must not be mixed (the
/// caller selects per Domain); within one, rows are grouped by cidr.
pub(crate) fn select(rows: &[Router], now: i64) -> Vec<Verdict> {
    let mut out: Vec<Option<Verdict>> = vec![None; rows.len()];
    let mut by_cidr: BTreeMap<IpNet, Vec<usize>> = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        match r.kind {
            Kind::Exit => {
                out[i] = Some(match ineligible(r, now) {
                    Some(reason) => Verdict {
                        role: RouterRole::Inactive,
                        reason,
                        primary_since: None,
                    },
                    None => {
                        let since = r.primary_since.unwrap_or(now);
                        Verdict {
                            role: RouterRole::Primary,
                            reason: format!("exit in service since {}", stamp(since)),
                            primary_since: Some(since),
                        }
                    }
                });
            }
            Kind::Route => by_cidr.entry(r.cidr).or_default().push(i),
        }
    }
    for members in by_cidr.values() {
        for (i, v) in select_one(rows, members, now) {
            out[i] = Some(v);
        }
    }
    out.into_iter()
        .map(|v| {
            v.unwrap_or(Verdict {
                role: RouterRole::Inactive,
                reason: String::new(),
                primary_since: None,
            })
        })
        .collect()
}

/// The verdicts of the routers of one cidr.
fn select_one(rows: &[Router], members: &[usize], now: i64) -> Vec<(usize, Verdict)> {
    let eligible: Vec<usize> = members
        .iter()
        .copied()
        .filter(|&i| ineligible(&rows[i], now).is_none())
        .collect();
    // The current primary stays while eligible (the oldest one if the store somehow has two).
    let current = eligible
        .iter()
        .copied()
        .filter(|&i| rows[i].primary_since.is_some())
        .min_by_key(|&i| (rows[i].primary_since, rows[i].node_id));
    let (primary, since, why) = match current {
        Some(i) => (Some(i), rows[i].primary_since.unwrap_or(now), None),
        None => {
            let rank = |&i: &usize| {
                let r = &rows[i];
                (
                    std::cmp::Reverse(healthy_for(r, now)),
                    r.approved_at.unwrap_or(i64::MAX),
                    r.node_id,
                )
            };
            let passed: Vec<usize> = eligible
                .iter()
                .copied()
                .filter(|&i| healthy_for(&rows[i], now) >= ROUTE_HOLD_DOWN_SECS)
                .collect();
            let (pick, why) = match passed.iter().min_by_key(|i| rank(i)) {
                Some(&i) => (Some(i), "healthy the longest"),
                None => (
                    eligible.iter().min_by_key(|i| rank(i)).copied(),
                    "no router passed the hold-down; healthy the longest",
                ),
            };
            (pick, now, pick.map(|_| why))
        }
    };
    members
        .iter()
        .map(|&i| {
            let r = &rows[i];
            let v = if Some(i) == primary {
                let reason = match why {
                    Some(w) => format!("primary since {} ({w})", stamp(since)),
                    None => format!("primary since {}", stamp(since)),
                };
                Verdict {
                    role: RouterRole::Primary,
                    reason,
                    primary_since: Some(since),
                }
            } else if let Some(reason) = ineligible(r, now) {
                Verdict {
                    role: RouterRole::Inactive,
                    reason,
                    primary_since: None,
                }
            } else if healthy_for(r, now) < ROUTE_HOLD_DOWN_SECS {
                Verdict {
                    role: RouterRole::Inactive,
                    reason: format!(
                        "healthy for {} s; standby after the {ROUTE_HOLD_DOWN_SECS} s hold-down",
                        healthy_for(r, now)
                    ),
                    primary_since: None,
                }
            } else {
                Verdict {
                    role: RouterRole::Standby,
                    reason: format!(
                        "standby, healthy for {} s (the primary stays while it is eligible)",
                        healthy_for(r, now)
                    ),
                    primary_since: None,
                }
            };
            (i, v)
        })
        .collect()
}

/// Unix seconds as RFC 3339 UTC (the seconds themselves when out of range).
pub(crate) fn stamp(secs: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| secs.to_string())
}

#[cfg(test)]
mod tests;
