//! The parsed, checked document: groups, rules and tests as plain values, each with the
//! place it came from. Made by [`crate::document::parse`]; read by everything else.

use std::collections::HashMap;
use std::fmt;

use crate::error::Location;
use crate::ports::{Access, PortSet, Proto, ProtoSet};
use crate::selector::Selector;

/// A whole policy document.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    /// Tags the document declares (so it may name them before any node carries them).
    pub tags: Vec<String>,
    pub groups: Vec<Group>,
    pub rules: Vec<Rule>,
    pub tests: Vec<PolicyTest>,
    /// Whose routes and exits are approved without an operator (issue 27).
    pub auto_approvers: crate::approvers::AutoApprovers,
    pub(crate) group_index: HashMap<String, usize>,
}

impl Policy {
    pub fn new(tags: Vec<String>, groups: Vec<Group>, rules: Vec<Rule>) -> Self {
        let group_index = groups
            .iter()
            .enumerate()
            .map(|(i, g)| (g.name.clone(), i))
            .collect();
        Self {
            tags,
            groups,
            rules,
            tests: Vec::new(),
            auto_approvers: Default::default(),
            group_index,
        }
    }

    pub fn group(&self, name: &str) -> Option<&Group> {
        self.group_index.get(name).map(|&i| &self.groups[i])
    }

    /// Every selector of the document with what holds it ("rule 3 src", "group front").
    pub fn selectors(&self) -> Vec<(&Selector, String)> {
        let mut out = Vec::new();
        for g in &self.groups {
            out.extend(g.members.iter().map(|s| (s, format!("group {}", g.name))));
        }
        for (i, r) in self.rules.iter().enumerate() {
            out.extend(r.src.iter().map(|s| (s, format!("rule {} src", i + 1))));
            out.extend(r.dst.iter().map(|s| (s, format!("rule {} dst", i + 1))));
        }
        for (i, t) in self.tests.iter().enumerate() {
            out.push((&t.src, format!("test {} src", i + 1)));
            out.push((&t.dst, format!("test {} dst", i + 1)));
        }
        for (prefix, sels) in &self.auto_approvers.routes {
            out.extend(
                sels.iter()
                    .map(|s| (s, format!("auto_approvers routes {prefix}"))),
            );
        }
        out.extend(
            self.auto_approvers
                .exit
                .iter()
                .map(|s| (s, "auto_approvers exit".to_string())),
        );
        out
    }
}

/// `groups: {name: [selectors]}`: a named union of selectors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub name: String,
    pub members: Vec<Selector>,
    pub at: Location,
}

/// One rule: nodes in `src` may open connections to nodes in `dst` with these protocols
/// and ports. Rules only allow; what no rule allows is denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// An optional name, shown by explain and the filter listing.
    pub name: Option<String>,
    pub src: Vec<Selector>,
    pub dst: Vec<Selector>,
    pub protos: ProtoSet,
    /// The tcp/udp ports (all ports when the rule names icmp or any).
    pub ports: PortSet,
    pub at: Location,
}

impl Rule {
    /// What the rule grants a source on a destination.
    pub fn access(&self) -> Access {
        let mut a = Access::default();
        a.add(self.protos, &self.ports);
        a
    }

    /// Whether the rule covers a packet of `proto` to `port` (scans the port ranges).
    pub fn covers(&self, proto: Proto, port: u16) -> bool {
        self.protos.contains(proto) && (!proto.has_ports() || self.ports.contains(port))
    }
}

fn list(sels: &[Selector]) -> String {
    match sels {
        [one] => one.to_string(),
        many => format!(
            "[{}]",
            many.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

impl fmt::Display for Rule {
    /// `line 12 (web-to-db): tag:web -> tag:db tcp 5432`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}", self.at.line)?;
        if let Some(n) = &self.name {
            write!(f, " ({n})")?;
        }
        write!(
            f,
            ": {} -> {} {}",
            list(&self.src),
            list(&self.dst),
            self.access()
        )
    }
}

/// What a test expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Expect {
    Accept,
    Deny,
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Expect::Accept => "accept",
            Expect::Deny => "deny",
        })
    }
}

/// A test inside the document: every node in `src` opening `proto`/`port` to every other
/// node in `dst` is accepted (or denied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyTest {
    pub name: Option<String>,
    pub src: Selector,
    pub dst: Selector,
    pub proto: Proto,
    /// The destination port (0 for icmp).
    pub port: u16,
    pub expect: Expect,
    pub at: Location,
}

impl PolicyTest {
    /// `tcp/5432` or `icmp`.
    pub fn what(&self) -> String {
        if self.proto.has_ports() {
            format!("{}/{}", self.proto, self.port)
        } else {
            self.proto.to_string()
        }
    }

    /// `test 3 (db-closed) at line 40`
    pub fn label(&self, index: usize) -> String {
        match &self.name {
            Some(n) => format!("test {} ({n}) at line {}", index + 1, self.at.line),
            None => format!("test {} at line {}", index + 1, self.at.line),
        }
    }
}
