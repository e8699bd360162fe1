//! Tags on nodes and bootstrap tokens (issue 25): the names access policy rules select with
//! `tag:NAME`. Pure: the syntax, the limit, and the stored form.
//!
//! A tag is written with or without the `tag:` prefix and stored without it; its name follows
//! the policy crate's rule (1 to 64 of `A-Z a-z 0-9 - _ .`, case-sensitive). A node or a token
//! carries at most [`MAX_TAGS`] tags. The stored form is the sorted, deduplicated names joined
//! by single spaces (`""` = none), one TEXT column on `nodes` and on `bootstrap_tokens`.

/// The most tags one node or one bootstrap token may carry: a policy names nodes by a few
/// roles; more is a sign of tags used as labels, which belong elsewhere.
pub(crate) const MAX_TAGS: usize = 32;

/// Why a tag list was refused (the API answers it as `400 invalid_request`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagError {
    #[error("tag {tag:?}: {message}")]
    Name { tag: String, message: String },
    #[error("{count} tags given; a node or token carries at most {MAX_TAGS}")]
    TooMany { count: usize },
}

/// The names of `input` (each with or without `tag:`), checked, sorted and deduplicated.
pub fn normalize<S: AsRef<str>>(input: &[S]) -> Result<Vec<String>, TagError> {
    let mut out = Vec::with_capacity(input.len());
    for raw in input {
        let raw = raw.as_ref();
        let name = raw.strip_prefix("tag:").unwrap_or(raw);
        plexsphere_policy::selector::check_name(name, "tag", 0).map_err(|e| TagError::Name {
            tag: raw.to_owned(),
            message: e.message,
        })?;
        out.push(name.to_owned());
    }
    out.sort();
    out.dedup();
    if out.len() > MAX_TAGS {
        return Err(TagError::TooMany { count: out.len() });
    }
    Ok(out)
}

/// The stored form of checked names.
pub(crate) fn join(tags: &[String]) -> String {
    tags.join(" ")
}

/// The names of a stored value (`""` = none). Whatever the column holds is split as stored;
/// a value that no longer passes [`normalize`] (a rule made stricter later) still reads.
pub(crate) fn split(stored: &str) -> Vec<String> {
    stored.split_whitespace().map(str::to_owned).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexsphere_policy::limits::MAX_NAME_LEN;

    #[test]
    fn tags_are_checked_stripped_sorted_and_deduplicated() {
        let got = normalize(&["tag:web", "db", "web", "ci.runner-2_x"]).unwrap();
        assert_eq!(got, vec!["ci.runner-2_x", "db", "web"]);
        assert_eq!(split(&join(&got)), got);
        assert_eq!(split(""), Vec::<String>::new());
        assert_eq!(normalize::<&str>(&[]).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn bad_names_and_too_many_tags_are_refused() {
        for bad in ["", "tag:", "a b", "tag:x/y", "ümlaut", "project:x"] {
            let err = normalize(&[bad]).unwrap_err();
            assert!(matches!(err, TagError::Name { .. }), "{bad:?}: {err}");
        }
        let long = "a".repeat(MAX_NAME_LEN + 1);
        assert!(normalize(&[long.as_str()]).is_err());
        assert!(normalize(&["a".repeat(MAX_NAME_LEN)]).is_ok());
        let many: Vec<String> = (0..=MAX_TAGS).map(|i| format!("t{i}")).collect();
        assert_eq!(
            normalize(&many).unwrap_err(),
            TagError::TooMany {
                count: MAX_TAGS + 1
            }
        );
        assert!(normalize(&many[..MAX_TAGS]).is_ok());
        // Duplicates count once.
        let dup: Vec<&str> = std::iter::repeat_n("web", MAX_TAGS + 5).collect();
        assert_eq!(normalize(&dup).unwrap(), vec!["web"]);
    }
}
