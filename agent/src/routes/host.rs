//! Makes the host match a [`HostPlan`]: kernel routes on the mesh interface, the exit's
//! policy rules, forwarding sysctls, the nat table. Runs on the routes thread (netlink and
//! `nft` block briefly). Everything it adds it can name again, so [`Host::clear`] (plexd
//! stops, leaves, turns the exit off) removes exactly that and puts the sysctls back.
//!
//! The exit's rules, in both families (priorities are plexd's own):
//! - [`PRIO_EXEMPT`]: `to <control plane / relay address> lookup main`: plexd's HTTPS and relay
//!   connections never enter the tunnel they set up;
//! - [`PRIO_SUPPRESS`]: `lookup main suppress_prefixlength 0`: every route of the main table
//!   but its default routes wins (the LAN, the mesh range, subnet routes stay as they are);
//! - [`PRIO_EXIT`]: `not fwmark 0x706c lookup 28780`: everything else, except plexd's own
//!   marked WireGuard packets, goes to the exit's table.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use super::netlink::{self, KernelRoute, Rule, TABLE_MAIN};
use super::plan::{EXIT_FWMARK, EXIT_TABLE, HostPlan};
use super::router::{self, FORWARDING, SRC_VALID_MARK, Saved};

pub(crate) const PRIO_EXEMPT: u32 = 5200;
pub(crate) const PRIO_SUPPRESS: u32 = 5210;
pub(crate) const PRIO_EXIT: u32 = 5220;
const PRIOS: [u32; 3] = [PRIO_EXEMPT, PRIO_SUPPRESS, PRIO_EXIT];

/// What this run of plexd changed on the host.
#[derive(Debug)]
pub struct Host {
    iface: String,
    mesh: IpNet,
    /// plexd's WireGuard UDP ports (marked while an exit is in use).
    ports: Vec<u16>,
    forwarding: Option<Saved>,
    src_valid_mark: Option<Saved>,
    /// The nat table's last content (`None`: no table).
    nat: Option<String>,
    /// The exit's rules as installed (with the exempt addresses they hold).
    rules: Option<BTreeSet<IpAddr>>,
    /// The routes this run added (or found as plexd's).
    pub routes: BTreeSet<KernelRoute>,
}

impl Host {
    /// Takes over the host for `iface`: what a previous run left (plexd's routes on the
    /// interface, its rules, the nat table) is removed first.
    pub fn start(iface: &str, mesh: IpNet, ports: Vec<u16>) -> Self {
        let mut host = Self {
            iface: iface.to_owned(),
            mesh,
            ports,
            forwarding: None,
            src_valid_mark: None,
            nat: Some(String::new()),
            rules: Some(BTreeSet::new()),
            routes: BTreeSet::new(),
        };
        if let Ok(Some(index)) = crate::mesh::netlink::index(iface) {
            match netlink::list_routes(index) {
                Ok(found) => host.routes = found.into_iter().collect(),
                Err(e) => tracing::warn!(interface = iface, "cannot list plexd's routes: {e}"),
            }
        }
        host.clear();
        host
    }

    /// Makes the host match `plan`, with these addresses kept off an exit's tunnel. Returns
    /// what failed, one line each (the rest is still done).
    pub fn apply(&mut self, plan: &HostPlan, exempt: &BTreeSet<IpAddr>) -> Vec<String> {
        let mut errors = Vec::new();
        let exit = plan.exit_peer.is_some();
        // Forwarding first (a route served before it is on drops packets), off last.
        if plan.forward && self.forwarding.is_none() {
            match router::set_sysctls(&FORWARDING, "1") {
                Ok(s) => {
                    tracing::info!(
                        "serving routes: IP forwarding on (the values found are restored when no route is served)"
                    );
                    self.forwarding = Some(s);
                }
                Err(e) => errors.push(format!("forwarding: {e}")),
            }
        }
        if !exit {
            self.remove_rules(&mut errors);
        }
        self.sync_routes(&plan.routes, &mut errors);
        let ports: &[u16] = if exit { &self.ports } else { &[] };
        let nat = router::nat_ruleset(&self.iface, self.mesh, plan.forward && plan.snat, ports);
        if nat != self.nat {
            let input = nat
                .clone()
                .unwrap_or_else(|| router::remove_ruleset(&self.iface));
            match router::nft(&input) {
                Ok(()) => self.nat = nat,
                Err(e) => errors.push(e.to_string()),
            }
        }
        if exit {
            if self.src_valid_mark.is_none() {
                match router::set_sysctls(&[SRC_VALID_MARK], "1") {
                    Ok(s) => self.src_valid_mark = Some(s),
                    Err(e) => errors.push(e),
                }
            }
            if self.rules.as_ref() != Some(exempt) {
                self.remove_rules(&mut errors);
                self.add_rules(exempt, &mut errors);
            }
        } else if let Some(mut s) = self.src_valid_mark.take() {
            router::restore(&mut s);
        }
        if !plan.forward
            && let Some(mut s) = self.forwarding.take()
        {
            router::restore(&mut s);
            tracing::info!("no route served: IP forwarding put back as it was");
        }
        errors
    }

    /// Removes everything this run added and puts the sysctls back.
    pub fn clear(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        self.remove_rules(&mut errors);
        self.sync_routes(&BTreeSet::new(), &mut errors);
        match self.nat.as_deref() {
            // At start: whatever a previous run left (no nft: nothing it could have left).
            Some("") => match router::remove_on_leave(&self.iface) {
                Ok(()) => self.nat = None,
                Err(e) => errors.push(e),
            },
            Some(_) => match router::nft(&router::remove_ruleset(&self.iface)) {
                Ok(()) => self.nat = None,
                Err(e) => errors.push(e.to_string()),
            },
            None => {}
        }
        for s in [self.src_valid_mark.take(), self.forwarding.take()]
            .into_iter()
            .flatten()
        {
            let mut s = s;
            router::restore(&mut s);
        }
        errors
    }

    fn sync_routes(&mut self, want: &BTreeSet<KernelRoute>, errors: &mut Vec<String>) {
        if want.is_empty() && self.routes.is_empty() {
            return;
        }
        let index = match crate::mesh::netlink::index(&self.iface) {
            Ok(Some(i)) => i,
            Ok(None) => {
                // The interface went (and its routes with it).
                self.routes.clear();
                if !want.is_empty() {
                    errors.push(format!("routes: the interface {} is not there", self.iface));
                }
                return;
            }
            Err(e) => {
                errors.push(format!("routes: cannot look up {}: {e}", self.iface));
                return;
            }
        };
        // Removed first, so a prefix moving between tables never exists twice.
        for r in self.routes.clone().difference(want) {
            match netlink::del_route(*r, index) {
                Ok(()) => {
                    self.routes.remove(r);
                    tracing::info!(prefix = %r.prefix, table = r.table, "route {} via {} removed", r.prefix, self.iface);
                }
                Err(e) => errors.push(format!("cannot remove the route {}: {e}", r.prefix)),
            }
        }
        for r in want.difference(&self.routes.clone()) {
            match netlink::add_route(*r, index) {
                Ok(true) => {
                    self.routes.insert(*r);
                    tracing::info!(prefix = %r.prefix, table = r.table, "route {} via {} added", r.prefix, self.iface);
                }
                Ok(false) => errors.push(format!(
                    "a route to {} is already in table {} (not plexd's); it is left as it is and wins",
                    r.prefix, r.table
                )),
                Err(e) => errors.push(format!("cannot add the route {} via {}: {e}", r.prefix, self.iface)),
            }
        }
    }

    fn add_rules(&mut self, exempt: &BTreeSet<IpAddr>, errors: &mut Vec<String>) {
        let mut rules = Vec::new();
        for ip in exempt {
            rules.push(Rule {
                v4: ip.is_ipv4(),
                priority: PRIO_EXEMPT,
                table: TABLE_MAIN,
                to: Some(IpNet::from(*ip)),
                not_fwmark: None,
                suppress_prefixlength: None,
            });
        }
        for v4 in [true, false] {
            rules.push(Rule {
                v4,
                priority: PRIO_SUPPRESS,
                table: TABLE_MAIN,
                to: None,
                not_fwmark: None,
                suppress_prefixlength: Some(0),
            });
            rules.push(Rule {
                v4,
                priority: PRIO_EXIT,
                table: EXIT_TABLE,
                to: None,
                not_fwmark: Some(EXIT_FWMARK),
                suppress_prefixlength: None,
            });
        }
        // Recorded before adding: a half-added set is removed by the next removal.
        self.rules = Some(exempt.clone());
        for r in &rules {
            if let Err(e) = netlink::add_rule(r) {
                errors.push(format!(
                    "cannot add the exit's rule (priority {}): {e}",
                    r.priority
                ));
            }
        }
        tracing::info!(exempt = ?exempt, "exit in use: policy rules {PRIO_EXEMPT}/{PRIO_SUPPRESS}/{PRIO_EXIT} added");
    }

    fn remove_rules(&mut self, errors: &mut Vec<String>) {
        if self.rules.is_none() {
            return;
        }
        match netlink::list_rules(|p| PRIOS.contains(&p), &[TABLE_MAIN, EXIT_TABLE]) {
            Ok(found) => {
                for (_, prio, msg) in found {
                    if let Err(e) = netlink::del_rule_message(msg) {
                        errors.push(format!(
                            "cannot remove the exit's rule (priority {prio}): {e}"
                        ));
                    }
                }
                if self.rules.as_ref().is_some_and(|r| !r.is_empty()) {
                    tracing::info!("exit no longer in use: its policy rules removed");
                }
                self.rules = None;
            }
            Err(e) => errors.push(format!("cannot list the policy rules: {e}")),
        }
    }
}
