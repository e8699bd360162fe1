//! Tags (`node tag`, `node untag`, `bootstrap-token issue --tag`): access policy rules select
//! nodes by them (docs/policy.md). Checked here before anything is sent; the server checks
//! again.

use plexsphere_wire::admin::NodeView;
use plexsphere_wire::policy_admin::SetTagsRequest;

use crate::config::Settings;
use crate::failure::Failure;
use crate::names::node_id;
use crate::session::operator_api;

/// The most tags a node or a token carries (the server's `tags::MAX_TAGS`).
pub const MAX_TAGS: usize = 32;

/// `--tag` values checked before anything is sent (the server checks again): the policy
/// crate's name rule, `tag:` optional, at most [`MAX_TAGS`].
pub fn checked_tags(tags: &[String]) -> Result<Vec<String>, Failure> {
    let mut out: Vec<String> = Vec::with_capacity(tags.len());
    for t in tags {
        let name = t.strip_prefix("tag:").unwrap_or(t);
        plexsphere_policy::selector::check_name(name, "tag", 0)
            .map_err(|e| Failure::Usage(format!("tag `{t}`: {}", e.message)))?;
        if !out.iter().any(|o| o == name) {
            out.push(name.to_owned());
        }
    }
    if out.len() > MAX_TAGS {
        return Err(Failure::Usage(format!(
            "{} tags given; a node or token carries at most {MAX_TAGS}",
            out.len()
        )));
    }
    Ok(out)
}

/// What `node tag` / `node untag` do to a node's tags.
#[derive(Debug, Clone, Copy)]
pub enum TagChange<'a> {
    Add(&'a [String]),
    Remove(&'a [String]),
    Clear,
}

/// The node's tags after `change` (pure).
pub fn changed_tags(now: &[String], change: TagChange<'_>) -> Result<Vec<String>, Failure> {
    Ok(match change {
        TagChange::Add(add) => {
            let mut all = now.to_vec();
            all.extend(checked_tags(add)?);
            checked_tags(&all)?
        }
        TagChange::Remove(remove) => {
            let remove = checked_tags(remove)?;
            now.iter()
                .filter(|t| !remove.contains(t))
                .cloned()
                .collect()
        }
        TagChange::Clear => Vec::new(),
    })
}

/// Reads the node's tags, changes them and writes the whole set back.
pub async fn tag_node(
    settings: &Settings,
    id: &str,
    change: TagChange<'_>,
) -> Result<NodeView, Failure> {
    let api = &operator_api(settings)?;
    let id = node_id(api, id).await?.to_string();
    let node: NodeView = api.get(&["v1", "nodes", &id], &[]).await?;
    let body = SetTagsRequest {
        tags: changed_tags(&node.tags, change)?,
    };
    Ok(api.put(&["v1", "nodes", &id, "tags"], &body).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_checked_and_changed_as_sets() {
        let now = vec!["db".to_owned(), "web".to_owned()];
        let s = |v: &[&str]| v.iter().map(|t| (*t).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            changed_tags(&now, TagChange::Add(&s(&["tag:ci", "web"]))).unwrap(),
            s(&["db", "web", "ci"])
        );
        assert_eq!(
            changed_tags(&now, TagChange::Remove(&s(&["tag:web", "nope"]))).unwrap(),
            s(&["db"])
        );
        assert!(changed_tags(&now, TagChange::Clear).unwrap().is_empty());
        assert_eq!(checked_tags(&s(&["a b"])).unwrap_err().exit_code(), 64);
        let many: Vec<String> = (0..=MAX_TAGS).map(|i| format!("t{i}")).collect();
        assert_eq!(checked_tags(&many).unwrap_err().exit_code(), 64);
    }
}
