//! A node's endpoint candidates, as pure functions: which addresses an endpoint report may
//! carry (the refusal table below), and what the server stores and advertises to peers.
//!
//! Every peer of a node sends WireGuard handshakes (and disco probes) to the addresses the
//! server advertises for it, so an address is refused when sending there would reach
//! something other than the node:
//!
//! | kind | IPv4 | IPv6 | why it is refused |
//! |---|---|---|---|
//! | unspecified | `0.0.0.0` | `::` | not a destination at all |
//! | loopback | `127.0.0.0/8` | `::1` | every peer would send to itself |
//! | link-local | `169.254.0.0/16` | `fe80::/10` | the peer's own link (a cloud metadata service at 169.254.169.254) |
//! | multicast | `224.0.0.0/4` | `ff00::/8` | a group, not a node |
//! | broadcast | `255.255.255.255` | - | every host on the peer's link (a subnet's directed broadcast cannot be told from here) |
//! | mesh range | the Domain's `mesh_cidr` | the same | the tunnel would carry its own underlay |
//! | port 0 | `listen_port` 0, a reflexive port 0 | the same | not a port a datagram can go to |
//!
//! The table is `plexsphere_wire::endpoint`'s, which the agent's reach engine applies to the
//! candidates a peer names in disco messages too. An IPv4-mapped IPv6 address
//! (`::ffff:a.b.c.d`) is judged as the IPv4 address it maps to. A report carries at most
//! [`MAX_CANDIDATES`] addresses (local plus reflexive); duplicates collapse. Its `home_relay`
//! must name a relay of the server's settings. The address the server observes the report
//! coming from is kept as a candidate only when it is none of the refused kinds (a node talking
//! to the API over loopback or over the mesh is not reachable there).
//!
//! Pure and a leaf: it imports nothing of the crate, so the store and the error type may import it.
//! Its table tests are `tests.rs`.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use plexsphere_wire::node::{EndpointReport, MAX_CANDIDATES, RelaySpec};

/// The most endpoints the server advertises for one node: every candidate a report may carry,
/// plus the observed one.
pub(crate) const MAX_ADVERTISED: usize = MAX_CANDIDATES + 1;

pub(crate) use plexsphere_wire::endpoint::{Unusable, unusable};

/// Why an endpoint report is refused; the message names the field, the address and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "listen_port 0 is not a port peers can send to; report the WireGuard listen port (1-65535)"
    )]
    ListenPortZero,
    #[error(
        "{field} {address} has port 0, which peers cannot send to; report the port the STUN server saw"
    )]
    PortZero { field: String, address: SocketAddr },
    #[error(
        "{field} {address} is {}; report only addresses other hosts reach this node at",
        why.describe()
    )]
    Unusable {
        field: String,
        address: String,
        why: Unusable,
    },
    #[error(
        "an endpoint report carries at most {MAX_CANDIDATES} addresses (local plus reflexive), not {0}; report the best ones"
    )]
    TooMany(usize),
    #[error(
        "home_relay {name:?} is not a relay of this control plane (it has: {known}); name one from the state's relays or none"
    )]
    UnknownRelay { name: String, known: String },
}

/// What the server keeps of a node's candidates: each list in the node's order without
/// duplicates, every address with the port peers send to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Candidates {
    /// The reported interface addresses with the listen port.
    pub local: Vec<SocketAddr>,
    /// Where the node's STUN servers saw its WireGuard socket.
    pub reflexive: Vec<SocketAddr>,
    /// Where the server saw the report come from, with the listen port; `None` when that is
    /// one of the refused kinds.
    pub observed: Option<SocketAddr>,
}

impl Candidates {
    /// What peers are told: local first, then reflexive, then the observed one, without
    /// duplicates, at most [`MAX_ADVERTISED`].
    pub(crate) fn advertised(&self) -> Vec<SocketAddr> {
        let mut out = Vec::with_capacity(MAX_ADVERTISED);
        let all = self
            .local
            .iter()
            .chain(&self.reflexive)
            .chain(self.observed.as_ref());
        for c in all {
            if out.len() == MAX_ADVERTISED {
                break;
            }
            if !out.contains(c) {
                out.push(*c);
            }
        }
        out
    }
}

/// Checks `report` (seen coming from `observed`) against the refusal table, the Domain's
/// `mesh` range and the server's `relays`; answers the candidates to keep.
pub(crate) fn accept(
    report: &EndpointReport,
    observed: IpAddr,
    mesh: IpNet,
    relays: &[RelaySpec],
) -> Result<Candidates, Refusal> {
    if report.listen_port == 0 {
        return Err(Refusal::ListenPortZero);
    }
    let total = report.addresses.len() + report.reflexive.len();
    if total > MAX_CANDIDATES {
        return Err(Refusal::TooMany(total));
    }
    for (i, ip) in report.addresses.iter().enumerate() {
        if let Some(why) = unusable(*ip, mesh) {
            return Err(Refusal::Unusable {
                field: format!("addresses[{i}]"),
                address: ip.to_string(),
                why,
            });
        }
    }
    for (i, addr) in report.reflexive.iter().enumerate() {
        if let Some(why) = unusable(addr.ip(), mesh) {
            return Err(Refusal::Unusable {
                field: format!("reflexive[{i}]"),
                address: addr.to_string(),
                why,
            });
        }
        if addr.port() == 0 {
            return Err(Refusal::PortZero {
                field: format!("reflexive[{i}]"),
                address: *addr,
            });
        }
    }
    if let Some(name) = &report.home_relay
        && !relays.iter().any(|r| &r.name == name)
    {
        let known: Vec<&str> = relays.iter().map(|r| r.name.as_str()).collect();
        return Err(Refusal::UnknownRelay {
            name: name.clone(),
            known: if known.is_empty() {
                "no relays".to_owned()
            } else {
                known.join(", ")
            },
        });
    }
    let port = report.listen_port;
    let observed = SocketAddr::new(observed, port);
    Ok(Candidates {
        local: dedup(report.addresses.iter().map(|ip| SocketAddr::new(*ip, port))),
        reflexive: dedup(report.reflexive.iter().copied()),
        observed: unusable(observed.ip(), mesh).is_none().then_some(observed),
    })
}

fn dedup(items: impl Iterator<Item = SocketAddr>) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for a in items {
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out
}

#[cfg(test)]
mod tests;
