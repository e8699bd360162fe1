//! Errors of parsing, validating and testing a document: each carries where (line and
//! column, 1-based) and says what is wrong and how to fix it, in one line.

use std::fmt;

/// A place in the document. `column` 0 means "somewhere on this line".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Location {
    pub line: u32,
    pub column: u32,
}

impl Location {
    pub fn new(line: u32, column: u32) -> Self {
        Self { line, column }
    }

    /// `column` more bytes to the right (a part of a selector string).
    pub fn shifted(self, by: usize) -> Self {
        if self.column == 0 {
            return self;
        }
        let by = u32::try_from(by).unwrap_or(0);
        Self {
            line: self.line,
            column: self.column.saturating_add(by),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.column == 0 {
            write!(f, "line {}", self.line)
        } else {
            write!(f, "line {}, column {}", self.line, self.column)
        }
    }
}

/// What kind of problem, for callers that map errors to codes (`policy_invalid`,
/// `policy_test_failed`, `policy_too_large`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The YAML does not parse or has the wrong shape.
    Syntax,
    /// A selector, port, protocol or CIDR is malformed, or a group is wrong.
    Invalid,
    /// A name the Domain does not know (project, node, tag).
    Unknown,
    /// A documented limit was reached.
    Limit,
    /// A test inside the document failed.
    TestFailed,
}

/// One problem in a document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{location}: {message}")]
pub struct PolicyError {
    pub kind: ErrorKind,
    pub location: Location,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl PolicyError {
    pub fn new(kind: ErrorKind, location: Location, message: impl Into<String>) -> Self {
        Self {
            kind,
            location,
            message: message.into(),
        }
    }

    /// From serde_yaml's error, with its location when it has one.
    pub fn from_yaml(e: &serde_yaml::Error) -> Self {
        let location = e
            .location()
            .map(|l| {
                Location::new(
                    u32::try_from(l.line()).unwrap_or(u32::MAX),
                    u32::try_from(l.column()).unwrap_or(u32::MAX),
                )
            })
            .unwrap_or_default();
        // serde_yaml appends " at line L column C" itself: keep the message only.
        let text = e.to_string();
        let message = match text.find(" at line ") {
            Some(i) => text[..i].to_string(),
            None => text,
        };
        Self::new(
            ErrorKind::Syntax,
            location,
            format!("{message} (see docs/policy.md for the document's shape)"),
        )
    }
}

/// Every problem found (up to [`crate::limits::MAX_REPORTED_ERRORS`]), in document order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyErrors(pub Vec<PolicyError>);

impl PolicyErrors {
    pub fn one(e: PolicyError) -> Self {
        Self(vec![e])
    }

    /// The first problem (there is always one).
    pub fn first(&self) -> Option<&PolicyError> {
        self.0.first()
    }

    /// Each problem prefixed with `file:` as compilers print them (`policy.yaml:12:9: ...`).
    pub fn render(&self, file: &str) -> String {
        self.0
            .iter()
            .map(|e| {
                format!(
                    "{file}:{}:{}: {}",
                    e.location.line, e.location.column, e.message
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyErrors {}

/// Collects errors up to the reporting limit.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    pub errors: Vec<PolicyError>,
}

impl Collector {
    pub fn push(&mut self, e: PolicyError) {
        if self.errors.len() < crate::limits::MAX_REPORTED_ERRORS {
            self.errors.push(e);
        }
    }

    pub fn finish<T>(mut self, value: T) -> Result<T, PolicyErrors> {
        if self.errors.is_empty() {
            Ok(value)
        } else {
            self.errors.sort_by_key(|e| e.location);
            Err(PolicyErrors(self.errors))
        }
    }
}
