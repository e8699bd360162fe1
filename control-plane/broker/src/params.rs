//! Checking a resource's parameters against its blueprint, before any substrate is touched.
//!
//! The check fails closed: an unknown parameter, a missing required one, a value of the wrong
//! type, outside its bounds or not matching its pattern are all refused, each error naming the
//! parameter and what was expected. Every problem is reported at once, so the operator fixes the
//! request in one go. On success the resolved map carries the defaults too.

use serde_json::{Map, Value};

use crate::blueprint::Blueprint;
pub use crate::param::{MAX_STRING_BYTES, ParameterError};
use crate::param::{check_value, json_kind};

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

#[cfg(test)]
#[path = "params_tests.rs"]
mod tests;
