//! Selectors resolved against an inventory, for the compiler: node sets as bitsets (set
//! algebra, no per-node walk of the document) and, for the subnet routes to come, the
//! address prefixes a selector names (`*` and CIDRs, with subtraction done on prefixes).

use std::collections::HashMap;

use ipnet::IpNet;
use uuid::Uuid;

use crate::bitset::BitSet;
use crate::inventory::Inventory;
use crate::limits::MAX_GROUP_DEPTH;
use crate::model::Policy;
use crate::selector::{Atom, NameOrId, Selector};

/// Where each node is, by every key a selector can name, so an atom costs the size of its
/// answer plus one bitset, never a scan of the inventory.
#[derive(Default)]
struct Index<'a> {
    tags: HashMap<&'a str, Vec<usize>>,
    names: HashMap<&'a str, Vec<usize>>,
    ids: HashMap<Uuid, Vec<usize>>,
    slugs: HashMap<&'a str, Vec<usize>>,
    projects: HashMap<Uuid, Vec<usize>>,
    /// Mesh addresses, sorted, for CIDR ranges.
    v4: Vec<(u32, usize)>,
    v6: Vec<(u128, usize)>,
}

pub(crate) struct Resolver<'a> {
    policy: &'a Policy,
    inv: &'a Inventory,
    index: Index<'a>,
    groups: HashMap<String, BitSet>,
}

impl<'a> Resolver<'a> {
    pub fn new(policy: &'a Policy, inv: &'a Inventory) -> Self {
        let mut index = Index::default();
        for (i, node) in inv.nodes.iter().enumerate() {
            for t in &node.tags {
                index.tags.entry(t.as_str()).or_default().push(i);
            }
            index.names.entry(node.name.as_str()).or_default().push(i);
            index.ids.entry(node.id).or_default().push(i);
            index
                .slugs
                .entry(node.project_slug.as_str())
                .or_default()
                .push(i);
            index.projects.entry(node.project_id).or_default().push(i);
            if let Some(a) = node.ipv4 {
                index.v4.push((u32::from(a), i));
            }
            if let Some(a) = node.ipv6 {
                index.v6.push((u128::from(a), i));
            }
        }
        index.v4.sort_unstable();
        index.v6.sort_unstable();
        Self {
            policy,
            inv,
            index,
            groups: HashMap::new(),
        }
    }

    fn set(&self, members: impl IntoIterator<Item = usize>) -> BitSet {
        let mut s = BitSet::new(self.inv.nodes.len());
        for i in members {
            s.insert(i);
        }
        s
    }

    fn listed(&self, map: &HashMap<&str, Vec<usize>>, key: &str) -> BitSet {
        self.set(map.get(key).into_iter().flatten().copied())
    }

    fn by_id(&self, map: &HashMap<Uuid, Vec<usize>>, key: &Uuid) -> BitSet {
        self.set(map.get(key).into_iter().flatten().copied())
    }

    /// The nodes whose mesh address is inside `net` (two binary searches).
    fn cidr(&self, net: &IpNet) -> BitSet {
        fn range<T: Ord + Copy>(v: &[(T, usize)], lo: T, hi: T) -> &[(T, usize)] {
            let a = v.partition_point(|&(x, _)| x < lo);
            let b = v.partition_point(|&(x, _)| x <= hi);
            v.get(a..b.max(a)).unwrap_or(&[])
        }
        match net {
            IpNet::V4(n) => {
                let r = range(
                    &self.index.v4,
                    u32::from(n.network()),
                    u32::from(n.broadcast()),
                );
                self.set(r.iter().map(|&(_, i)| i))
            }
            IpNet::V6(n) => {
                let r = range(
                    &self.index.v6,
                    u128::from(n.network()),
                    u128::from(n.broadcast()),
                );
                self.set(r.iter().map(|&(_, i)| i))
            }
        }
    }

    fn atom(&mut self, a: &Atom, depth: usize) -> BitSet {
        let n = self.inv.nodes.len();
        match a {
            Atom::All => BitSet::full(n),
            Atom::Tag(t) => self.listed(&self.index.tags, t.as_str()),
            Atom::Project(NameOrId::Name(s)) => self.listed(&self.index.slugs, s.as_str()),
            Atom::Project(NameOrId::Id(id)) => self.by_id(&self.index.projects, id),
            Atom::Node(NameOrId::Name(s)) => self.listed(&self.index.names, s.as_str()),
            Atom::Node(NameOrId::Id(id)) => self.by_id(&self.index.ids, id),
            Atom::Cidr(net) => self.cidr(net),
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
