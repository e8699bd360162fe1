//! When plexd sends its route report, and what it says (sans-IO: every input carries `now`,
//! the shell sends what [`Reporter::poll_report`] hands out and feeds the answer back).
//!
//! - a report at start (when the config offers or uses anything), on every change of the
//!   config or of a probe's verdict, and every [`ROUTE_RENEW_SECS`] while the node advertises
//!   a route, offers an exit or uses one;
//! - one empty report when it stops (a reload removed everything, or plexd stops): it
//!   withdraws every route at once instead of waiting for the lease;
//! - one report in flight at a time; a failed one is sent again after [`RETRY`] (the lease
//!   is short, so no long backoff: the control plane counts the routes as gone meanwhile).
//!
//! Probe hysteresis ([`Health`]): a route with a probe starts unhealthy, turns healthy after
//! [`HEALTHY_AFTER`] answered probes in a row and unhealthy after [`UNHEALTHY_AFTER`] missed
//! ones in a row; a route without a probe is healthy.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use plexsphere_wire::routes::{
    AdvertisedRoute, ROUTE_RENEW_SECS, RoutesAck, RoutesReport, check_route,
};

use crate::config::routes::RoutesConfig;

/// Missed probes in a row that make a healthy route unhealthy.
pub(crate) const UNHEALTHY_AFTER: u32 = 2;
/// Answered probes in a row that make an unhealthy route healthy again.
pub(crate) const HEALTHY_AFTER: u32 = 3;
/// A report that failed is sent again after this long.
pub(crate) const RETRY: Duration = Duration::from_secs(1);

/// One probed route's verdict with its hysteresis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    pub healthy: bool,
    /// Probes in a row that disagree with `healthy`.
    streak: u32,
}

impl Health {
    /// A probed route before its first probes: unhealthy until [`HEALTHY_AFTER`] answers.
    pub(crate) fn unprobed() -> Self {
        Self {
            healthy: false,
            streak: 0,
        }
    }

    /// One probe's result; true when the verdict changed.
    pub fn probe(&mut self, answered: bool) -> bool {
        if answered == self.healthy {
            self.streak = 0;
            return false;
        }
        self.streak += 1;
        let needed = if self.healthy {
            UNHEALTHY_AFTER
        } else {
            HEALTHY_AFTER
        };
        if self.streak >= needed {
            self.healthy = answered;
            self.streak = 0;
            return true;
        }
        false
    }
}

/// The report's schedule and content.
#[derive(Debug, Default)]
pub(crate) struct Reporter {
    /// The routes offered (checked against the mesh range), with their probes.
    routes: Vec<(IpNet, Option<std::net::IpAddr>)>,
    health: BTreeMap<IpNet, Health>,
    exit: bool,
    use_exit: Option<String>,
    /// Something changed since the last report started.
    dirty: bool,
    in_flight: bool,
    /// The last report sent was not empty: an empty one must follow when nothing is left.
    advertised: bool,
    next_at: Option<Instant>,
    pub last_ack: Option<RoutesAck>,
    pub last_ok: Option<Instant>,
    pub last_error: Option<String>,
    /// Routes of the config refused against the mesh range (named in `plexd status`).
    pub refused: Vec<String>,
}

impl Reporter {
    /// The config (at start and on every reload), checked against the Domain's mesh range.
    pub(crate) fn handle_config(&mut self, cfg: &RoutesConfig, mesh: IpNet, now: Instant) {
        let mut routes = Vec::new();
        let mut refused = Vec::new();
        for r in &cfg.advertise {
            match check_route(r.cidr, mesh) {
                Ok(()) => routes.push((r.cidr, r.probe)),
                Err(e) => {
                    tracing::warn!(cidr = %r.cidr, "routes.advertise: {e}; this route is not offered");
                    refused.push(e.to_string());
                }
            }
        }
        let health = routes
            .iter()
            .filter(|(_, probe)| probe.is_some())
            .map(|(cidr, _)| {
                let kept = self.health.get(cidr).copied();
                (*cidr, kept.unwrap_or_else(Health::unprobed))
            })
            .collect();
        let changed =
            routes != self.routes || cfg.exit != self.exit || cfg.use_exit != self.use_exit;
        self.routes = routes;
        self.health = health;
        self.exit = cfg.exit;
        self.use_exit = cfg.use_exit.clone();
        self.refused = refused;
        if changed {
            self.dirty = true;
            self.next_at = Some(now);
        }
    }

    /// The probes to run: `(cidr, target)`.
    pub fn probes(&self) -> Vec<(IpNet, std::net::IpAddr)> {
        self.routes
            .iter()
            .filter_map(|(c, p)| p.map(|p| (*c, p)))
            .collect()
    }

    /// A probe's result; a changed verdict is reported at once.
    pub(crate) fn handle_probe(&mut self, cidr: IpNet, answered: bool, now: Instant) {
        let Some(h) = self.health.get_mut(&cidr) else {
            return;
        };
        if h.probe(answered) {
            let verdict = if h.healthy { "healthy" } else { "unhealthy" };
            tracing::info!(%cidr, "route {cidr}: the probe says {verdict}");
            self.dirty = true;
            self.next_at = Some(now);
        }
    }

    /// Whether the config offers or uses anything.
    pub fn active(&self) -> bool {
        !self.routes.is_empty() || self.exit || self.use_exit.is_some()
    }

    /// The report as it stands.
    pub fn report(&self) -> RoutesReport {
        RoutesReport {
            advertise: self
                .routes
                .iter()
                .map(|(cidr, probe)| AdvertisedRoute {
                    cidr: *cidr,
                    probe: *probe,
                    healthy: self.health.get(cidr).is_none_or(|h| h.healthy),
                })
                .collect(),
            exit: self.exit,
            use_exit: self.use_exit.clone(),
        }
    }

    /// The report to send now, if one is due (and none is in flight).
    pub(crate) fn poll_report(&mut self, now: Instant) -> Option<RoutesReport> {
        if self.in_flight || self.next_at.is_none_or(|t| t > now) {
            return None;
        }
        let active = self.active();
        if !active && !self.advertised {
            self.next_at = None;
            self.dirty = false;
            return None;
        }
        self.in_flight = true;
        self.dirty = false;
        self.next_at = None;
        self.advertised = active;
        Some(self.report())
    }

    /// The report to send when plexd stops: an empty one when the last one offered anything.
    pub(crate) fn withdrawal(&self) -> Option<RoutesReport> {
        (self.advertised || self.active()).then(RoutesReport::default)
    }

    /// The answer of the report in flight.
    pub(crate) fn handle_answer(&mut self, answer: Result<RoutesAck, String>, now: Instant) {
        self.in_flight = false;
        match answer {
            Ok(ack) => {
                let renew = Duration::from_secs(ack.renew_secs.clamp(1, ROUTE_RENEW_SECS));
                if let Some(e) = &ack.use_exit_error
                    && self
                        .last_ack
                        .as_ref()
                        .and_then(|a| a.use_exit_error.as_ref())
                        != Some(e)
                {
                    tracing::warn!("routes.use_exit is not in effect: {e}");
                }
                self.last_ack = Some(ack);
                self.last_ok = Some(now);
                self.last_error = None;
                self.next_at = if self.dirty {
                    Some(now)
                } else if self.active() {
                    Some(now + renew)
                } else {
                    None
                };
            }
            Err(e) => {
                if self.last_error.as_ref() != Some(&e) {
                    tracing::warn!(
                        "the route report failed: {e}; sending it again in {} s",
                        RETRY.as_secs()
                    );
                }
                self.last_error = Some(e);
                self.advertised = true;
                self.next_at = Some(now + RETRY);
            }
        }
    }

    /// When [`Self::poll_report`] has something next (`None`: nothing planned).
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if self.in_flight { None } else { self.next_at }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::routes::AdvertiseEntry;

    fn net(s: &str) -> IpNet {
        s.parse().expect("net")
    }

    fn ack() -> RoutesAck {
        RoutesAck {
            routes: vec![],
            renew_secs: ROUTE_RENEW_SECS,
            use_exit_error: None,
        }
    }

    fn cfg(probe: bool) -> RoutesConfig {
        RoutesConfig {
            advertise: vec![AdvertiseEntry {
                cidr: net("10.1.0.0/24"),
                probe: probe.then(|| "10.1.0.5".parse().expect("ip")),
            }],
            ..RoutesConfig::default()
        }
    }

    #[test]
    fn hysteresis_needs_two_misses_and_three_answers() {
        let mut h = Health::unprobed();
        assert!(!h.probe(true) && !h.probe(true));
        assert!(h.probe(true) && h.healthy);
        // One miss between answers changes nothing; two in a row do.
        assert!(!h.probe(false) && !h.probe(true) && !h.probe(false));
        assert!(h.probe(false) && !h.healthy);
        // Two answers and a miss start over.
        assert!(!h.probe(true) && !h.probe(true) && !h.probe(false));
        assert!(!h.probe(true) && !h.probe(true) && h.probe(true) && h.healthy);
    }

    #[test]
    fn reports_at_start_every_renewal_on_change_and_one_withdrawal() {
        let t0 = Instant::now();
        let mesh = net("10.64.0.0/16");
        let mut r = Reporter::default();
        r.handle_config(&RoutesConfig::default(), mesh, t0);
        assert_eq!(r.poll_report(t0), None, "nothing offered, nothing sent");
        r.handle_config(&cfg(false), mesh, t0);
        let first = r.poll_report(t0).expect("start");
        assert!(first.advertise[0].healthy, "no probe: healthy");
        assert_eq!(r.poll_report(t0), None, "one in flight");
        r.handle_answer(Ok(ack()), t0);
        let renew = Duration::from_secs(ROUTE_RENEW_SECS);
        assert_eq!(r.poll_timeout(), Some(t0 + renew));
        assert_eq!(r.poll_report(t0 + renew / 2), None);
        assert!(r.poll_report(t0 + renew).is_some());
        r.handle_answer(Ok(ack()), t0 + renew);
        // Everything removed: one empty report, then silence.
        let t1 = t0 + renew + renew / 2;
        r.handle_config(&RoutesConfig::default(), mesh, t1);
        assert_eq!(r.poll_report(t1), Some(RoutesReport::default()));
        r.handle_answer(Ok(ack()), t1);
        assert_eq!(r.poll_timeout(), None);
        assert_eq!(r.poll_report(t1 + 10 * renew), None);
        assert_eq!(r.withdrawal(), None);
    }

    #[test]
    fn a_probe_verdict_is_reported_at_once_and_failures_retry() {
        let t0 = Instant::now();
        let mut r = Reporter::default();
        r.handle_config(&cfg(true), net("10.64.0.0/16"), t0);
        let first = r.poll_report(t0).expect("start");
        assert!(
            !first.advertise[0].healthy,
            "probed: unhealthy until it answers"
        );
        r.handle_answer(Err("unreachable".into()), t0);
        assert_eq!(r.poll_timeout(), Some(t0 + RETRY));
        let t1 = t0 + RETRY;
        assert!(r.poll_report(t1).is_some());
        r.handle_answer(Ok(ack()), t1);
        let cidr = net("10.1.0.0/24");
        for _ in 0..HEALTHY_AFTER {
            r.handle_probe(cidr, true, t1);
        }
        assert_eq!(r.poll_timeout(), Some(t1), "the new verdict goes out now");
        assert!(r.poll_report(t1).expect("verdict").advertise[0].healthy);
        assert!(r.withdrawal().is_some());
    }

    #[test]
    fn a_route_over_the_mesh_range_is_left_out() {
        let t0 = Instant::now();
        let mut r = Reporter::default();
        let mut c = cfg(false);
        c.advertise[0].cidr = net("10.64.3.0/24");
        r.handle_config(&c, net("10.64.0.0/16"), t0);
        assert!(!r.active());
        assert_eq!(r.refused.len(), 1);
        assert!(r.refused[0].contains("mesh range"), "{:?}", r.refused);
    }
}
