//! Finding where a key sits in YAML text, for errors found after parsing.

use std::path::Path;

/// `file:line:col` or just `file`.
pub(super) fn fmt_location(path: &Path, at: Option<(usize, usize)>) -> String {
    match at {
        Some((line, col)) => format!("{}:{line}:{col}", path.display()),
        None => path.display().to_string(),
    }
}

/// The 1-based line and column of a dotted key (`["tls", "ca_file"]`) in block-style YAML,
/// when it can be found by indentation. Flow style (`{...}`) is not searched.
pub(super) fn key(text: &str, keys: &[&str]) -> Option<(usize, usize)> {
    let mut want = keys.iter();
    let mut current = want.next()?;
    let mut parent_indent: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        if parent_indent.is_some_and(|p| indent <= p) {
            // left the parent's block without finding the child
            return None;
        }
        let is_key = trimmed
            .strip_prefix(*current)
            .is_some_and(|rest| rest.trim_start().starts_with(':'));
        if is_key {
            match want.next() {
                Some(next) => {
                    current = next;
                    parent_indent = Some(indent);
                }
                None => return Some((n + 1, indent + 1)),
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nested_keys() {
        let text = "api_url: x\n# c\ntls:\n  # c\n  ca_file: y\nregistration:\n  project_id: z\n";
        assert_eq!(key(text, &["api_url"]), Some((1, 1)));
        assert_eq!(key(text, &["tls", "ca_file"]), Some((5, 3)));
        assert_eq!(key(text, &["registration", "project_id"]), Some((7, 3)));
        assert_eq!(key(text, &["tls", "project_id"]), None);
        assert_eq!(key(text, &["nope"]), None);
    }
}
