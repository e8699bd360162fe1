//! One declared parameter of a blueprint: its type and limits, the errors a value can earn, and
//! the check of one value against its declaration (for a request's value, and for a default
//! when the blueprint loads).

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The JSON type of a parameter's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamType {
    String,
    Integer,
    Boolean,
}

impl ParamType {
    pub fn as_str(self) -> &'static str {
        match self {
            ParamType::String => "string",
            ParamType::Integer => "integer",
            ParamType::Boolean => "boolean",
        }
    }
}

/// One declared parameter.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Param {
    #[serde(rename = "type")]
    pub ty: ParamType,
    #[serde(default)]
    pub required: bool,
    /// A regular expression a string value must match whole (it is anchored as `^(?:...)$`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// The smallest integer accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum: Option<i64>,
    /// The largest integer accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum: Option<i64>,
    /// The value used when the request leaves the parameter out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<serde_json::Value>,
    #[serde(default)]
    pub description: String,
    /// The compiled, anchored `pattern` (filled in by [`Blueprint::parse`]).
    #[serde(skip)]
    pub(crate) compiled: Option<Regex>,
}

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

/// How a JSON value reads in an error ("an integer", "a string").
pub(crate) fn json_kind(v: &Value) -> &'static str {
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
