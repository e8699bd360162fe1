//! Checks of the groups a document defines and names: every `group:NAME` exists, no group
//! contains itself, and nesting stays within [`MAX_GROUP_DEPTH`].

use crate::error::{Collector, ErrorKind, PolicyError};
use crate::limits::MAX_GROUP_DEPTH;
use crate::model::Policy;
use crate::selector::Atom;

/// The groups a group's members name directly, by index.
fn refs(policy: &Policy, g: usize) -> Vec<usize> {
    policy.groups[g]
        .members
        .iter()
        .flat_map(|s| s.terms())
        .filter_map(|t| match &t.atom {
            Atom::Group(name) => policy.group_index.get(name).copied(),
            _ => None,
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Mark {
    New,
    Open,
    Done(usize),
}

/// Depth of group `g` (1 for a group naming no group); `Err(path)` on a cycle.
fn depth(
    policy: &Policy,
    g: usize,
    marks: &mut [Mark],
    path: &mut Vec<usize>,
) -> Result<usize, Vec<usize>> {
    match marks[g] {
        Mark::Done(d) => return Ok(d),
        Mark::Open => {
            let start = path.iter().position(|&x| x == g).unwrap_or(0);
            let mut cycle = path[start..].to_vec();
            cycle.push(g);
            return Err(cycle);
        }
        Mark::New => {}
    }
    marks[g] = Mark::Open;
    path.push(g);
    let mut d = 1;
    for r in refs(policy, g) {
        d = d.max(1 + depth(policy, r, marks, path)?);
    }
    path.pop();
    marks[g] = Mark::Done(d);
    Ok(d)
}

pub(crate) fn check(policy: &Policy, errs: &mut Collector) {
    let mut names: Vec<&str> = policy.groups.iter().map(|g| g.name.as_str()).collect();
    names.sort_unstable();
    let known = if names.is_empty() {
        "none are defined".to_string()
    } else {
        format!("defined: {}", names.join(", "))
    };
    for (sel, holder) in policy.selectors() {
        for t in sel.terms() {
            if let Atom::Group(name) = &t.atom
                && policy.group(name).is_none()
            {
                errs.push(PolicyError::new(
                    ErrorKind::Invalid,
                    sel.term_at(t),
                    format!(
                        "{holder}: unknown group `{name}`: define it under `groups:` or fix the name ({known})"
                    ),
                ));
            }
        }
    }
    let mut marks = vec![Mark::New; policy.groups.len()];
    for g in 0..policy.groups.len() {
        let mut path = Vec::new();
        match depth(policy, g, &mut marks, &mut path) {
            Ok(d) if d > MAX_GROUP_DEPTH => {
                errs.push(PolicyError::new(
                    ErrorKind::Limit,
                    policy.groups[g].at,
                    format!(
                        "group `{}` nests groups {d} deep, the limit is {MAX_GROUP_DEPTH}: name the members directly",
                        policy.groups[g].name
                    ),
                ));
            }
            Ok(_) => {}
            Err(cycle) => {
                let shown: Vec<String> = cycle
                    .iter()
                    .map(|&i| format!("group:{}", policy.groups[i].name))
                    .collect();
                let first = cycle.first().copied().unwrap_or(g);
                errs.push(PolicyError::new(
                    ErrorKind::Invalid,
                    policy.groups[first].at,
                    format!(
                        "group `{}` contains itself ({}): remove one of these references",
                        policy.groups[first].name,
                        shown.join(" -> ")
                    ),
                ));
                // Close everything this walk opened so the cycle is reported once.
                for m in marks.iter_mut() {
                    if *m == Mark::Open {
                        *m = Mark::Done(0);
                    }
                }
            }
        }
    }
}
