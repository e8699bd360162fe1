//! Selectors: who a rule talks about. The grammar of one selector string:
//!
//! ```text
//! selector := term ( " - " term )*        subtraction, left to right; spaces around "-"
//! term     := "*" | "tag:" NAME | "project:" (SLUG | UUID) | "node:" (NAME | UUID)
//!           | "group:" NAME | CIDR | IP
//! ```
//!
//! A list of selectors (`[tag:web, tag:api]`) is their union; there are no parentheses
//! (a group holds a sub-expression).

use std::fmt;

use ipnet::IpNet;
use uuid::Uuid;

use crate::error::Location;
use crate::limits::{MAX_NAME_LEN, MAX_SELECTOR_LEN};

/// One term of a selector.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Atom {
    /// `*`: every node (and, for the routes to come, every address).
    All,
    Tag(String),
    Project(NameOrId),
    Node(NameOrId),
    Group(String),
    /// A CIDR (a bare IP is a /32 or /128): the nodes whose mesh IP is inside, and the
    /// addresses themselves for subnet routes later.
    Cidr(IpNet),
}

/// A project or node named by slug/name or by id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NameOrId {
    Name(String),
    Id(Uuid),
}

impl fmt::Display for NameOrId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameOrId::Name(n) => f.write_str(n),
            NameOrId::Id(id) => write!(f, "{id}"),
        }
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::All => f.write_str("*"),
            Atom::Tag(t) => write!(f, "tag:{t}"),
            Atom::Project(p) => write!(f, "project:{p}"),
            Atom::Node(n) => write!(f, "node:{n}"),
            Atom::Group(g) => write!(f, "group:{g}"),
            Atom::Cidr(c) => write!(f, "{c}"),
        }
    }
}

/// A term and its byte offset in the selector string (for error columns).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Term {
    pub atom: Atom,
    pub offset: usize,
}

/// `include - exclude[0] - exclude[1] ...`, and where its string starts in the document.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Selector {
    pub include: Term,
    pub exclude: Vec<Term>,
    pub at: Location,
}

impl Selector {
    /// Where a term starts in the document.
    pub fn term_at(&self, t: &Term) -> Location {
        self.at.shifted(t.offset)
    }

    /// The only term, when there is no subtraction.
    pub fn single(&self) -> Option<&Atom> {
        self.exclude.is_empty().then_some(&self.include.atom)
    }

    /// Every term, the included one first.
    pub fn terms(&self) -> impl Iterator<Item = &Term> {
        std::iter::once(&self.include).chain(self.exclude.iter())
    }

    /// A selector of one term.
    pub fn atom(atom: Atom) -> Selector {
        Selector {
            include: Term { atom, offset: 0 },
            exclude: Vec::new(),
            at: Location::default(),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.include.atom)?;
        for t in &self.exclude {
            write!(f, " - {}", t.atom)?;
        }
        Ok(())
    }
}

/// A syntax error inside a selector string: the byte offset and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorError {
    pub offset: usize,
    pub message: String,
}

fn err(offset: usize, message: impl Into<String>) -> SelectorError {
    SelectorError {
        offset,
        message: message.into(),
    }
}

/// Parses one selector string.
pub fn parse(s: &str) -> Result<Selector, SelectorError> {
    if s.len() > MAX_SELECTOR_LEN {
        return Err(err(
            0,
            format!(
                "the selector is {} bytes long, the limit is {MAX_SELECTOR_LEN}: name the nodes with a tag or a group instead",
                s.len()
            ),
        ));
    }
    let mut tokens = Vec::new();
    let mut offset = 0;
    for piece in s.split(' ') {
        if !piece.is_empty() {
            tokens.push((offset, piece));
        }
        offset += piece.len() + 1;
    }
    let Some(&(first_at, first)) = tokens.first() else {
        return Err(err(
            0,
            "the selector is empty: write *, tag:NAME, project:SLUG, node:NAME, group:NAME or a CIDR",
        ));
    };
    let include = Term {
        atom: parse_atom(first, first_at)?,
        offset: first_at,
    };
    let mut exclude = Vec::new();
    let mut rest = tokens[1..].iter();
    while let Some(&(at, op)) = rest.next() {
        if op != "-" {
            return Err(err(
                at,
                format!(
                    "`{op}` follows a selector without an operator: write `A - B` (spaces around the minus) to subtract, or a list [A, B] for both"
                ),
            ));
        }
        let Some(&(t_at, t)) = rest.next() else {
            return Err(err(at, "the `-` has nothing after it: write `A - B`"));
        };
        exclude.push(Term {
            atom: parse_atom(t, t_at)?,
            offset: t_at,
        });
    }
    Ok(Selector {
        include,
        exclude,
        at: Location::default(),
    })
}

fn parse_atom(t: &str, at: usize) -> Result<Atom, SelectorError> {
    if t == "*" {
        return Ok(Atom::All);
    }
    if let Some((kind, name)) = t.split_once(':')
        && matches!(kind, "tag" | "project" | "node" | "group")
    {
        check_name(name, kind, at + kind.len() + 1)?;
        return Ok(match kind {
            "tag" => Atom::Tag(name.to_string()),
            "group" => Atom::Group(name.to_string()),
            "project" => Atom::Project(name_or_id(name)),
            _ => Atom::Node(name_or_id(name)),
        });
    }
    if let Some(rest) = t.strip_prefix('-') {
        return Err(err(
            at,
            format!("put spaces around the minus: `A - {rest}`"),
        ));
    }
    if t.contains('/') {
        let net: IpNet = t.parse().map_err(|_| {
            err(
                at,
                format!(
                    "`{t}` is not a CIDR: write an address and a prefix length, like 10.1.0.0/16 or fd00::/64"
                ),
            )
        })?;
        if net.trunc() != net {
            return Err(err(
                at,
                format!(
                    "`{t}` has bits set after the prefix length: write {} for the network",
                    net.trunc()
                ),
            ));
        }
        return Ok(Atom::Cidr(net));
    }
    if let Ok(ip) = t.parse::<std::net::IpAddr>() {
        return Ok(Atom::Cidr(IpNet::from(ip)));
    }
    Err(err(
        at,
        format!(
            "`{t}` is not a selector: write *, tag:NAME, project:SLUG, node:NAME, group:NAME, or a CIDR like 10.1.0.0/16"
        ),
    ))
}

fn name_or_id(name: &str) -> NameOrId {
    match Uuid::parse_str(name) {
        Ok(id) => NameOrId::Id(id),
        Err(_) => NameOrId::Name(name.to_string()),
    }
}

/// A tag, group, node or project name: 1 to 64 of `A-Z a-z 0-9 - _ .`.
pub fn check_name(name: &str, kind: &str, at: usize) -> Result<(), SelectorError> {
    if name.is_empty() {
        return Err(err(at, format!("`{kind}:` needs a name after the colon")));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(err(
            at,
            format!("the {kind} name is longer than {MAX_NAME_LEN} bytes"),
        ));
    }
    if let Some((i, c)) = name
        .char_indices()
        .find(|&(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(err(
            at + i,
            format!("`{c}` cannot be part of a {kind} name: use letters, digits, `-`, `_` and `.`"),
        ));
    }
    Ok(())
}
