//! Merging `plexd install`'s settings into an existing config.yaml: the operator's own keys
//! survive, a conflicting value is refused unless forced, an identical install changes nothing.

use std::path::Path;

use serde_yaml::{Mapping, Value};

use crate::config::{ApiUrl, Config, ConfigError, is_blank_yaml};

/// The values `plexd install` records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub api_url: ApiUrl,
    pub token_file: String,
    pub ca_file: Option<String>,
}

/// The merged file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// The text to write (the original text when nothing changed).
    pub text: String,
    /// The keys set or replaced, for the report.
    pub changed: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(
        "{path} already sets {key} to `{old}`, not `{new}`; edit the file, or run plexd install again with --force to replace it"
    )]
    Conflict {
        path: String,
        key: String,
        old: String,
        new: String,
    },
    #[error(transparent)]
    Existing(#[from] ConfigError),
    #[error("{path}: cannot write the merged config: {reason}")]
    Serialize { path: String, reason: String },
}

const HEADER: &str = "\
# plexd configuration (written by `plexd install`; your own keys survive a second install).
# Add the Project and a name for this node before starting plexd:
# registration:
#   project_id: <project id>
#   resource_handle: <name>
";

/// Merges `wanted` into the existing text of `path` (None or blank: a new file).
pub fn merge(
    existing: Option<&str>,
    wanted: &Wanted,
    force: bool,
    path: &Path,
) -> Result<Merged, MergeError> {
    let fresh = existing.is_none_or(is_blank_yaml);
    let mut root = if fresh {
        Mapping::new()
    } else {
        let text = existing.unwrap_or_default();
        // Refuse a file plexd could not run with, naming its line.
        Config::parse(text, path)?;
        match serde_yaml::from_str::<Value>(text) {
            Ok(Value::Mapping(m)) => m,
            _ => Mapping::new(),
        }
    };
    let p = path.display().to_string();
    let mut changed = Vec::new();

    let same_url = |old: &str| ApiUrl::parse(old).is_ok_and(|u| u == wanted.api_url);
    set(
        &mut root,
        &[],
        "api_url",
        wanted.api_url.as_str(),
        same_url,
        force,
        &p,
        &mut changed,
    )?;
    set(
        &mut root,
        &[],
        "token_file",
        &wanted.token_file,
        |o| o == wanted.token_file,
        force,
        &p,
        &mut changed,
    )?;
    if let Some(ca) = &wanted.ca_file {
        set(
            &mut root,
            &["tls"],
            "ca_file",
            ca,
            |o| o == ca,
            force,
            &p,
            &mut changed,
        )?;
    }

    if changed.is_empty() {
        return Ok(Merged {
            text: existing.unwrap_or_default().to_owned(),
            changed,
        });
    }
    let body = serde_yaml::to_string(&Value::Mapping(root)).map_err(|e| MergeError::Serialize {
        path: p.clone(),
        reason: e.to_string(),
    })?;
    let text = if fresh {
        format!("{HEADER}{body}")
    } else {
        body
    };
    // What we write must load.
    Config::parse(&text, path)?;
    Ok(Merged { text, changed })
}

#[allow(clippy::too_many_arguments)]
fn set(
    root: &mut Mapping,
    parents: &[&str],
    key: &str,
    new: &str,
    same: impl Fn(&str) -> bool,
    force: bool,
    path: &str,
    changed: &mut Vec<String>,
) -> Result<(), MergeError> {
    let mut map = root;
    for parent in parents {
        let entry = map
            .entry(Value::String((*parent).to_owned()))
            .or_insert_with(|| Value::Mapping(Mapping::new()));
        if !entry.is_mapping() {
            *entry = Value::Mapping(Mapping::new());
        }
        let Value::Mapping(m) = entry else {
            return Ok(());
        };
        map = m;
    }
    let dotted = parents
        .iter()
        .copied()
        .chain(std::iter::once(key))
        .collect::<Vec<_>>()
        .join(".");
    let k = Value::String(key.to_owned());
    match map.get(&k) {
        Some(Value::String(old)) if same(old) => return Ok(()),
        Some(old) if !force && !old.is_null() => {
            let old = match old {
                Value::String(s) => s.clone(),
                other => serde_yaml::to_string(other)
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
            };
            return Err(MergeError::Conflict {
                path: path.to_owned(),
                key: dotted,
                old,
                new: new.to_owned(),
            });
        }
        _ => {}
    }
    map.insert(k, Value::String(new.to_owned()));
    changed.push(dotted);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(url: &str) -> Wanted {
        Wanted {
            api_url: ApiUrl::parse(url).unwrap(),
            token_file: "/etc/plexd/bootstrap-token".into(),
            ca_file: None,
        }
    }

    const P: &str = "/etc/plexd/config.yaml";

    #[test]
    fn fresh_file_gets_header_and_keys() {
        let m = merge(None, &wanted("https://a.example"), false, Path::new(P)).unwrap();
        assert!(m.text.starts_with("# plexd configuration"), "{}", m.text);
        assert!(
            m.text.contains("api_url: https://a.example\n"),
            "{}",
            m.text
        );
        assert_eq!(m.changed, vec!["api_url", "token_file"]);
    }

    #[test]
    fn operator_keys_survive_and_identical_install_is_a_no_op() {
        let first = merge(None, &wanted("https://a.example"), false, Path::new(P)).unwrap();
        let edited = format!(
            "{}registration:\n  project_id: 019a0816-0000-7000-8000-000000000002\n",
            first.text
        );
        let again = merge(
            Some(&edited),
            &wanted("https://a.example/"),
            false,
            Path::new(P),
        )
        .unwrap();
        assert!(again.changed.is_empty());
        assert_eq!(again.text, edited);
        let mut w = wanted("https://a.example");
        w.ca_file = Some("/x/ca.pem".into());
        let with_ca = merge(Some(&edited), &w, false, Path::new(P)).unwrap();
        assert_eq!(with_ca.changed, vec!["tls.ca_file"]);
        assert!(
            with_ca
                .text
                .contains("project_id: 019a0816-0000-7000-8000-000000000002")
        );
        assert!(with_ca.text.contains("ca_file: /x/ca.pem"));
    }

    #[test]
    fn conflicts_are_refused_unless_forced() {
        let first = merge(None, &wanted("https://a.example"), false, Path::new(P)).unwrap();
        let e = merge(
            Some(&first.text),
            &wanted("https://b.example"),
            false,
            Path::new(P),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("api_url")
                && e.contains("`https://a.example`")
                && e.contains("`https://b.example`")
                && e.contains("--force"),
            "{e}"
        );
        let forced = merge(
            Some(&first.text),
            &wanted("https://b.example"),
            true,
            Path::new(P),
        )
        .unwrap();
        assert_eq!(forced.changed, vec!["api_url"]);
        assert!(forced.text.contains("https://b.example"));
    }

    #[test]
    fn a_broken_existing_file_is_refused_with_its_line() {
        let e = merge(
            Some("api_url: https://a\nbogus: 1\n"),
            &wanted("https://a"),
            true,
            Path::new(P),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("/etc/plexd/config.yaml:2:1:"), "{e}");
    }

    #[test]
    fn http_is_refused_unless_the_file_allows_it() {
        let e = merge(None, &wanted("http://a.example"), false, Path::new(P))
            .unwrap_err()
            .to_string();
        assert!(e.contains("allow_insecure_http"), "{e}");
        let ok = merge(
            Some("allow_insecure_http: true\n"),
            &wanted("http://a.example"),
            false,
            Path::new(P),
        );
        assert!(ok.is_ok());
    }
}
