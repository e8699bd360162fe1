//! Checking a resource's parameters against its blueprint, before any substrate is touched.
//!
//! The check fails closed: an unknown parameter, a missing required one, a value of the wrong
//! type, outside its bounds or not matching its pattern are all refused, each error naming the
//! parameter and what was expected. Every problem is reported at once, so the operator fixes the
//! request in one go. On success the resolved map carries the defaults too.

use serde_json::{Map, Value};

use crate::blueprint::{Blueprint, Param, ParamType};

/// The longest string value accepted, in bytes.
pub const MAX_STRING_BYTES: usize = 4096;

/// One refused parameter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParameterError {
    #[error("the parameters must be a JSON object such as {{\"region\":\"us-east-1\"}}, not {got}")]
    NotAnObject { got: String },
    #[error("parameter `{name}` is not declared by {blueprint}; it accepts {accepted}")]
    Unknown {
        name: String,
        blueprint: String,
        accepted: String,
    },
    #[error("parameter `{name}` is required by {blueprint} and missing")]
    Missing { name: String, blueprint: String },
    #[error("parameter `{name}` must be {expected}, not {got}")]
    WrongType {
        name: String,
        expected: &'static str,
        got: String,
    },
    #[error("parameter `{name}` = {value} does not match the pattern `{pattern}`")]
    Pattern {
        name: String,
        value: String,
        pattern: String,
    },
    #[error("parameter `{name}` = {value} is outside {range}")]
    OutOfRange {
        name: String,
        value: i64,
        range: String,
    },
    #[error("parameter `{name}` is longer than {MAX_STRING_BYTES} bytes")]
    TooLong { name: String },
}

impl ParameterError {
    /// The parameter this error is about (None for a body that is not an object).
    pub fn parameter(&self) -> Option<&str> {
        match self {
            ParameterError::NotAnObject { .. } => None,
            ParameterError::Unknown { name, .. }
            | ParameterError::Missing { name, .. }
            | ParameterError::WrongType { name, .. }
            | ParameterError::Pattern { name, .. }
            | ParameterError::OutOfRange { name, .. }
            | ParameterError::TooLong { name } => Some(name),
        }
    }
}

/// Every problem with a request's parameters (never empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ParameterErrors {
    pub errors: Vec<ParameterError>,
}

/// The checked parameters with defaults applied, in name order.
pub type ResolvedParameters = Map<String, Value>;

/// Checks `given` (the request's `parameters`, `null` meaning none) against `blueprint`.
pub fn resolve(
    blueprint: &Blueprint,
    given: &Value,
) -> Result<ResolvedParameters, ParameterErrors> {
    let empty = Map::new();
    let given = match given {
        Value::Object(m) => m,
        Value::Null => &empty,
        other => {
            return Err(ParameterErrors {
                errors: vec![ParameterError::NotAnObject {
                    got: json_kind(other).to_owned(),
                }],
            });
        }
    };
    let mut errors = Vec::new();
    for name in given.keys() {
        if !blueprint.parameters.contains_key(name) {
            errors.push(ParameterError::Unknown {
                name: name.clone(),
                blueprint: blueprint.label(),
                accepted: accepted(blueprint),
            });
        }
    }
    let mut resolved = Map::new();
    for (name, param) in &blueprint.parameters {
        match given.get(name) {
            Some(value) => match check_value(name, param, value) {
                Ok(()) => {
                    resolved.insert(name.clone(), value.clone());
                }
                Err(e) => errors.push(e),
            },
            None if param.required => errors.push(ParameterError::Missing {
                name: name.clone(),
                blueprint: blueprint.label(),
            }),
            None => {
                if let Some(default) = &param.default {
                    resolved.insert(name.clone(), default.clone());
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(resolved)
    } else {
        Err(ParameterErrors { errors })
    }
}

fn accepted(blueprint: &Blueprint) -> String {
    if blueprint.parameters.is_empty() {
        return "no parameters".to_owned();
    }
    blueprint
        .parameters
        .iter()
        .map(|(n, p)| {
            if p.required {
                format!("{n} (required)")
            } else {
                n.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number with a fraction",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Checks one value against its declaration (also used for defaults when a blueprint loads).
pub(crate) fn check_value(name: &str, p: &Param, value: &Value) -> Result<(), ParameterError> {
    let wrong = || ParameterError::WrongType {
        name: name.to_owned(),
        expected: match p.ty {
            ParamType::String => "a string",
            ParamType::Integer => "an integer",
            ParamType::Boolean => "a boolean (true or false)",
        },
        got: json_kind(value).to_owned(),
    };
    match p.ty {
        ParamType::String => {
            let s = value.as_str().ok_or_else(wrong)?;
            if s.len() > MAX_STRING_BYTES {
                return Err(ParameterError::TooLong {
                    name: name.to_owned(),
                });
            }
            if let Some(re) = &p.compiled
                && !re.is_match(s)
            {
                return Err(ParameterError::Pattern {
                    name: name.to_owned(),
                    value: Value::String(s.to_owned()).to_string(),
                    pattern: p.pattern.clone().unwrap_or_default(),
                });
            }
        }
        ParamType::Integer => {
            let n = value.as_i64().ok_or_else(wrong)?;
            let below = p.minimum.is_some_and(|lo| n < lo);
            let above = p.maximum.is_some_and(|hi| n > hi);
            if below || above {
                let range = match (p.minimum, p.maximum) {
                    (Some(lo), Some(hi)) => format!("{lo}..={hi}"),
                    (Some(lo), None) => format!("{lo} and above"),
                    (None, Some(hi)) => format!("{hi} and below"),
                    (None, None) => String::new(),
                };
                return Err(ParameterError::OutOfRange {
                    name: name.to_owned(),
                    value: n,
                    range,
                });
            }
        }
        ParamType::Boolean => {
            value.as_bool().ok_or_else(wrong)?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "params_tests.rs"]
mod tests;
