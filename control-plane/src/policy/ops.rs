//! Changing a Domain's access policy and a node's tags (issue 25), one transaction each.
//!
//! A change is validated against the Domain as it is in the same transaction (its Projects,
//! live nodes, tags, the tags of usable tokens): the document must parse, name only what the
//! Domain knows and pass its own tests, or nothing is stored and the policy in force stays
//! ([`Error::PolicyInvalid`]). An accepted change stores the next version (only if the
//! Domain's version is still the one the writer read: otherwise `409 conflict`, "policy
//! changed meanwhile") and appends ONE Domain `resync` event (no target, the nil subject:
//! every node of the Domain pulls its new signed state); the bus is told after the commit.
//! A tag change does the same (tags change who reaches whom). A dry run does everything but
//! store.

use plexsphere_policy::compile::Compiled;
use plexsphere_policy::inventory::Inventory;
use plexsphere_policy::model::Policy;
use plexsphere_policy::{PolicyErrors, reach_diff};
use plexsphere_wire::node::EventKind;
use plexsphere_wire::policy_admin::PolicyChange;
use uuid::Uuid;

use crate::bus::EventBus;
use crate::error::Error;
use crate::store::nodes::NodeRow;
use crate::store::policies::{self, Inserted, NewVersion};
use crate::store::{self, Store, StoreError, events, nodes};

/// The most diff lines an answer lists (then one line "... and N more lines"); a diff
/// groups node pairs a policy treats alike, so real changes stay far below.
pub(crate) const MAX_DIFF_LINES: usize = 1_000;
/// The most diff lines stored as a version's summary (`policy history`).
pub(crate) const MAX_SUMMARY_LINES: usize = 100;
/// The largest JSON body of `PUT .../policy` and `POST .../policy/validate` (2 MiB): a
/// document at the policy crate's limit (1 MiB) with room for JSON escaping (a newline or a
/// quote costs two bytes). A larger body is `413 body_too_large`; a document over 1 MiB in a
/// smaller body is `422 policy_invalid` (kind `limit`). Every other route keeps 256 KiB
/// (`server::MAX_BUFFERED_BODY`).
pub const POLICY_BODY_LIMIT: usize = 2 * plexsphere_policy::limits::MAX_DOCUMENT_BYTES;

/// The reason a policy change's resync event gives.
pub(crate) fn policy_resync_reason(version: u64) -> String {
    format!("policy version {version}")
}

/// The reason a tag change's resync event gives.
pub(crate) fn tags_resync_reason(node: Uuid) -> String {
    format!("the tags of node {node} changed")
}

/// The answer to a writer that read an older version.
pub(crate) fn conflict(current: u64) -> Error {
    Error::Conflict(format!(
        "policy changed meanwhile (now version {current}); re-run"
    ))
}

/// Validates `new` against `inv` and answers the reachability diff from `old` (pure). A
/// stored document that no longer parses (none should) is diffed as deny-all.
pub(crate) fn plan(old: &str, new: &str, inv: &Inventory) -> Result<Vec<String>, PolicyErrors> {
    let new_policy = plexsphere_policy::validate(new, inv)?;
    let old_policy = plexsphere_policy::parse(old)
        .unwrap_or_else(|_| Policy::new(Vec::new(), Vec::new(), Vec::new()));
    let diff = reach_diff(
        &Compiled::new(&old_policy, inv),
        &Compiled::new(&new_policy, inv),
    );
    Ok(capped(
        diff.entries.iter().map(ToString::to_string).collect(),
        MAX_DIFF_LINES,
    ))
}

/// At most `max` lines, the last saying how many were left out.
fn capped(mut lines: Vec<String>, max: usize) -> Vec<String> {
    if lines.len() > max {
        let more = lines.len() - (max - 1);
        lines.truncate(max - 1);
        lines.push(format!("... and {more} more lines"));
    }
    lines
}

/// A version's summary: its diff lines (at most [`MAX_SUMMARY_LINES`]), or what it was.
pub(crate) fn summary(note: Option<&str>, diff: &[String]) -> String {
    let body = if diff.is_empty() {
        "no node pair gains or loses anything".to_owned()
    } else {
        capped(diff.to_vec(), MAX_SUMMARY_LINES).join("\n")
    };
    match note {
        Some(n) => format!("{n}\n{body}"),
        None => body,
    }
}

/// A policy change to make (or, with `dry_run`, only to check).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChangeRequest<'a> {
    pub domain_id: Uuid,
    pub document: &'a str,
    pub expected_version: u64,
    pub dry_run: bool,
    pub author: &'a str,
    /// Put before the diff in the stored summary ("rollback to version 3").
    pub note: Option<&'a str>,
    pub now: i64,
}

/// The policy and tag operations over one store and bus.
pub(crate) struct PolicyOps<'a> {
    pub store: &'a Store,
    pub bus: &'a dyn EventBus,
}

impl PolicyOps<'_> {
    /// Validates and (unless a dry run) stores a new version; see the module doc.
    pub(crate) async fn change(&self, req: ChangeRequest<'_>) -> Result<PolicyChange, Error> {
        let done = store::retry("policy change", Error::is_lost_race, || {
            self.change_attempt(req)
        })
        .await;
        let (change, seq) = match done {
            // Another writer stored the same version between our check and our insert.
            Err(Error::Store(e)) if e.is_unique_violation() => {
                let mut c = self.store.acquire().await?;
                let now = policies::current_or_default(&mut c, req.domain_id).await?;
                return Err(conflict(now.version));
            }
            other => other?,
        };
        if let Some(seq) = seq {
            tracing::info!(domain_id = %req.domain_id, version = change.version, author = req.author, seq, "access policy changed; every node of the Domain pulls its new state");
            self.bus.notify(req.domain_id, seq);
        }
        Ok(change)
    }

    async fn change_attempt(
        &self,
        req: ChangeRequest<'_>,
    ) -> Result<(PolicyChange, Option<u64>), Error> {
        let mut tx = self.store.begin().await?;
        let current = policies::current_or_default(&mut tx, req.domain_id).await?;
        if current.version != req.expected_version {
            return Err(conflict(current.version));
        }
        let inv = policies::inventory(&mut tx, req.domain_id, req.now).await?;
        let diff = plan(&current.document, req.document, &inv).map_err(Error::PolicyInvalid)?;
        let mut change = PolicyChange {
            applied: false,
            previous_version: current.version,
            version: current.version.saturating_add(1),
            diff,
        };
        if req.dry_run {
            return Ok((change, None));
        }
        let new = NewVersion {
            document: req.document,
            author: req.author,
            summary: &summary(req.note, &change.diff),
            now: req.now,
        };
        let row = match policies::insert(&mut tx, req.domain_id, current.version, new).await? {
            Inserted::Stored(row) => row,
            Inserted::Conflict { current } => return Err(conflict(current)),
        };
        let resync = EventKind::Resync {
            reason: policy_resync_reason(row.version),
        };
        let seq =
            events::append(&mut tx, req.domain_id, None, Uuid::nil(), &resync, req.now).await?;
        tx.commit().await.map_err(StoreError::from)?;
        change.applied = true;
        change.version = row.version;
        Ok((change, Some(seq)))
    }

    /// Replaces a live node's tags (checked names). Answers the node as it is now, `None`
    /// when there is no live node with that id. An unchanged set stores and emits nothing.
    pub async fn set_tags(
        &self,
        node_id: Uuid,
        tags: &[String],
        now: i64,
    ) -> Result<Option<NodeRow>, Error> {
        let done = store::retry("set node tags", Error::is_lost_race, || {
            self.tags_attempt(node_id, tags, now)
        })
        .await?;
        let Some((node, seq)) = done else {
            return Ok(None);
        };
        if let Some(seq) = seq {
            tracing::info!(node_id = %node.id, tags = ?node.tags, seq, "node tags changed; every node of the Domain pulls its new state");
            self.bus.notify(node.domain_id, seq);
        }
        Ok(Some(node))
    }

    async fn tags_attempt(
        &self,
        node_id: Uuid,
        tags: &[String],
        now: i64,
    ) -> Result<Option<(NodeRow, Option<u64>)>, Error> {
        let mut tx = self.store.begin().await?;
        let Some(before) = nodes::get(&mut tx, node_id).await? else {
            return Ok(None);
        };
        if before.revoked_at.is_some() {
            return Ok(None);
        }
        if before.tags == tags {
            return Ok(Some((before, None)));
        }
        if !nodes::set_tags(&mut tx, node_id, tags).await? {
            return Ok(None);
        }
        let resync = EventKind::Resync {
            reason: tags_resync_reason(node_id),
        };
        let seq =
            events::append(&mut tx, before.domain_id, None, Uuid::nil(), &resync, now).await?;
        tx.commit().await.map_err(StoreError::from)?;
        let node = NodeRow {
            tags: tags.to_vec(),
            ..before
        };
        Ok(Some((node, Some(seq))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexsphere_policy::inventory::{NodeInfo, ProjectInfo};

    fn inv() -> Inventory {
        let p = Uuid::from_u128(1);
        let node = |n: u128, name: &str, tag: &str| NodeInfo {
            id: Uuid::from_u128(n),
            name: name.into(),
            project_id: p,
            project_slug: "lab".into(),
            tags: vec![tag.into()],
            ipv4: Some(std::net::Ipv4Addr::new(10, 0, 0, u8::try_from(n).unwrap())),
            ipv6: None,
        };
        Inventory {
            projects: vec![ProjectInfo {
                id: p,
                slug: "lab".into(),
            }],
            nodes: vec![node(10, "web", "web"), node(11, "db", "db")],
            tags: Vec::new(),
        }
    }

    #[test]
    fn a_plan_is_the_diff_or_the_documents_problems() {
        let old = plexsphere_policy::DEFAULT_DOCUMENT;
        let new = "rules:\n  - {src: tag:web, dst: tag:db, proto: tcp, ports: 5432}\n";
        let diff = plan(old, new, &inv()).unwrap();
        assert!(!diff.is_empty());
        assert!(diff.iter().any(|l| l.contains("db -> web")), "{diff:?}");
        assert_eq!(plan(old, old, &inv()).unwrap(), Vec::<String>::new());
        let bad = "rules:\n  - {src: tag:nope, dst: '*'}\n";
        let errs = plan(old, bad, &inv()).unwrap_err();
        assert_eq!(errs.0[0].location.line, 2, "{errs}");
        // A stored document that no longer parses is diffed as deny-all.
        assert!(!plan("{", new, &inv()).unwrap().is_empty());
    }

    #[test]
    fn only_the_policy_document_routes_take_large_bodies() {
        use crate::server::{MAX_BUFFERED_BODY, buffered_body_limit};
        for p in ["/v1/domains/lab/policy", "/v1/domains/lab/policy/validate"] {
            assert_eq!(buffered_body_limit(p), POLICY_BODY_LIMIT, "{p}");
        }
        for p in [
            "/v1/domains/lab/policy/rollback",
            "/v1/domains//policy",
            "/v1/domains/lab/signing-keys",
            "/v1/register",
            "/v1/domains/lab/policyx",
        ] {
            assert_eq!(buffered_body_limit(p), MAX_BUFFERED_BODY, "{p}");
        }
        const { assert!(POLICY_BODY_LIMIT > plexsphere_policy::limits::MAX_DOCUMENT_BYTES) };
    }

    #[test]
    fn long_diffs_are_capped_and_say_so() {
        let lines: Vec<String> = (0..10).map(|i| i.to_string()).collect();
        let c = capped(lines.clone(), 4);
        assert_eq!(c, vec!["0", "1", "2", "... and 7 more lines"]);
        assert_eq!(capped(lines.clone(), 10), lines);
        assert_eq!(
            summary(Some("rollback to version 1"), &[]),
            "rollback to version 1\nno node pair gains or loses anything"
        );
    }
}
