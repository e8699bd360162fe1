//! What to answer a GET of a file, given its length, its entity tag and the request's
//! `Range`, `If-Range` and `If-None-Match` (RFC 9110 sections 13 and 14). No I/O.
//!
//! Single ranges only: a request for several ranges gets the whole file (a server may ignore
//! `Range`), which is what download tools cope with; `curl -C -` asks for `bytes=<n>-`.

/// The answer to plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// 304: the client's copy (`If-None-Match`) is current.
    NotModified,
    /// 200 with the whole file.
    Full,
    /// 206 with bytes `start..=end` (`Content-Range: bytes start-end/len`).
    Partial { start: u64, end: u64 },
    /// 416 (`Content-Range: bytes */len`).
    Unsatisfiable,
}

/// The request headers that matter, as text (absent or not valid UTF-8 is `None`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Conditions<'a> {
    pub range: Option<&'a str>,
    pub if_range: Option<&'a str>,
    pub if_none_match: Option<&'a str>,
}

/// Decides the answer for a file of `len` bytes whose strong entity tag is `etag` (quoted).
pub fn plan(len: u64, etag: &str, c: Conditions<'_>) -> Plan {
    if let Some(inm) = c.if_none_match
        && none_match_hits(inm, etag)
    {
        return Plan::NotModified;
    }
    let Some(range) = c.range else {
        return Plan::Full;
    };
    // If-Range with anything but our exact strong tag (another tag, a weak one, or a date:
    // we send no Last-Modified) means the client's partial copy is of something else.
    if let Some(ir) = c.if_range
        && ir.trim() != etag
    {
        return Plan::Full;
    }
    match parse_single(range) {
        Some(spec) => resolve(spec, len),
        None => Plan::Full,
    }
}

/// `If-None-Match: *` or a list containing our tag (weak comparison).
fn none_match_hits(header: &str, etag: &str) -> bool {
    let ours = etag.trim_start_matches("W/");
    header
        .split(',')
        .map(str::trim)
        .any(|t| t == "*" || t.trim_start_matches("W/") == ours)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spec {
    /// `a-b` or `a-`.
    From { start: u64, end: Option<u64> },
    /// `-n`: the last n bytes.
    Suffix(u64),
}

/// One byte range, or `None` when the header is malformed, of another unit, or asks for
/// several ranges (all three mean: ignore it and send the whole file).
fn parse_single(header: &str) -> Option<Spec> {
    let (unit, set) = header.trim().split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return None;
    }
    let mut specs = set.split(',').map(str::trim).filter(|s| !s.is_empty());
    let spec = specs.next()?;
    if specs.next().is_some() {
        return None;
    }
    let (first, last) = spec.split_once('-')?;
    let (first, last) = (first.trim(), last.trim());
    if first.is_empty() {
        return Some(Spec::Suffix(number(last)?));
    }
    let start = number(first)?;
    let end = if last.is_empty() {
        None
    } else {
        Some(number(last)?)
    };
    if end.is_some_and(|e| e < start) {
        return None;
    }
    Some(Spec::From { start, end })
}

fn number(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn resolve(spec: Spec, len: u64) -> Plan {
    match spec {
        Spec::From { start, .. } if start >= len => Plan::Unsatisfiable,
        Spec::From { start, end } => Plan::Partial {
            start,
            end: end.map_or(len - 1, |e| e.min(len - 1)),
        },
        Spec::Suffix(0) => Plan::Unsatisfiable,
        Spec::Suffix(_) if len == 0 => Plan::Unsatisfiable,
        Spec::Suffix(n) => Plan::Partial {
            start: len.saturating_sub(n),
            end: len - 1,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAG: &str = "\"abc\"";

    fn range(r: &str) -> Plan {
        plan(
            100,
            TAG,
            Conditions {
                range: Some(r),
                ..Default::default()
            },
        )
    }

    #[test]
    fn single_ranges() {
        assert_eq!(range("bytes=0-9"), Plan::Partial { start: 0, end: 9 });
        assert_eq!(range("bytes=40-"), Plan::Partial { start: 40, end: 99 });
        assert_eq!(range("bytes=90-500"), Plan::Partial { start: 90, end: 99 });
        assert_eq!(range("bytes=-10"), Plan::Partial { start: 90, end: 99 });
        assert_eq!(range("bytes=-1000"), Plan::Partial { start: 0, end: 99 });
        assert_eq!(range("Bytes = 5 - 5"), Plan::Partial { start: 5, end: 5 });
        assert_eq!(range("bytes=99-"), Plan::Partial { start: 99, end: 99 });
    }

    #[test]
    fn unsatisfiable_ranges() {
        // `curl -C -` on a complete file asks for bytes=<len>-.
        assert_eq!(range("bytes=100-"), Plan::Unsatisfiable);
        assert_eq!(range("bytes=150-160"), Plan::Unsatisfiable);
        assert_eq!(range("bytes=-0"), Plan::Unsatisfiable);
        let empty = |r| {
            plan(
                0,
                TAG,
                Conditions {
                    range: Some(r),
                    ..Default::default()
                },
            )
        };
        assert_eq!(empty("bytes=0-"), Plan::Unsatisfiable);
        assert_eq!(empty("bytes=-5"), Plan::Unsatisfiable);
    }

    #[test]
    fn ignored_ranges_send_the_whole_file() {
        for r in [
            "bytes=0-1,5-6",
            "bytes=9-3",
            "items=0-1",
            "bytes=a-b",
            "bytes=+1-2",
            "bytes=",
            "bytes",
            "bytes=-",
        ] {
            assert_eq!(range(r), Plan::Full, "{r}");
        }
        assert_eq!(plan(100, TAG, Conditions::default()), Plan::Full);
    }

    #[test]
    fn if_range_needs_our_strong_tag() {
        let with = |ir| {
            plan(
                100,
                TAG,
                Conditions {
                    range: Some("bytes=10-"),
                    if_range: Some(ir),
                    if_none_match: None,
                },
            )
        };
        assert_eq!(with(TAG), Plan::Partial { start: 10, end: 99 });
        assert_eq!(with("\"other\""), Plan::Full);
        assert_eq!(with("W/\"abc\""), Plan::Full);
        assert_eq!(with("Sat, 29 Oct 1994 19:43:31 GMT"), Plan::Full);
    }

    #[test]
    fn if_none_match() {
        let with = |inm| {
            plan(
                100,
                TAG,
                Conditions {
                    range: Some("bytes=0-1"),
                    if_range: None,
                    if_none_match: Some(inm),
                },
            )
        };
        assert_eq!(with(TAG), Plan::NotModified);
        assert_eq!(with("\"x\", W/\"abc\""), Plan::NotModified);
        assert_eq!(with("*"), Plan::NotModified);
        assert_eq!(with("\"x\""), Plan::Partial { start: 0, end: 1 });
    }
}
