//! Checks a parsed document against the Domain: every Project, node and tag it names
//! exists (a tag may also be declared under `tags:`, for nodes still to come).

use std::collections::HashSet;

use crate::error::{Collector, ErrorKind, PolicyError, PolicyErrors};
use crate::inventory::Inventory;
use crate::model::Policy;
use crate::selector::{Atom, NameOrId};

/// Up to ten names, sorted, for "known: ..." hints.
fn some(mut names: Vec<String>) -> String {
    names.sort_unstable();
    names.dedup();
    let more = names.len().saturating_sub(10);
    names.truncate(10);
    let mut s = names.join(", ");
    if more > 0 {
        s.push_str(&format!(" and {more} more"));
    }
    if s.is_empty() {
        s.push_str("none");
    }
    s
}

pub fn check_names(policy: &Policy, inv: &Inventory) -> Result<(), PolicyErrors> {
    let mut errs = Collector::default();
    let mut known_tags: HashSet<&str> = policy.tags.iter().map(String::as_str).collect();
    known_tags.extend(inv.tags.iter().map(String::as_str));
    known_tags.extend(
        inv.nodes
            .iter()
            .flat_map(|n| n.tags.iter().map(String::as_str)),
    );
    for (sel, holder) in policy.selectors() {
        for t in sel.terms() {
            let problem = match &t.atom {
                Atom::Tag(tag) if !known_tags.contains(tag.as_str()) => Some((
                    ErrorKind::Unknown,
                    format!(
                        "{holder}: unknown tag `{tag}`: no node carries it and the document does not declare it; fix the spelling or declare it under `tags:` (known: {})",
                        some(known_tags.iter().map(|s| s.to_string()).collect())
                    ),
                )),
                Atom::Project(p)
                    if !inv.projects.iter().any(|x| match p {
                        NameOrId::Name(s) => &x.slug == s,
                        NameOrId::Id(id) => &x.id == id,
                    }) =>
                {
                    Some((
                        ErrorKind::Unknown,
                        format!(
                            "{holder}: unknown project `{p}`: the Domain has no Project with that slug or id ({})",
                            some(inv.projects.iter().map(|x| x.slug.clone()).collect())
                        ),
                    ))
                }
                Atom::Node(n)
                    if !inv.nodes.iter().any(|x| match n {
                        NameOrId::Name(s) => &x.name == s,
                        NameOrId::Id(id) => &x.id == id,
                    }) =>
                {
                    Some((
                        ErrorKind::Unknown,
                        format!(
                            "{holder}: unknown node `{n}`: no node of the Domain has that name or id; name it by a tag if it is still to come (`plexctl node list` shows the names)"
                        ),
                    ))
                }
                _ => None,
            };
            if let Some((kind, message)) = problem {
                errs.push(PolicyError::new(kind, sel.term_at(t), message));
            }
        }
    }
    errs.finish(())
}
