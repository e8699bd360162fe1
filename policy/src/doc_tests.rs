//! Runs the tests written inside a document, with the plain evaluator, over the Domain's
//! nodes: every node of `src` opening the test's packet to every other node of `dst` must
//! get `expect`. A side that matches no node yet, and names one tag or one Project, is
//! tried with a stand-in node that has just that tag (or Project), so a document can be
//! tested before its nodes exist (`plexctl policy test` offline).

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use crate::error::{Collector, ErrorKind, PolicyError, PolicyErrors};
use crate::eval;
use crate::inventory::{Inventory, NodeInfo};
use crate::model::{Expect, Policy, PolicyTest};
use crate::selector::{Atom, NameOrId, Selector};

/// A stand-in node for a side that matches no node, when the side is one tag or Project.
fn stand_in(inv: &Inventory, sel: &Selector, n: u128) -> Option<NodeInfo> {
    let mut node = NodeInfo {
        id: Uuid::from_u128(u128::MAX - n),
        name: format!("(a node in {sel} only)"),
        project_id: Uuid::nil(),
        project_slug: String::new(),
        tags: Vec::new(),
        ipv4: None,
        ipv6: None,
    };
    match sel.single()? {
        Atom::Tag(t) => node.tags.push(t.clone()),
        Atom::Project(p) => {
            let found = inv.projects.iter().find(|x| match p {
                NameOrId::Name(s) => &x.slug == s,
                NameOrId::Id(id) => &x.id == id,
            })?;
            node.project_id = found.id;
            node.project_slug = found.slug.clone();
        }
        _ => return None,
    }
    Some(node)
}

fn side(policy: &Policy, inv: &Inventory, sel: &Selector, n: u128) -> Vec<NodeInfo> {
    let real: Vec<NodeInfo> = inv
        .nodes
        .iter()
        .filter(|node| eval::selects(policy, sel, node))
        .cloned()
        .collect();
    if real.is_empty() {
        stand_in(inv, sel, n).into_iter().collect()
    } else {
        real
    }
}

/// Nodes grouped by which of `rules` (indexes) select them on one side.
fn classes(
    policy: &Policy,
    nodes: &[NodeInfo],
    rules: &[usize],
    src: bool,
) -> Vec<(Vec<bool>, Vec<usize>)> {
    let mut map: HashMap<Vec<bool>, Vec<usize>> = HashMap::new();
    for (i, node) in nodes.iter().enumerate() {
        let bits = rules
            .iter()
            .map(|&r| {
                let rule = &policy.rules[r];
                eval::selects_any(policy, if src { &rule.src } else { &rule.dst }, node)
            })
            .collect();
        map.entry(bits).or_default().push(i);
    }
    let mut v: Vec<_> = map.into_iter().collect();
    v.sort_by_key(|(_, members)| members[0]);
    v
}

fn run_one(
    policy: &Policy,
    inv: &Inventory,
    t: &PolicyTest,
    index: usize,
) -> Result<(), PolicyError> {
    let srcs = side(policy, inv, &t.src, 1);
    let dsts = side(policy, inv, &t.dst, 2);
    let label = t.label(index);
    if srcs.is_empty() || dsts.is_empty() {
        let which = if srcs.is_empty() { &t.src } else { &t.dst };
        return Err(PolicyError::new(
            ErrorKind::TestFailed,
            t.at,
            format!(
                "{label}: `{which}` matches no node of the Domain; a test must talk about at least one node (one tag or one project is tried with a stand-in node)"
            ),
        ));
    }
    let rules: Vec<usize> = (0..policy.rules.len())
        .filter(|&r| policy.rules[r].covers(t.proto, t.port))
        .collect();
    let sc = classes(policy, &srcs, &rules, true);
    let dc = classes(policy, &dsts, &rules, false);
    let mut first: Option<(usize, usize, Option<usize>)> = None;
    let mut failing = 0usize;
    let mut pairs = 0usize;
    for (sbits, smembers) in &sc {
        for (dbits, dmembers) in &dc {
            let rule = (0..rules.len())
                .find(|&k| sbits[k] && dbits[k])
                .map(|k| rules[k]);
            let got = if rule.is_some() {
                Expect::Accept
            } else {
                Expect::Deny
            };
            // Pairs other than a node to itself, counted without walking them all.
            let dids: HashSet<Uuid> = dmembers.iter().map(|&d| dsts[d].id).collect();
            let both = smembers
                .iter()
                .filter(|&&s| dids.contains(&srcs[s].id))
                .count();
            let n = smembers.len() * dmembers.len() - both;
            pairs += n;
            if got != t.expect && n > 0 {
                failing += n;
                if first.is_none() {
                    first = smembers
                        .iter()
                        .find_map(|&s| {
                            let d = dmembers.iter().find(|&&d| dsts[d].id != srcs[s].id)?;
                            Some((s, *d))
                        })
                        .map(|(s, d)| (s, d, rule));
                }
            }
        }
    }
    if pairs == 0 {
        return Err(PolicyError::new(
            ErrorKind::TestFailed,
            t.at,
            format!(
                "{label}: `{}` and `{}` are the same single node; a test is about traffic between two nodes",
                t.src, t.dst
            ),
        ));
    }
    let Some((s, d, rule)) = first else {
        return Ok(());
    };
    let (a, b) = (&srcs[s].name, &dsts[d].name);
    let what = t.what();
    let why = match rule {
        Some(r) => format!("but {} allows it", policy.rules[r]),
        None => format!(
            "but no rule allows it; a rule that would: {{src: '{}', dst: '{}', proto: {}{}}}",
            t.src,
            t.dst,
            t.proto,
            if t.proto.has_ports() {
                format!(", ports: {}", t.port)
            } else {
                String::new()
            }
        ),
    };
    let more = if failing > 1 {
        format!(" ({failing} node pairs fail)")
    } else {
        String::new()
    };
    Err(PolicyError::new(
        ErrorKind::TestFailed,
        t.at,
        format!(
            "{label} failed: expected {} for {a} -> {b} {what}, {why}{more}",
            t.expect
        ),
    ))
}

/// Runs every test of the document; the errors name each failing test, the pair, what the
/// policy decided and the rule line.
pub fn run_tests(policy: &Policy, inv: &Inventory) -> Result<(), PolicyErrors> {
    let mut errs = Collector::default();
    for (i, t) in policy.tests.iter().enumerate() {
        if let Err(e) = run_one(policy, inv, t, i) {
            errs.push(e);
        }
    }
    errs.finish(())
}

/// Parses a document, checks its names against the Domain and runs its tests: what
/// `policy set` and `policy test` call.
pub fn validate(text: &str, inv: &Inventory) -> Result<Policy, PolicyErrors> {
    let policy = crate::document::parse(text)?;
    crate::check::check_names(&policy, inv)?;
    run_tests(&policy, inv)?;
    Ok(policy)
}
