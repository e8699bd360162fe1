//! `policy explain SRC DST [PORT/PROTO]`: which rule (and line) lets one node reach another,
//! or "no rule allows it" with the rule that would. Uses the plain evaluator.

use std::fmt;

use crate::eval;
use crate::inventory::NodeInfo;
use crate::model::Policy;
use crate::ports::Proto;

/// Parses `5432/tcp`, `tcp/5432`, `53/udp` or `icmp` (what explain and `plexd ping` take).
pub fn parse_what(s: &str) -> Result<(Proto, u16), String> {
    let s = s.trim();
    if s == "icmp" {
        return Ok((Proto::Icmp, 0));
    }
    let (a, b) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}`: write PORT/PROTO like 5432/tcp or 53/udp, or icmp"))?;
    let (port, proto) = if a.parse::<u16>().is_ok() {
        (a, b)
    } else {
        (b, a)
    };
    let proto = match Proto::parse(proto) {
        Some(p) if p.has_ports() => p,
        _ => {
            return Err(format!(
                "`{s}`: the protocol is tcp or udp (icmp has no port)"
            ));
        }
    };
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("`{s}`: the port is a number from 0 to 65535"))?;
    Ok((proto, port))
}

/// The answer, as lines a person reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// Whether the asked packet (or, without one, anything at all) is allowed.
    pub allowed: bool,
    /// The rules (indexes) that allow it, in document order.
    pub rules: Vec<usize>,
    pub lines: Vec<String>,
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.lines.join("\n"))
    }
}

fn suggestion(src: &NodeInfo, dst: &NodeInfo, what: Option<(Proto, u16)>) -> String {
    let tail = match what {
        Some((p, port)) if p.has_ports() => format!(", proto: {p}, ports: {port}"),
        Some((p, _)) => format!(", proto: {p}"),
        None => String::new(),
    };
    format!(
        "a rule that would allow it: {{src: 'node:{}', dst: 'node:{}'{tail}}} (or name their tags)",
        src.name, dst.name
    )
}

/// Why `src` may (or may not) open `what` on `dst`; without `what`, everything it may open.
pub fn explain(
    policy: &Policy,
    src: &NodeInfo,
    dst: &NodeInfo,
    what: Option<(Proto, u16)>,
) -> Explanation {
    let (access, all_rules) = eval::access(policy, src, dst);
    let pair = format!("{} -> {}", src.name, dst.name);
    let mut lines = Vec::new();
    let (allowed, rules) = match what {
        Some((proto, port)) => {
            let label = if proto.has_ports() {
                format!("{proto}/{port}")
            } else {
                proto.to_string()
            };
            let rules: Vec<usize> = all_rules
                .iter()
                .copied()
                .filter(|&r| policy.rules[r].covers(proto, port))
                .collect();
            match rules.first() {
                Some(&r) => {
                    lines.push(format!("{pair} {label}: allowed by {}", policy.rules[r]));
                    for &o in &rules[1..] {
                        lines.push(format!("  also allowed by {}", policy.rules[o]));
                    }
                }
                None => {
                    lines.push(format!("{pair} {label}: no rule allows it"));
                    lines.push(format!("  {}", suggestion(src, dst, what)));
                }
            }
            (!rules.is_empty(), rules)
        }
        None => {
            if all_rules.is_empty() {
                lines.push(format!("{pair}: no rule allows it (nothing may be opened)"));
                lines.push(format!("  {}", suggestion(src, dst, None)));
            } else {
                lines.push(format!("{pair}: may open {access}"));
                for &r in &all_rules {
                    lines.push(format!("  {}", policy.rules[r]));
                }
            }
            (!all_rules.is_empty(), all_rules.clone())
        }
    };
    let back = eval::access(policy, dst, src).1;
    lines.push(match back.first() {
        _ if !eval::connected(policy, src, dst) => format!(
            "{} and {} are not WireGuard peers: no rule connects them either way",
            src.name, dst.name
        ),
        Some(&r) if all_rules.is_empty() => format!(
            "they are WireGuard peers because {} -> {} is allowed by line {}",
            dst.name, src.name, policy.rules[r].at.line
        ),
        _ => format!("{} and {} are WireGuard peers", src.name, dst.name),
    });
    Explanation {
        allowed,
        rules,
        lines,
    }
}

/// Why `src` may (or may not) open `what` on an address outside the mesh (`dst` a CIDR
/// destination: a host behind a subnet router or an exit, docs/routes.md). Which router
/// carries the address is the control plane's to say; this answers the rules.
pub fn explain_address(
    policy: &Policy,
    src: &NodeInfo,
    dst: std::net::IpAddr,
    what: Option<(Proto, u16)>,
) -> Explanation {
    let empty = crate::inventory::Inventory::default();
    let resolver = crate::resolve::Resolver::new(policy, &empty);
    let holds = |i: usize| {
        let r = &policy.rules[i];
        eval::selects_any(policy, &r.src, src)
            && resolver.prefixes(&r.dst).iter().any(|p| p.contains(&dst))
            && what.is_none_or(|(proto, port)| r.covers(proto, port))
    };
    let rules: Vec<usize> = (0..policy.rules.len()).filter(|&i| holds(i)).collect();
    let label = match what {
        Some((p, port)) if p.has_ports() => format!(" {p}/{port}"),
        Some((p, _)) => format!(" {p}"),
        None => String::new(),
    };
    let pair = format!("{} -> {dst}{label}", src.name);
    let mut lines = Vec::new();
    match rules.first() {
        Some(&r) => {
            lines.push(format!("{pair}: allowed by {}", policy.rules[r]));
            for &o in &rules[1..] {
                lines.push(format!("  also allowed by {}", policy.rules[o]));
            }
        }
        None => {
            let tail = match what {
                Some((p, port)) if p.has_ports() => format!(", proto: {p}, ports: {port}"),
                Some((p, _)) => format!(", proto: {p}"),
                None => String::new(),
            };
            lines.push(format!("{pair}: no rule allows it"));
            lines.push(format!(
                "  a rule that would allow it: {{src: 'node:{}', dst: '{dst}'{tail}}} (or name a tag and the route's CIDR)",
                src.name
            ));
        }
    }
    Explanation {
        allowed: !rules.is_empty(),
        rules,
        lines,
    }
}
