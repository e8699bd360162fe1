//! The reachability diff between two compiled policies over one inventory: which node
//! pairs gain or lose which ports and protocols, grouped (nodes the two policies treat
//! alike share a line) and printed as lines a person reads. What `policy set` shows before
//! it applies.

use std::collections::HashMap;
use std::fmt;

use crate::compile::Compiled;
use crate::ports::Access;

/// One line of the diff: every pair from `srcs` to `dsts` (other than a node to itself)
/// gains and loses the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffEntry {
    pub srcs: Vec<String>,
    pub dsts: Vec<String>,
    /// Node pairs this line covers.
    pub pairs: usize,
    pub gained: Access,
    pub lost: Access,
}

/// Names shown per side of a line before "and N more".
const NAMES_SHOWN: usize = 5;

fn names(v: &[String]) -> String {
    let mut s = v
        .iter()
        .take(NAMES_SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if v.len() > NAMES_SHOWN {
        s.push_str(&format!(" and {} more", v.len() - NAMES_SHOWN));
    }
    s
}

impl fmt::Display for DiffEntry {
    /// `web-1, web-2 -> db-1 (2 pairs): gains tcp 5432; loses icmp`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {}", names(&self.srcs), names(&self.dsts))?;
        if self.pairs > 1 {
            write!(f, " ({} pairs)", self.pairs)?;
        }
        f.write_str(":")?;
        if !self.gained.is_empty() {
            write!(f, " gains {}", self.gained)?;
        }
        if !self.gained.is_empty() && !self.lost.is_empty() {
            f.write_str(";")?;
        }
        if !self.lost.is_empty() {
            write!(f, " loses {}", self.lost)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReachDiff {
    pub entries: Vec<DiffEntry>,
}

impl ReachDiff {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl fmt::Display for ReachDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.entries.is_empty() {
            return f.write_str("no node pair gains or loses anything");
        }
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Nodes grouped by their (old class, new class) on one side.
fn joint(old: &[u32], new: &[u32]) -> Vec<((u32, u32), Vec<usize>)> {
    let mut map: HashMap<(u32, u32), Vec<usize>> = HashMap::new();
    for (n, (&o, &w)) in old.iter().zip(new).enumerate() {
        map.entry((o, w)).or_default().push(n);
    }
    let mut v: Vec<_> = map.into_iter().collect();
    v.sort_by_key(|(_, members)| members[0]);
    v
}

/// What changes from `old` to `new`. Both must be compiled over the same inventory (the
/// same nodes in the same order); nodes beyond the shorter list are ignored.
pub fn reach_diff(old: &Compiled, new: &Compiled) -> ReachDiff {
    let n = old.nodes.len().min(new.nodes.len());
    let srcs = joint(&old.src.class[..n], &new.src.class[..n]);
    let dsts = joint(&old.dst.class[..n], &new.dst.class[..n]);
    let mut entries = Vec::new();
    for ((os, ns), a) in &srcs {
        for ((od, nd), b) in &dsts {
            let (before, _) = old.class_access(*os, *od);
            let (after, _) = new.class_access(*ns, *nd);
            if before == after {
                continue;
            }
            let both = a.iter().filter(|x| b.binary_search(x).is_ok()).count();
            let pairs = a.len() * b.len() - both;
            if pairs == 0 {
                continue;
            }
            let name = |i: &usize| new.nodes[*i].name.clone();
            entries.push(DiffEntry {
                srcs: a.iter().map(name).collect(),
                dsts: b.iter().map(name).collect(),
                pairs,
                gained: after.minus(&before),
                lost: before.minus(&after),
            });
        }
    }
    // Lines with the same sources and the same change become one.
    let mut merged: Vec<DiffEntry> = Vec::new();
    let mut at: HashMap<(Vec<String>, Access, Access), usize> = HashMap::new();
    for e in entries {
        let key = (e.srcs.clone(), e.gained.clone(), e.lost.clone());
        match at.get(&key) {
            Some(&i) => {
                merged[i].dsts.extend(e.dsts);
                merged[i].pairs += e.pairs;
            }
            None => {
                at.insert(key, merged.len());
                merged.push(e);
            }
        }
    }
    ReachDiff { entries: merged }
}
