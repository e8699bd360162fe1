//! Selectors resolved against an inventory, for the compiler: node sets as bitsets (set
//! algebra, no per-node walk of the document) and, for the subnet routes to come, the
//! address prefixes a selector names (`*` and CIDRs, with subtraction done on prefixes).

use std::collections::HashMap;

use ipnet::IpNet;

use crate::bitset::BitSet;
use crate::inventory::Inventory;
use crate::limits::MAX_GROUP_DEPTH;
use crate::model::Policy;
use crate::selector::{Atom, NameOrId, Selector};

pub(crate) struct Resolver<'a> {
    policy: &'a Policy,
    inv: &'a Inventory,
    tags: HashMap<&'a str, BitSet>,
    groups: HashMap<String, BitSet>,
}

impl<'a> Resolver<'a> {
    pub fn new(policy: &'a Policy, inv: &'a Inventory) -> Self {
        let n = inv.nodes.len();
        let mut tags: HashMap<&str, BitSet> = HashMap::new();
        for (i, node) in inv.nodes.iter().enumerate() {
            for t in &node.tags {
                tags.entry(t.as_str())
                    .or_insert_with(|| BitSet::new(n))
                    .insert(i);
            }
        }
        Self {
            policy,
            inv,
            tags,
            groups: HashMap::new(),
        }
    }

    fn matching(&self, f: impl Fn(&crate::inventory::NodeInfo) -> bool) -> BitSet {
        let mut s = BitSet::new(self.inv.nodes.len());
        for (i, node) in self.inv.nodes.iter().enumerate() {
            if f(node) {
                s.insert(i);
            }
        }
        s
    }

    fn atom(&mut self, a: &Atom, depth: usize) -> BitSet {
        let n = self.inv.nodes.len();
        match a {
            Atom::All => BitSet::full(n),
            Atom::Tag(t) => self
                .tags
                .get(t.as_str())
                .cloned()
                .unwrap_or_else(|| BitSet::new(n)),
            Atom::Project(NameOrId::Name(s)) => self.matching(|x| &x.project_slug == s),
            Atom::Project(NameOrId::Id(id)) => self.matching(|x| &x.project_id == id),
            Atom::Node(NameOrId::Name(s)) => self.matching(|x| &x.name == s),
            Atom::Node(NameOrId::Id(id)) => self.matching(|x| &x.id == id),
            Atom::Cidr(net) => self.matching(|x| x.addrs().any(|ip| net.contains(&ip))),
            Atom::Group(g) => {
                if let Some(s) = self.groups.get(g) {
                    return s.clone();
                }
                let mut s = BitSet::new(n);
                if depth < MAX_GROUP_DEPTH
                    && let Some(group) = self.policy.group(g)
                {
                    for m in &group.members {
                        s.union_with(&self.selector(m, depth + 1));
                    }
                }
                self.groups.insert(g.clone(), s.clone());
                s
            }
        }
    }

    fn selector(&mut self, sel: &Selector, depth: usize) -> BitSet {
        let mut s = self.atom(&sel.include.atom, depth);
        for t in &sel.exclude {
            s.subtract(&self.atom(&t.atom, depth));
        }
        s
    }

    /// The nodes in any of `sels`.
    pub fn nodes(&mut self, sels: &[Selector]) -> BitSet {
        let mut s = BitSet::new(self.inv.nodes.len());
        for sel in sels {
            s.union_with(&self.selector(sel, 0));
        }
        s
    }

    /// The address prefixes `sels` name (`*` is every address; tags and names none).
    pub fn prefixes(&self, sels: &[Selector]) -> Vec<IpNet> {
        let all: Vec<IpNet> = sels
            .iter()
            .flat_map(|s| selector_prefixes(self.policy, s, 0))
            .collect();
        IpNet::aggregate(&all)
    }
}

fn atom_prefixes(policy: &Policy, a: &Atom, depth: usize) -> Vec<IpNet> {
    match a {
        Atom::All => ["0.0.0.0/0", "::/0"]
            .iter()
            .filter_map(|s| s.parse().ok())
            .collect(),
        Atom::Cidr(net) => vec![*net],
        Atom::Group(g) if depth < MAX_GROUP_DEPTH => policy
            .group(g)
            .map(|g| {
                g.members
                    .iter()
                    .flat_map(|m| selector_prefixes(policy, m, depth + 1))
                    .collect()
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

fn selector_prefixes(policy: &Policy, sel: &Selector, depth: usize) -> Vec<IpNet> {
    let mut set = atom_prefixes(policy, &sel.include.atom, depth);
    for t in &sel.exclude {
        for q in atom_prefixes(policy, &t.atom, depth) {
            set = set.into_iter().flat_map(|p| subtract(p, q)).collect();
        }
    }
    set
}

/// `p` without the addresses of `q`, as prefixes (at most one per bit of difference).
pub(crate) fn subtract(p: IpNet, q: IpNet) -> Vec<IpNet> {
    if q.contains(&p) {
        return Vec::new();
    }
    if !p.contains(&q) {
        return vec![p];
    }
    let mut out = Vec::new();
    let mut cur = p;
    while cur.prefix_len() < q.prefix_len() {
        let Ok(halves) = cur.subnets(cur.prefix_len() + 1) else {
            break;
        };
        let halves: Vec<IpNet> = halves.collect();
        let Some(&inner) = halves.iter().find(|h| h.contains(&q)) else {
            break;
        };
        out.extend(halves.into_iter().filter(|h| *h != inner));
        cur = inner;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn prefix_subtraction() {
        assert_eq!(
            subtract(net("10.0.0.0/8"), net("10.128.0.0/9")),
            vec![net("10.0.0.0/9")]
        );
        assert_eq!(
            subtract(net("10.0.0.0/8"), net("11.0.0.0/8")),
            vec![net("10.0.0.0/8")]
        );
        assert!(subtract(net("10.1.0.0/16"), net("10.0.0.0/8")).is_empty());
        let rest = subtract(net("10.0.0.0/8"), net("10.1.2.0/24"));
        assert_eq!(rest.len(), 16);
        assert!(rest.iter().all(|p| !p.contains(&net("10.1.2.7/32"))));
        assert!(rest.iter().any(|p| p.contains(&net("10.1.3.7/32"))));
    }
}
