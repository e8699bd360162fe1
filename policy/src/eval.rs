//! The plain evaluator: answers "may A reach B on proto/port" straight from the document,
//! walking the selectors for each node and scanning the rules in order. It is the
//! reference the compiled filter is checked against (property test), and what the
//! document's tests and `explain` use. Never on the packet path.

use crate::inventory::NodeInfo;
use crate::limits::MAX_GROUP_DEPTH;
use crate::model::Policy;
use crate::ports::{Access, Proto};
use crate::selector::{Atom, NameOrId, Selector};

/// Whether `node` is in `sel`. Groups deeper than the limit (only possible in a document
/// that was not parsed) select nothing.
pub fn selects(policy: &Policy, sel: &Selector, node: &NodeInfo) -> bool {
    selects_at(policy, sel, node, 0)
}

fn selects_at(policy: &Policy, sel: &Selector, node: &NodeInfo, depth: usize) -> bool {
    atom(policy, &sel.include.atom, node, depth)
        && !sel
            .exclude
            .iter()
            .any(|t| atom(policy, &t.atom, node, depth))
}

fn atom(policy: &Policy, a: &Atom, node: &NodeInfo, depth: usize) -> bool {
    match a {
        Atom::All => true,
        Atom::Tag(t) => node.has_tag(t),
        Atom::Project(NameOrId::Name(s)) => &node.project_slug == s,
        Atom::Project(NameOrId::Id(id)) => &node.project_id == id,
        Atom::Node(NameOrId::Name(n)) => &node.name == n,
        Atom::Node(NameOrId::Id(id)) => &node.id == id,
        Atom::Cidr(net) => node.addrs().any(|ip| net.contains(&ip)),
        Atom::Group(g) => {
            depth < MAX_GROUP_DEPTH
                && policy.group(g).is_some_and(|g| {
                    g.members
                        .iter()
                        .any(|m| selects_at(policy, m, node, depth + 1))
                })
        }
    }
}

/// Whether `node` is in any of `sels` (a rule's src or dst list).
pub fn selects_any(policy: &Policy, sels: &[Selector], node: &NodeInfo) -> bool {
    sels.iter().any(|s| selects(policy, s, node))
}

/// The outcome for one packet kind between two nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed; the index of the first rule (in document order) that allows it.
    Accept {
        rule: usize,
    },
    Deny,
}

/// May `src` open `proto` to `port` on `dst`? Scans the rules in order.
pub fn decide(policy: &Policy, src: &NodeInfo, dst: &NodeInfo, proto: Proto, port: u16) -> Verdict {
    policy
        .rules
        .iter()
        .position(|r| {
            r.covers(proto, port)
                && selects_any(policy, &r.src, src)
                && selects_any(policy, &r.dst, dst)
        })
        .map_or(Verdict::Deny, |rule| Verdict::Accept { rule })
}

/// Everything `src` may open on `dst`, and the rules (indexes) that grant it.
pub fn access(policy: &Policy, src: &NodeInfo, dst: &NodeInfo) -> (Access, Vec<usize>) {
    let mut acc = Access::default();
    let mut rules = Vec::new();
    for (i, r) in policy.rules.iter().enumerate() {
        if selects_any(policy, &r.src, src) && selects_any(policy, &r.dst, dst) {
            acc.add(r.protos, &r.ports);
            rules.push(i);
        }
    }
    (acc, rules)
}

/// Whether two nodes are WireGuard peers: some rule connects them in either direction.
pub fn connected(policy: &Policy, a: &NodeInfo, b: &NodeInfo) -> bool {
    policy.rules.iter().any(|r| {
        (selects_any(policy, &r.src, a) && selects_any(policy, &r.dst, b))
            || (selects_any(policy, &r.src, b) && selects_any(policy, &r.dst, a))
    })
}
