//! The kernel backend's policy filter: an nftables table plexd owns, generated from the
//! node's [`NodeView`] and replaced in one atomic `nft -f -` transaction (docs/policy.md,
//! "Kernel backend: nftables").
//!
//! One table per WireGuard interface, `inet plexd_<iface>`: several plexd interfaces (or a
//! test's several nodes) on one host never touch each other's rules, and `remove(iface)`
//! knows what to delete from the configuration alone. The table filters only packets that
//! arrive on the interface (`iifname`); every other interface is left alone (its base chains
//! accept, so they add nothing to what other tables decide).
//!
//! Input (packets decrypted from a peer, for this host): the destination must be one of this
//! node's mesh addresses; then every packet, not only a flow's first, is checked against the
//! policy, so a revocation cuts established flows at the next packet with no conntrack
//! flush: conntrack's direction says who opened the flow —
//! - `ct direction original` (the peer opened it): the peer's source address selects, through
//!   a verdict map, the chain of its inbound grant, which accepts the allowed destination
//!   ports (tcp, udp), icmp/icmpv6, or any other protocol;
//! - `ct direction reply` (this node opened it): the chain of the peer's outbound grant checks
//!   the source port (the port this node opened on the peer). So replies pass, and only while
//!   the policy still lets this node open that flow;
//! - ICMP errors about a tracked flow (`ct state related`) pass;
//! - anything else: a rate-limited log line (`plexd-policy drop`), counted, dropped.
//!
//! Forward (packets from the mesh this node would route): only replies to flows that left
//! through the interface; the policy grants nothing to route yet.
//!
//! Output: no chain. The receiver is the boundary (the peer drops what its policy refuses),
//! and a reply to a flow this node opened where it may not is dropped here on the way back.
//!
//! Spoofed sources: the kernel's WireGuard drops a decrypted packet whose source is not in
//! the sending peer's allowed IPs, and allowed IPs never overlap between peers, so a source
//! address selects the one peer that sent it; the verdict maps are keyed by it.
//!
//! Size: one map element per peer address plus, per distinct grant (deduplicated in the
//! view), one chain with its port ranges: `O(peer addresses + grants x ranges)`, never
//! `peers x ranges` (bounded by the policy's own limits, docs/policy.md "Limits").

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::IpAddr;
use std::process::{Command, Stdio};

use plexsphere_policy::compile::Grant;
use plexsphere_policy::filter::{NodeFilter, ViewError};
use plexsphere_policy::ports::PortSet;
use plexsphere_policy::view::NodeView;
use plexsphere_wire::node::PolicyState;

/// The program plexd runs (Debian's `nftables` package).
pub const NFT: &str = "nft";
/// The log prefix of dropped packets (kernel log, so the journal).
pub const LOG_PREFIX: &str = "plexd-policy drop: ";
/// Drop log lines per second per table (the burst is twice that).
pub const LOG_PER_SECOND: u32 = 5;
/// Linux's interface name limit (IFNAMSIZ - 1).
pub const MAX_IFACE_LEN: usize = 15;

/// Why the filter could not be installed or removed.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error(
        "interface name {0:?} cannot name an nftables table: use 1 to {MAX_IFACE_LEN} letters, digits, '_', '-' or '.'"
    )]
    BadInterface(String),
    #[error("cannot run {NFT} ({0}); install Debian's nftables package")]
    Spawn(std::io::Error),
    #[error("{NFT} refused the table for {iface} ({status}): {stderr}")]
    Refused {
        iface: String,
        status: String,
        stderr: String,
    },
}

/// What [`install`] put in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    /// No policy (a server older than policies): no table, the interface filters nothing.
    Removed,
    /// The view's filter.
    Filter,
    /// The view cannot become a filter: the table drops everything from the interface.
    Closed(ViewError),
}

/// The table's name for `iface`.
pub fn table_name(iface: &str) -> String {
    format!("plexd_{}", safe(iface))
}

fn valid_iface(iface: &str) -> bool {
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
        out.push_str("    meta l4proto { icmp, ipv6-icmp } accept\n");
    }
    if g.access.other {
        out.push_str("    meta l4proto != { tcp, udp, icmp, ipv6-icmp } accept\n");
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

fn filter_ruleset(iface: &str, view: &NodeView) -> String {
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
    for (dir, (chain, port)) in [("in", "dport"), ("out", "sport")].into_iter().enumerate() {
        for (i, g) in view.grants.iter().enumerate() {
            if used[dir][i] {
                grant_chain(&mut out, &format!("{chain}_{i}"), g, port);
            }
        }
        map(&mut out, &format!("{chain}4"), "ipv4_addr", &elems[dir][0]);
        map(&mut out, &format!("{chain}6"), "ipv6_addr", &elems[dir][1]);
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
        "    ct state related meta l4proto { icmp, ipv6-icmp } accept\n\
         \x20   ct direction original ip saddr vmap @in4\n\
         \x20   ct direction original ip6 saddr vmap @in6\n\
         \x20   ct direction reply ip saddr vmap @out4\n\
         \x20   ct direction reply ip6 saddr vmap @out6\n",
    );
    let _ = writeln!(
        out,
        "    limit rate {LOG_PER_SECOND}/second burst {} packets log prefix \"{LOG_PREFIX}\" level info\n    counter drop\n  }}",
        LOG_PER_SECOND * 2
    );
    let _ = writeln!(
        out,
        "  chain input {{\n    type filter hook input priority filter; policy accept;\n    iifname \"{name}\" jump mesh_in\n  }}"
    );
    let _ = writeln!(
        out,
        "  chain forward {{\n    type filter hook forward priority filter; policy accept;\n    iifname \"{name}\" ct direction reply accept\n    iifname \"{name}\" counter drop\n  }}"
    );
    out.push_str("}\n");
    out
}

/// Runs `nft -f -` with `input`: one transaction, all or nothing (a refused input leaves the
/// table as it was).
fn run(iface: &str, input: &str) -> Result<(), NftError> {
    if !valid_iface(iface) {
        return Err(NftError::BadInterface(iface.to_owned()));
    }
    let mut child = Command::new(NFT)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(NftError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A write error (nft exited early) shows in its status and stderr below.
        let _ = stdin.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(NftError::Spawn)?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(NftError::Refused {
        iface: iface.to_owned(),
        status: out.status.to_string(),
        stderr: stderr
            .trim()
            .lines()
            .take(8)
            .collect::<Vec<_>>()
            .join(" | "),
    })
}

/// Replaces `iface`'s table with the filter of `view` in one transaction (`None`: removes
/// it; a view that cannot become a filter: the closed table).
pub fn install(iface: &str, view: Option<&NodeView>) -> Result<Installed, NftError> {
    let Some(v) = view else {
        run(iface, &ruleset(iface, None))?;
        return Ok(Installed::Removed);
    };
    match NodeFilter::new(v) {
        Ok(_) => {
            run(iface, &filter_ruleset(iface, v))?;
            Ok(Installed::Filter)
        }
        Err(e) => {
            run(iface, &closed_ruleset(iface))?;
            Ok(Installed::Closed(e))
        }
    }
}

/// Replaces `iface`'s table with one that drops everything arriving on it.
pub fn install_closed(iface: &str) -> Result<(), NftError> {
    run(iface, &closed_ruleset(iface))
}

/// Removes `iface`'s table (nothing to do when there is none).
pub fn remove(iface: &str) -> Result<(), NftError> {
    run(iface, &ruleset(iface, None))
}

/// Whether `iface`'s table exists (the worker asks every reconcile: `nft list tables`
/// prints only the names, never the table's elements).
pub fn exists(iface: &str) -> Result<bool, NftError> {
    if !valid_iface(iface) {
        return Err(NftError::BadInterface(iface.to_owned()));
    }
    let out = Command::new(NFT)
        .args(["list", "tables", "inet"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(NftError::Spawn)?;
    if !out.status.success() {
        return Err(NftError::Refused {
            iface: iface.to_owned(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    let line = format!("table inet {}", table_name(iface));
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == line))
}

/// The kernel backend's [`super::contract::Mesh::set_policy`]: installs the view's filter,
/// or removes the table for no policy. Fail closed: a view that cannot become a filter, or
/// a filter nft refuses, leaves the closed table (everything from the interface dropped)
/// and answers `Err`, on which the daemon configures no peers either (so even a closed table
/// nft could not install lets nothing through) and says so in its journal, metrics and
/// `plexd status`.
pub fn set_policy(iface: &str, policy: Option<&PolicyState>) -> std::io::Result<()> {
    let Some(policy) = policy else {
        return match remove(iface) {
            Ok(()) => Ok(()),
            // No nft, so no table plexd could have made: nothing to remove.
            Err(NftError::Spawn(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(std::io::Error::other(format!(
                "cannot remove the policy table ({e}); the last policy's filter stays in force until `nft delete table inet {}`",
                table_name(iface)
            ))),
        };
    };
    let version = policy.version;
    let why = match install(iface, Some(&policy.view)) {
        Ok(Installed::Filter | Installed::Removed) => {
            tracing::info!(interface = iface, policy_version = version, table = %table_name(iface), "policy: nftables filter installed");
            return Ok(());
        }
        Ok(Installed::Closed(e)) => {
            format!("the view of policy version {version} cannot become a filter ({e})")
        }
        Err(e) => match install_closed(iface) {
            Ok(()) => format!("cannot install the filter of policy version {version} ({e})"),
            Err(closed) => format!(
                "cannot install the filter of policy version {version} ({e}), nor the closed table ({closed})"
            ),
        },
    };
    tracing::error!(
        interface = iface,
        policy_version = version,
        "policy: {why}; nothing from any peer passes until a usable policy is installed"
    );
    Err(std::io::Error::other(format!(
        "{why}; nothing from any peer passes until a usable policy is installed"
    )))
}

/// Installs `policy` again when its table is gone (an `nft flush ruleset`, an
/// nftables.service restart); `Ok(true)` when it did. A table that exists is left as it is
/// (its rules are not compared). Cannot tell (nft fails): `Err`, nothing done.
pub fn restore(iface: &str, policy: &PolicyState) -> std::io::Result<bool> {
    match exists(iface) {
        Ok(true) => Ok(false),
        Ok(false) => set_policy(iface, Some(policy)).map(|()| true),
        Err(e) => Err(std::io::Error::other(format!(
            "cannot tell whether the policy table is in place ({e})"
        ))),
    }
}

/// `plexd leave` and `plexd uninstall`: the table goes with the interface. No nft means no
/// table plexd could have made.
pub fn remove_on_leave(iface: &str) -> Result<(), String> {
    match remove(iface) {
        Ok(()) => Ok(()),
        Err(NftError::Spawn(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!(
            "cannot remove the policy table ({e}); run `nft delete table inet {}`",
            table_name(iface)
        )),
    }
}
