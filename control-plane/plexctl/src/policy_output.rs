//! How `plexctl policy ...` prints (pure, pinned by tests): the diff of a change, explain's
//! lines, the history table.

use plexsphere_wire::policy_admin::{PolicyChange, PolicyExplanation, PolicyVersionView};

use crate::output::{table, time};

/// A change or rollback: what it did (or would do), the diff indented, then `hint`.
pub fn change(c: &PolicyChange, hint: Option<&str>) -> String {
    let mut out = if c.applied {
        format!(
            "applied: policy version {} is in force (was {})\n",
            c.version, c.previous_version
        )
    } else {
        format!(
            "dry run: nothing was changed; version {} stays in force, this would be version {}\n",
            c.previous_version, c.version
        )
    };
    if c.diff.is_empty() {
        out.push_str("  no node pair gains or loses anything\n");
    }
    for line in &c.diff {
        out.push_str(&format!("  {line}\n"));
    }
    if let Some(h) = hint {
        out.push_str(h);
        out.push('\n');
    }
    out
}

/// Explain's lines as the server wrote them.
pub fn explanation(e: &PolicyExplanation) -> String {
    let mut out = String::new();
    for l in &e.lines {
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// One row per version; the summary's first line, and how many more it has.
pub fn history(items: &[PolicyVersionView]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|v| {
            let mut lines = v.summary.lines();
            let first = lines.next().unwrap_or("-").to_owned();
            let more = lines.count();
            let summary = if more == 0 {
                first
            } else {
                format!("{first} (+{more} more lines; -o json shows them)")
            };
            vec![
                v.version.to_string(),
                time(v.created_at),
                v.author.clone(),
                summary,
            ]
        })
        .collect();
    table(&["VERSION", "CREATED", "AUTHOR", "SUMMARY"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn a_change_prints_what_it_did_and_the_diff() {
        let c = PolicyChange {
            applied: false,
            previous_version: 1,
            version: 2,
            diff: vec!["web -> db: loses any".into()],
        };
        assert_eq!(
            change(&c, Some("re-run with --yes to apply it")),
            "dry run: nothing was changed; version 1 stays in force, this would be version 2\n  web -> db: loses any\nre-run with --yes to apply it\n"
        );
        let applied = PolicyChange {
            applied: true,
            diff: Vec::new(),
            ..c
        };
        assert_eq!(
            change(&applied, None),
            "applied: policy version 2 is in force (was 1)\n  no node pair gains or loses anything\n"
        );
    }

    #[test]
    fn history_shows_the_first_summary_line() {
        let v = |version, summary: &str| PolicyVersionView {
            version,
            author: "ops (0123456789abcdef)".into(),
            created_at: datetime!(2026-12-05 10:00:00 UTC),
            summary: summary.into(),
        };
        assert_eq!(
            history(&[v(2, "a -> b: gains tcp 22\nb -> a: loses icmp"), v(1, "default")]),
            "\
VERSION  CREATED               AUTHOR                  SUMMARY
2        2026-12-05T10:00:00Z  ops (0123456789abcdef)  a -> b: gains tcp 22 (+1 more lines; -o json shows them)
1        2026-12-05T10:00:00Z  ops (0123456789abcdef)  default
"
        );
    }
}
