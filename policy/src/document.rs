//! The YAML document: its shape, the shipped default, and [`parse`] (text -> [`Policy`]),
//! which checks everything the document alone can tell: syntax, selectors, protocols,
//! ports, groups (unknown, cycles, depth) and the limits. Names the Domain must know
//! (projects, nodes, tags) are checked by [`crate::check`].

use serde::Deserialize;
use serde_yaml::Value;

use crate::error::{Collector, ErrorKind, Location, PolicyError, PolicyErrors};
use crate::fields::{scalar, selectors, strings};
use crate::limits::{MAX_DECLARED_TAGS, MAX_DOCUMENT_BYTES, MAX_GROUPS, MAX_RULES, MAX_TESTS};
use crate::locate::Locator;
use crate::model::{Expect, Group, Policy, PolicyTest, Rule};
use crate::ports::{PortRange, PortSet, Proto, ProtoSet};
use crate::selector::{self, Selector};

/// The document a new Domain starts with: an explicit allow-all, so existing meshes behave
/// as before and what they allow is visible.
pub const DEFAULT_DOCUMENT: &str = "\
# The default access policy of a Domain: every node may reach every other node on every
# protocol and port. Replace this rule to restrict; `rules: []` denies everything.
# docs/policy.md describes the syntax.
rules:
  - name: allow-all
    src: '*'
    dst: '*'
    proto: any
";

/// [`DEFAULT_DOCUMENT`] parsed.
pub fn default_document() -> Policy {
    // The constant is pinned by a test; an empty policy (deny-all) would be the wrong
    // fallback, so the allow-all rule is rebuilt by hand if parsing ever failed.
    parse(DEFAULT_DOCUMENT).unwrap_or_else(|_| {
        let all = || vec![Selector::atom(selector::Atom::All)];
        Policy::new(
            Vec::new(),
            Vec::new(),
            vec![Rule {
                name: Some("allow-all".into()),
                src: all(),
                dst: all(),
                protos: ProtoSet::ANY,
                ports: PortSet::all(),
                at: Location::new(5, 5),
            }],
        )
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDoc {
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    groups: serde_yaml::Mapping,
    #[serde(default)]
    rules: Vec<RawRule>,
    #[serde(default)]
    tests: Vec<RawTest>,
    #[serde(default)]
    auto_approvers: Option<crate::approvers::RawApprovers>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(default)]
    name: Option<String>,
    src: Value,
    dst: Value,
    #[serde(default)]
    proto: Option<Value>,
    #[serde(default)]
    ports: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTest {
    #[serde(default)]
    name: Option<String>,
    src: String,
    dst: String,
    proto: String,
    #[serde(default)]
    port: Option<Value>,
    expect: String,
}

/// Parses and checks a document on its own (no Domain needed: `plexctl policy test` uses
/// this offline before it asks for the Domain's names).
pub fn parse(text: &str) -> Result<Policy, PolicyErrors> {
    let at1 = Location::new(1, 1);
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(PolicyErrors::one(PolicyError::new(
            ErrorKind::Limit,
            at1,
            format!(
                "the document is {} bytes, the limit is {MAX_DOCUMENT_BYTES}: use groups and port ranges to say the same in fewer rules",
                text.len()
            ),
        )));
    }
    if text.lines().all(|l| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#') || t == "---"
    }) {
        return Err(PolicyErrors::one(PolicyError::new(
            ErrorKind::Syntax,
            at1,
            "the document is empty: write `rules: []` to deny everything, or start from the default allow-all document (docs/policy.md)",
        )));
    }
    let raw: RawDoc = serde_yaml::from_str(text).map_err(|e| {
        let mut err = PolicyError::from_yaml(&e);
        if err.message.contains("alias") || err.message.contains("alphabetic or numeric") {
            err.message
                .push_str("; a bare * starts a YAML alias: quote it, '*'");
        }
        PolicyErrors::one(err)
    })?;
    let loc = Locator::new(text);
    let mut errs = Collector::default();
    let limit = |n: usize, max: usize, what: &str, key: &str| {
        (n > max).then(|| {
            PolicyError::new(
                ErrorKind::Limit,
                Location::new(loc.section_line(key), 1),
                format!("the document has {n} {what}, the limit is {max}"),
            )
        })
    };
    for e in [
        limit(raw.rules.len(), MAX_RULES, "rules", "rules"),
        limit(raw.groups.len(), MAX_GROUPS, "groups", "groups"),
        limit(raw.tests.len(), MAX_TESTS, "tests", "tests"),
        limit(raw.tags.len(), MAX_DECLARED_TAGS, "declared tags", "tags"),
    ]
    .into_iter()
    .flatten()
    {
        errs.push(e);
    }
    if !errs.errors.is_empty() {
        return errs.finish(Policy::default());
    }

    let tags_at = Location::new(loc.section_line("tags"), 1);
    for t in &raw.tags {
        if let Err(e) = selector::check_name(t, "tag", 0) {
            errs.push(PolicyError::new(
                ErrorKind::Invalid,
                loc.find(t, tags_at, loc.section_end("tags")),
                format!("declared tag `{t}`: {}", e.message),
            ));
        }
    }

    let group_lines = loc.keys("groups");
    let mut groups = Vec::new();
    for (key, value) in &raw.groups {
        let Some(name) = key.as_str() else {
            errs.push(PolicyError::new(
                ErrorKind::Invalid,
                Location::new(loc.section_line("groups"), 1),
                "a group's name must be a string like `frontends`",
            ));
            continue;
        };
        let line = group_lines
            .iter()
            .find(|(n, _)| n == name)
            .map_or(loc.section_line("groups"), |&(_, l)| l);
        let at = Location::new(line, 1);
        if let Err(e) = selector::check_name(name, "group", 0) {
            errs.push(PolicyError::new(
                ErrorKind::Invalid,
                at,
                format!("group `{name}`: {}", e.message),
            ));
        }
        let what = format!("group `{name}`");
        let members = selectors(value, &what, at, line + 1, &loc, &mut errs);
        groups.push(Group {
            name: name.to_string(),
            members,
            at,
        });
    }

    let rule_lines = loc.items("rules", raw.rules.len());
    let rules_end = loc.section_end("rules");
    let mut rules = Vec::new();
    for (i, r) in raw.rules.iter().enumerate() {
        let at = Location::new(rule_lines[i], 1);
        let until = rule_lines.get(i + 1).copied().unwrap_or(rules_end);
        rules.push(rule(r, i, at, until, &loc, &mut errs));
    }

    let test_lines = loc.items("tests", raw.tests.len());
    let tests_end = loc.section_end("tests");
    let mut tests = Vec::new();
    for (i, t) in raw.tests.iter().enumerate() {
        let at = Location::new(test_lines[i], 1);
        let until = test_lines.get(i + 1).copied().unwrap_or(tests_end);
        if let Some(t) = test(t, i, at, until, &loc, &mut errs) {
            tests.push(t);
        }
    }

    let mut policy = Policy::new(raw.tags, groups, rules);
    policy.tests = tests;
    if let Some(a) = &raw.auto_approvers {
        policy.auto_approvers = crate::approvers::parse(a, &loc, &mut errs);
    }
    crate::groups::check(&policy, &mut errs);
    errs.finish(policy)
}

fn rule(
    r: &RawRule,
    i: usize,
    at: Location,
    until: u32,
    loc: &Locator,
    errs: &mut Collector,
) -> Rule {
    let n = i + 1;
    let bad = |msg: String| PolicyError::new(ErrorKind::Invalid, at, format!("rule {n}: {msg}"));
    let src = selectors(&r.src, &format!("rule {n} src"), at, until, loc, errs);
    let dst = selectors(&r.dst, &format!("rule {n} dst"), at, until, loc, errs);
    let mut protos = ProtoSet::default();
    match &r.proto {
        None => protos = ProtoSet::ANY,
        Some(v) => {
            for s in strings(v, "proto", &bad, errs) {
                match ProtoSet::parse(&s) {
                    Some(p) => protos = protos.union(p),
                    None => errs.push(bad(format!(
                        "unknown protocol `{s}`: write tcp, udp, icmp or any"
                    ))),
                }
            }
        }
    }
    let mut ranges = Vec::new();
    match &r.ports {
        None => ranges.push(PortRange::ALL),
        Some(v) => {
            for s in strings(v, "ports", &bad, errs) {
                match PortRange::parse(&s) {
                    Ok(p) => ranges.push(p),
                    Err(m) => errs.push(PolicyError::new(
                        ErrorKind::Invalid,
                        loc.find(&s, at, until),
                        format!("rule {n} ports: {m}"),
                    )),
                }
            }
        }
    }
    let ports = PortSet::from_ranges(ranges);
    if protos.portless() && !ports.is_all() && r.ports.is_some() {
        errs.push(bad(format!(
            "ports {ports} with a protocol that has none (icmp or any): ports apply to tcp and udp; write `proto: [tcp, udp]`, or drop `ports` for icmp and any"
        )));
    }
    Rule {
        name: r.name.clone(),
        src,
        dst,
        protos,
        ports: if protos.portless() {
            PortSet::all()
        } else {
            ports
        },
        at,
    }
}

fn test(
    t: &RawTest,
    i: usize,
    at: Location,
    until: u32,
    loc: &Locator,
    errs: &mut Collector,
) -> Option<PolicyTest> {
    let n = i + 1;
    let bad = |msg: String| PolicyError::new(ErrorKind::Invalid, at, format!("test {n}: {msg}"));
    let one = |s: &str, side: &str, errs: &mut Collector| {
        let v = Value::String(s.to_string());
        selectors(&v, &format!("test {n} {side}"), at, until, loc, errs).pop()
    };
    let src = one(&t.src, "src", errs);
    let dst = one(&t.dst, "dst", errs);
    let Some(proto) = Proto::parse(&t.proto) else {
        errs.push(bad(format!(
            "protocol `{}`: a test checks one kind of packet, write tcp, udp or icmp",
            t.proto
        )));
        return None;
    };
    let port = match (&t.port, proto.has_ports()) {
        (None, true) => {
            errs.push(bad(format!("a {proto} test needs `port: N`")));
            return None;
        }
        (Some(_), false) => {
            errs.push(bad("icmp has no ports: drop `port`".into()));
            return None;
        }
        (None, false) => 0,
        (Some(v), true) => match scalar(v).map(|s| PortRange::parse(&s)) {
            Some(Ok(r)) if r.first == r.last => r.first,
            _ => {
                errs.push(bad(
                    "`port` is one port from 0 to 65535 (a test checks one packet)".into(),
                ));
                return None;
            }
        },
    };
    let expect = match t.expect.as_str() {
        "accept" => Expect::Accept,
        "deny" => Expect::Deny,
        other => {
            errs.push(bad(format!("expect `{other}`: write accept or deny")));
            return None;
        }
    };
    Some(PolicyTest {
        name: t.name.clone(),
        src: src?,
        dst: dst?,
        proto,
        port,
        expect,
        at,
    })
}
