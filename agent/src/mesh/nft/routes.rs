//! The routed-traffic part of the kernel backend's table (issue 27; docs/policy.md
//! "Kernel backend: routed traffic"), emitted only when the view has route prefixes (a view
//! without any gives the table of issue 25 unchanged).
//!
//! Router (a peer's `routes_in`), hook `forward`:
//! - from the mesh (`iifname`): the source address (a client's mesh address) selects the
//!   client's chain `fwd_<peer>`, whose interval map on the destination jumps to the grant
//!   of the longest prefix (`in_<grant>`, the destination ports); every packet of the flow is
//!   checked, so a withdrawn grant cuts it at the next packet; anything else is logged and
//!   dropped;
//! - to the mesh (`oifname`): replies (`ct direction reply`) towards a client pass through
//!   `rep_<peer>`, whose map on the source jumps to the prefix's grant checked on the source
//!   port (`out_<grant>`: the port the client opened); a reply no grant holds any more is
//!   dropped;
//! - hook `postrouting` (after source NAT, so this host's own masqueraded flows, e.g. its
//!   containers', keep working): a flow whose source is still inside a served prefix (a
//!   LAN host opening a flow into the mesh) is dropped.
//!
//! Client (a peer's `routes_out`):
//! - hook `output` (and `forward` to the mesh): a packet to a route prefix jumps, through an
//!   interval map of every peer's prefixes flattened (longest prefix wins, as in WireGuard's
//!   allowed IPs), to `rto_<grant>` (its destination ports, else logged and dropped);
//! - hook `input`: a reply (`ct direction reply`) whose source is inside a route passes
//!   through the same map's ranges to `out_<grant>` (the source port).
//!
//! ICMP errors about a tracked flow (`ct state related`) pass, as on input.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;

use plexsphere_policy::filter::disjoint;
use plexsphere_policy::view::{NodeView, RouteGrant};

use super::log::{LOG_PER_SECOND, LOG_PREFIX};

/// Disjoint address ranges, each with a grant index.
type Ranges = Vec<(IpAddr, IpAddr, u32)>;

/// The route prefixes of a view, flattened for nft's interval maps (which refuse
/// overlapping elements).
pub(super) struct Routes {
    /// Every peer's `routes_out`, disjoint, with the grant of the longest prefix.
    out: Ranges,
    /// Per peer (view index) with `routes_in`: its ranges and its mesh addresses.
    inb: Vec<(usize, Ranges, Vec<IpAddr>)>,
    /// Every served range (the union of the peers' `routes_in`).
    served: Vec<(IpAddr, IpAddr, ())>,
}

fn flat(list: impl Iterator<Item = RouteGrant>) -> Ranges {
    let prefixes: Vec<_> = list.map(|r| (r.prefix, r.grant)).collect();
    disjoint(&prefixes)
}

/// `a-b`, or `a` for one address.
fn range(first: &IpAddr, last: &IpAddr) -> String {
    if first == last {
        first.to_string()
    } else {
        format!("{first}-{last}")
    }
}

impl Routes {
    pub(super) fn new(view: &NodeView) -> Routes {
        let out = flat(view.peers.iter().flat_map(|p| p.routes_out.iter().cloned()));
        let inb: Vec<_> = view
            .peers
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.routes_in.is_empty())
            .map(|(i, p)| (i, flat(p.routes_in.iter().cloned()), p.addrs.clone()))
            .collect();
        let all: Vec<_> = view
            .peers
            .iter()
            .flat_map(|p| p.routes_in.iter().map(|r| (r.prefix, ())))
            .collect();
        Routes {
            out,
            inb,
            served: disjoint(&all),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.out.is_empty() && self.inb.is_empty()
    }

    /// The router's postrouting chain, after source NAT (`srcnat + 10`).
    pub(super) fn write_postrouting(&self, out: &mut String, iface: &str) {
        if self.inb.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "  chain postrouting {{\n    type filter hook postrouting priority srcnat + 10; policy accept;\n    oifname \"{iface}\" ct direction original ip saddr @served4 counter drop\n    oifname \"{iface}\" ct direction original ip6 saddr @served6 counter drop\n  }}"
        );
    }

    pub(super) fn serves(&self) -> bool {
        !self.inb.is_empty()
    }

    pub(super) fn uses(&self) -> bool {
        !self.out.is_empty()
    }

    /// The grants the route chains jump to: `(in_<g>, out_<g>)` both, for every route grant.
    pub(super) fn grants(&self) -> BTreeSet<u32> {
        let mut g: BTreeSet<u32> = self.out.iter().map(|r| r.2).collect();
        for (_, ranges, _) in &self.inb {
            g.extend(ranges.iter().map(|r| r.2));
        }
        g
    }

    /// `elements = { range : jump <chain>_<grant>, ... }` for one family of `ranges`.
    fn vmap(ranges: &[(IpAddr, IpAddr, u32)], v6: bool, chain: &str) -> Option<String> {
        let e: Vec<String> = ranges
            .iter()
            .filter(|r| r.0.is_ipv6() == v6)
            .map(|(a, b, g)| format!("{} : jump {chain}_{g}", range(a, b)))
            .collect();
        (!e.is_empty()).then(|| e.join(", "))
    }

    /// The named interval maps and the chains: `rto_<g>`, `fwd_<i>`, `rep_<i>`,
    /// `route_out`, `mesh_fwd`, `mesh_fwd_out`. The grant chains (`in_<g>`, `out_<g>`) are
    /// the caller's.
    pub(super) fn write(&self, out: &mut String) {
        // Client: a new flow into a route, the grant of its prefix (else logged, dropped).
        let grants: BTreeSet<u32> = self.out.iter().map(|r| r.2).collect();
        for g in grants {
            let _ = writeln!(
                out,
                "  chain rto_{g} {{\n    jump in_{g}\n    limit rate {LOG_PER_SECOND}/second burst {} packets log prefix \"{LOG_PREFIX}\" level info\n    counter drop\n  }}",
                LOG_PER_SECOND * 2
            );
        }
        // Client: destinations (new flows) and sources (replies) inside a route.
        for (name, chain) in [("rdst", "rto"), ("rsrc", "out")] {
            for (v6, fam) in [(false, "4"), (true, "6")] {
                let ty = if v6 { "ipv6_addr" } else { "ipv4_addr" };
                let _ = writeln!(
                    out,
                    "  map {name}{fam} {{\n    type {ty} : verdict\n    flags interval"
                );
                if let Some(e) = Self::vmap(&self.out, v6, chain) {
                    let _ = writeln!(out, "    elements = {{ {e} }}");
                }
                out.push_str("  }\n");
            }
        }
        out.push_str(
            "  chain route_out {\n    ct state related meta l4proto { icmp, icmpv6 } accept\n    ip daddr vmap @rdst4\n    ip6 daddr vmap @rdst6\n  }\n",
        );
        // Router: per client, its prefixes with their grants, both ways.
        let mut from: [Vec<String>; 2] = Default::default();
        for (i, ranges, addrs) in &self.inb {
            for (chain, field, target) in [("fwd", "daddr", "in"), ("rep", "saddr", "out")] {
                let _ = writeln!(out, "  chain {chain}_{i} {{");
                for (v6, fam) in [(false, "ip"), (true, "ip6")] {
                    if let Some(e) = Self::vmap(ranges, v6, target) {
                        let _ = writeln!(out, "    {fam} {field} vmap {{ {e} }}");
                    }
                }
                out.push_str("  }\n");
            }
            for a in addrs {
                from[usize::from(a.is_ipv6())].push(format!("{a} : jump fwd_{i}"));
            }
        }
        let mut to: [Vec<String>; 2] = Default::default();
        for (f, t) in from.iter().zip(to.iter_mut()) {
            *t = f
                .iter()
                .map(|e| e.replace(": jump fwd_", ": jump rep_"))
                .collect();
        }
        for (name, elems) in [("fwd", &from), ("rep", &to)] {
            for (fam, ty) in [(0, "ipv4_addr"), (1, "ipv6_addr")] {
                let _ = writeln!(
                    out,
                    "  map {name}{} {{\n    type {ty} : verdict",
                    if fam == 0 { "4" } else { "6" }
                );
                if !elems[fam].is_empty() {
                    let _ = writeln!(out, "    elements = {{ {} }}", elems[fam].join(", "));
                }
                out.push_str("  }\n");
            }
        }
        for (v6, fam) in [(false, "4"), (true, "6")] {
            let ty = if v6 { "ipv6_addr" } else { "ipv4_addr" };
            let _ = writeln!(
                out,
                "  set served{fam} {{\n    type {ty}\n    flags interval"
            );
            let e: Vec<String> = self
                .served
                .iter()
                .filter(|r| r.0.is_ipv6() == v6)
                .map(|(a, b, ())| range(a, b))
                .collect();
            if !e.is_empty() {
                let _ = writeln!(out, "    elements = {{ {} }}", e.join(", "));
            }
            out.push_str("  }\n");
        }
        // From the mesh: replies to flows that left through it (as without routes), ICMP
        // errors about tracked flows, a client's granted flows; the rest dropped.
        let _ = writeln!(
            out,
            "  chain mesh_fwd {{\n    ct direction reply accept\n    ct state related meta l4proto {{ icmp, icmpv6 }} accept\n    ip saddr vmap @fwd4\n    ip6 saddr vmap @fwd6\n    limit rate {LOG_PER_SECOND}/second burst {} packets log prefix \"{LOG_PREFIX}\" level info\n    counter drop\n  }}",
            LOG_PER_SECOND * 2
        );
        // To the mesh: replies only while the client's grant holds them; the client's own
        // routes checked like its output.
        out.push_str(
            "  chain mesh_fwd_out {\n    ct state related meta l4proto { icmp, icmpv6 } accept\n    ct direction reply ip daddr vmap @rep4\n    ct direction reply ip6 daddr vmap @rep6\n    ct direction reply counter drop\n    jump route_out\n  }\n",
        );
    }
}
