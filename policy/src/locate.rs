//! Where things are in the document's text. serde_yaml locates its own errors but gives no
//! positions for values it parsed, so this scans the lines: the top-level sections, the
//! block-style items of `rules:` and `tests:`, the keys of `groups:`, and a string searched
//! forward from a place. Flow-style collections (`rules: [{...}]`) get the line of their
//! section; every error still names the rule or test by number.

use crate::error::Location;

pub(crate) struct Locator<'a> {
    lines: Vec<&'a str>,
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn blank(line: &str) -> bool {
    let t = line.trim();
    t.is_empty() || t.starts_with('#')
}

fn is_item(trimmed: &str) -> bool {
    trimmed == "-" || trimmed.starts_with("- ")
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl<'a> Locator<'a> {
    pub fn new(text: &'a str) -> Self {
        Self {
            lines: text.lines().collect(),
        }
    }

    /// The 0-based line index of `key:` at the top level and the end (exclusive) of its body.
    fn section(&self, key: &str) -> Option<(usize, usize)> {
        let start = self.lines.iter().position(|l| {
            indent(l) == 0
                && l.strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })?;
        let end = self.lines[start + 1..]
            .iter()
            .position(|l| !blank(l) && indent(l) == 0 && !is_item(l.trim_start()))
            .map_or(self.lines.len(), |p| start + 1 + p);
        Some((start, end))
    }

    /// The line of the section `key:` itself (1-based), or line 1.
    pub fn section_line(&self, key: &str) -> u32 {
        self.section(key).map_or(1, |(s, _)| to_u32(s + 1))
    }

    /// The 1-based line after the section `key:` ends.
    pub fn section_end(&self, key: &str) -> u32 {
        self.section(key)
            .map_or(to_u32(self.lines.len() + 1), |(_, e)| to_u32(e + 1))
    }

    /// The 1-based first line of each block-style item of the sequence under `key:`, when
    /// there are exactly `expected` of them; otherwise (flow style) the section's line for
    /// each.
    pub fn items(&self, key: &str, expected: usize) -> Vec<u32> {
        let fallback = vec![self.section_line(key); expected];
        let Some((start, end)) = self.section(key) else {
            return fallback;
        };
        let body = &self.lines[start + 1..end];
        let Some(min) = body
            .iter()
            .filter(|l| is_item(l.trim_start()))
            .map(|l| indent(l))
            .min()
        else {
            return fallback;
        };
        let found: Vec<u32> = body
            .iter()
            .enumerate()
            .filter(|(_, l)| indent(l) == min && is_item(l.trim_start()))
            .map(|(i, _)| to_u32(start + 2 + i))
            .collect();
        if found.len() == expected {
            found
        } else {
            fallback
        }
    }

    /// The 1-based line of each key of the mapping under `key:` (block style), by name.
    pub fn keys(&self, key: &str) -> Vec<(String, u32)> {
        let Some((start, end)) = self.section(key) else {
            return Vec::new();
        };
        let body = &self.lines[start + 1..end];
        let Some(min) = body.iter().filter(|l| !blank(l)).map(|l| indent(l)).min() else {
            return Vec::new();
        };
        body.iter()
            .enumerate()
            .filter(|(_, l)| !blank(l) && indent(l) == min)
            .filter_map(|(i, l)| {
                let (name, _) = l.trim().split_once(':')?;
                let name = name.trim().trim_matches(|c| c == '"' || c == '\'');
                Some((name.to_string(), to_u32(start + 2 + i)))
            })
            .collect()
    }

    /// The first place at or after `from` (and before line `until`, 1-based, exclusive)
    /// where `needle` occurs; `from` itself when it does not.
    pub fn find(&self, needle: &str, from: Location, until: u32) -> Location {
        if needle.is_empty() || from.line == 0 {
            return from;
        }
        let first = from.line as usize - 1;
        let last = (until as usize)
            .saturating_sub(1)
            .max(first + 1)
            .min(self.lines.len());
        for idx in first..last {
            let line = self.lines[idx];
            let skip = if idx == first {
                (from.column as usize).saturating_sub(1).min(line.len())
            } else {
                0
            };
            if let Some(pos) = line.get(skip..).and_then(|l| l.find(needle)) {
                return Location::new(to_u32(idx + 1), to_u32(skip + pos + 1));
            }
        }
        from
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
tags: [web]
groups:
  front: [tag:web]
  back: tag:db
rules:
  # comment
  - src: tag:web
    dst: tag:db
  - {src: '*', dst: '*'}
tests:
- src: tag:web
  dst: tag:db
";

    #[test]
    fn finds_items_keys_and_strings() {
        let l = Locator::new(DOC);
        assert_eq!(l.items("rules", 2), vec![7, 9]);
        assert_eq!(l.items("tests", 1), vec![11]);
        assert_eq!(l.items("rules", 3), vec![5, 5, 5]);
        assert_eq!(
            l.keys("groups"),
            vec![("front".to_string(), 3), ("back".to_string(), 4)]
        );
        assert_eq!(
            l.find("tag:db", Location::new(7, 1), 9),
            Location::new(8, 10)
        );
        assert_eq!(l.find("nope", Location::new(7, 1), 9), Location::new(7, 1));
        assert_eq!(l.section_end("rules"), 10);
    }
}
