//! The nft input for a view (pure, table-tested in `mesh/nft_tests.rs`): the table's name,
//! the filter, the closed table, the removal. What the rules mean: the parent module's doc.

use std::fmt::Write as _;
use std::net::IpAddr;

use plexsphere_policy::compile::Grant;
use plexsphere_policy::filter::NodeFilter;
use plexsphere_policy::ports::PortSet;
use plexsphere_policy::view::NodeView;

use super::routes::Routes;

pub use super::log::{LOG_PER_SECOND, LOG_PREFIX};
/// Linux's interface name limit (IFNAMSIZ - 1).
pub const MAX_IFACE_LEN: usize = 15;

/// The table's name for `iface`.
pub fn table_name(iface: &str) -> String {
    format!("plexd_{}", safe(iface))
}

pub(super) fn valid_iface(iface: &str) -> bool {
    !iface.is_empty()
        && iface.len() <= MAX_IFACE_LEN
        && iface
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The name with anything nft would misread replaced (install refuses such names first).
fn safe(iface: &str) -> String {
    iface
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Creates the table if missing, then deletes it: the start of every transaction, so a
/// replace or a removal works whether or not the table exists.
fn delete(out: &mut String, table: &str) {
    let _ = writeln!(out, "table inet {table}\ndelete table inet {table}");
}

/// The nft input for `view` on `iface`: `None` (no policy) removes the table; a view that
/// cannot become a filter gives [`closed_ruleset`].
pub fn ruleset(iface: &str, view: Option<&NodeView>) -> String {
    match view {
        None => {
            let mut out = String::new();
            delete(&mut out, &table_name(iface));
            out
        }
        Some(v) => match NodeFilter::new(v) {
            Ok(_) => filter_ruleset(iface, v),
            Err(_) => closed_ruleset(iface),
        },
    }
}

/// A table that drops everything arriving on `iface` (fail closed).
pub fn closed_ruleset(iface: &str) -> String {
    let (table, name) = (table_name(iface), safe(iface));
    let mut out = String::new();
    delete(&mut out, &table);
    let _ = writeln!(out, "table inet {table} {{");
    for hook in ["input", "forward"] {
        let _ = writeln!(
            out,
            "  chain {hook} {{\n    type filter hook {hook} priority filter; policy accept;\n    iifname \"{name}\" counter drop\n  }}"
        );
    }
    out.push_str("}\n");
    out
}

fn ports(set: &PortSet) -> Option<String> {
    if set.is_empty() {
        return None;
    }
    let items: Vec<String> = set
        .ranges()
        .iter()
        .map(|r| {
            if r.first == r.last {
                r.first.to_string()
            } else {
                format!("{}-{}", r.first, r.last)
            }
        })
        .collect();
    Some(items.join(", "))
}

/// A grant's chain: `port` is `dport` (what a peer opens here) or `sport` (replies from
/// what this node opened on the peer).
fn grant_chain(out: &mut String, name: &str, g: &Grant, port: &str) {
    let _ = writeln!(out, "  chain {name} {{");
    for (proto, set) in [("tcp", &g.access.tcp), ("udp", &g.access.udp)] {
        if set.is_all() {
            let _ = writeln!(out, "    meta l4proto {proto} accept");
        } else if let Some(p) = ports(set) {
            let _ = writeln!(out, "    {proto} {port} {{ {p} }} accept");
        }
    }
    if g.access.icmp {
        out.push_str("    meta l4proto { icmp, icmpv6 } accept\n");
    }
    if g.access.other {
        out.push_str("    meta l4proto != { tcp, udp, icmp, icmpv6 } accept\n");
    }
    out.push_str("  }\n");
}

/// Per family, `addr : jump chain` for every peer address with a grant in that direction.
fn map(out: &mut String, name: &str, ty: &str, elems: &[String]) {
    let _ = writeln!(out, "  map {name} {{\n    type {ty} : verdict");
    if !elems.is_empty() {
        let _ = writeln!(out, "    elements = {{ {} }}", elems.join(", "));
    }
    out.push_str("  }\n");
}

pub(super) fn filter_ruleset(iface: &str, view: &NodeView) -> String {
    let (table, name) = (table_name(iface), safe(iface));
    let mut out = String::new();
    delete(&mut out, &table);
    let _ = writeln!(out, "table inet {table} {{");
    // Chains only for the grants some peer uses in that direction.
    let mut used = [
        vec![false; view.grants.len()],
        vec![false; view.grants.len()],
    ];
    let mut elems: [[Vec<String>; 2]; 2] = Default::default();
    for p in &view.peers {
        for (dir, g) in [p.inbound, p.outbound].into_iter().enumerate() {
            let Some(g) = g.filter(|&g| (g as usize) < view.grants.len()) else {
                continue;
            };
            used[dir][g as usize] = true;
            let chain = if dir == 0 { "in" } else { "out" };
            for a in &p.addrs {
                let fam = usize::from(a.is_ipv6());
                elems[dir][fam].push(format!("{a} : jump {chain}_{g}"));
            }
        }
    }
    // The route chains check a grant both ways: the destination ports of a new flow
    // (`in_<g>`), the source ports of its replies (`out_<g>`).
    let routes = Routes::new(view);
    for g in routes.grants() {
        if let Some(g) = usize::try_from(g).ok().filter(|&g| g < view.grants.len()) {
            used[0][g] = true;
            used[1][g] = true;
        }
    }
    for (dir, (chain, port)) in [("in", "dport"), ("out", "sport")].into_iter().enumerate() {
        for (i, g) in view.grants.iter().enumerate() {
            if used[dir][i] {
                grant_chain(&mut out, &format!("{chain}_{i}"), g, port);
            }
        }
        map(&mut out, &format!("{chain}4"), "ipv4_addr", &elems[dir][0]);
        map(&mut out, &format!("{chain}6"), "ipv6_addr", &elems[dir][1]);
    }
    if !routes.is_empty() {
        routes.write(&mut out);
    }
    let own = |v6: bool| -> Vec<String> {
        let mut a: Vec<String> = view
            .addrs
            .iter()
            .filter(|a| a.is_ipv6() == v6)
            .map(IpAddr::to_string)
            .collect();
        a.sort();
        a.dedup();
        a
    };
    out.push_str("  chain mesh_in {\n");
    if routes.serves() {
        // A client's packet to an address of this host inside a served prefix (its LAN
        // address): the route's grant, as for the prefix's other hosts.
        out.push_str("    ip saddr vmap @fwd4\n    ip6 saddr vmap @fwd6\n");
    }
    for (v6, (fam, nfproto)) in [(false, ("ip", "ipv4")), (true, ("ip6", "ipv6"))] {
        let own = own(v6);
        if own.is_empty() {
            let _ = writeln!(out, "    meta nfproto {nfproto} counter drop");
        } else {
            let _ = writeln!(
                out,
                "    {fam} daddr != {{ {} }} counter drop",
                own.join(", ")
            );
        }
    }
    out.push_str(
        "    ct state related meta l4proto { icmp, icmpv6 } accept\n\
         \x20   ct direction original ip saddr vmap @in4\n\
         \x20   ct direction original ip6 saddr vmap @in6\n\
         \x20   ct direction reply ip saddr vmap @out4\n\
         \x20   ct direction reply ip6 saddr vmap @out6\n",
    );
    if routes.uses() {
        // Replies from inside a route through a peer: the route's grant on the source port.
        out.push_str(
            "    ct direction reply ip saddr vmap @rsrc4\n    ct direction reply ip6 saddr vmap @rsrc6\n",
        );
    }
    let _ = writeln!(
        out,
        "    limit rate {LOG_PER_SECOND}/second burst {} packets log prefix \"{LOG_PREFIX}\" level info\n    counter drop\n  }}",
        LOG_PER_SECOND * 2
    );
    let _ = writeln!(
        out,
        "  chain input {{\n    type filter hook input priority filter; policy accept;\n    iifname \"{name}\" jump mesh_in\n  }}"
    );
    if routes.is_empty() {
        let _ = writeln!(
            out,
            "  chain forward {{\n    type filter hook forward priority filter; policy accept;\n    iifname \"{name}\" ct direction reply accept\n    iifname \"{name}\" counter drop\n  }}"
        );
    } else {
        let _ = writeln!(
            out,
            "  chain forward {{\n    type filter hook forward priority filter; policy accept;\n    iifname \"{name}\" jump mesh_fwd\n    oifname \"{name}\" jump mesh_fwd_out\n  }}"
        );
    }
    routes.write_postrouting(&mut out, &name);
    if routes.uses() {
        let _ = writeln!(
            out,
            "  chain output {{\n    type filter hook output priority filter; policy accept;\n    oifname \"{name}\" jump route_out\n  }}"
        );
    }
    out.push_str("}\n");
    out
}
