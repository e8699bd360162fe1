//! Reading the loosely typed fields of a document (a scalar or a list; a selector string
//! with its place in the text) with errors that say what the field takes.

use serde_yaml::Value;

use crate::error::{Collector, ErrorKind, Location, PolicyError};
use crate::limits::MAX_LIST_LEN;
use crate::locate::Locator;
use crate::selector::{self, Selector};

/// A YAML scalar as text (`5432` and `"5432"` alike).
pub(crate) fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A scalar or a list of scalars, as text.
pub(crate) fn strings(
    v: &Value,
    field: &str,
    bad: &dyn Fn(String) -> PolicyError,
    errs: &mut Collector,
) -> Vec<String> {
    let items: Vec<&Value> = match v {
        Value::Sequence(s) => s.iter().collect(),
        other => vec![other],
    };
    if items.is_empty() {
        errs.push(bad(format!(
            "`{field}` is an empty list: name at least one"
        )));
    }
    if items.len() > MAX_LIST_LEN {
        errs.push(bad(format!(
            "`{field}` has {} entries, the limit is {MAX_LIST_LEN}",
            items.len()
        )));
        return Vec::new();
    }
    items
        .into_iter()
        .filter_map(|i| {
            let s = scalar(i);
            if s.is_none() {
                errs.push(bad(format!(
                    "`{field}` takes a word, a number or a list of them"
                )));
            }
            s
        })
        .collect()
}

/// A selector or a list of selectors, each located in the text.
pub(crate) fn selectors(
    v: &Value,
    what: &str,
    at: Location,
    until: u32,
    loc: &Locator,
    errs: &mut Collector,
) -> Vec<Selector> {
    let bad = |msg: String| PolicyError::new(ErrorKind::Invalid, at, format!("{what}: {msg}"));
    let mut out = Vec::new();
    let mut from = at;
    for s in strings(v, "selector", &bad, errs) {
        let place = loc.find(&s, from, until);
        from = place;
        match selector::parse(&s) {
            Ok(mut sel) => {
                sel.at = place;
                out.push(sel);
            }
            Err(e) => errs.push(PolicyError::new(
                if e.message.contains("limit") {
                    ErrorKind::Limit
                } else {
                    ErrorKind::Invalid
                },
                place.shifted(e.offset),
                format!("{what}: {}", e.message),
            )),
        }
    }
    out
}
