//! One blueprint: a versioned catalog entry declaring what kind of resource it makes, which
//! substrate makes it, the parameters it accepts and the composite it renders.
//!
//! Blueprints are YAML files. Parsing is strict (unknown keys are refused) and every error names
//! the file and, where the YAML parser knows it, the line. A blueprint is checked whole when it
//! is loaded: bad patterns, defaults that fail their own declaration and a missing composite for
//! the Crossplane substrate are refused then, never when a resource is created.

use std::collections::BTreeMap;

use regex::Regex;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use crate::param::{Param, ParamType};

/// The namespace of blueprint version ids: `version_id = UUIDv5(BLUEPRINT_NAMESPACE,
/// "<name>@<version>")`, so two servers loading the same catalog agree on every id.
/// (It is itself `UUIDv5(NAMESPACE_URL, "urn:plexsphere:blueprint")`; a test pins that.)
pub const BLUEPRINT_NAMESPACE: Uuid = Uuid::from_u128(0xc438_4d98_34a4_51be_a250_f528_9e62_137e);

/// The stable id of a blueprint version.
pub fn version_id(name: &str, version: &str) -> Uuid {
    Uuid::new_v5(&BLUEPRINT_NAMESPACE, format!("{name}@{version}").as_bytes())
}

/// What a resource of this blueprint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// A machine that enrols as a node: the broker mints a bootstrap token and renders the
    /// cloud-init document; Ready means the node registered.
    Machine,
    /// Anything else (a bucket, a network): Ready means the substrate reports it ready.
    Standalone,
}

/// Which substrate makes the resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Substrate {
    /// A systemd-nspawn machine on the control plane's host.
    LocalMachine,
    /// A directory on the control plane's host (a local stand-in for a bucket).
    LocalDirectory,
    /// A Crossplane composite in the Project's namespace on a management cluster.
    Crossplane,
    /// A Nova server the broker makes itself through the cloud's API (Keystone, Nova,
    /// Glance, Neutron) with the resource's cloud credential.
    #[serde(rename = "openstack")]
    OpenStack,
}

impl Substrate {
    pub fn as_str(self) -> &'static str {
        match self {
            Substrate::LocalMachine => "local-machine",
            Substrate::LocalDirectory => "local-directory",
            Substrate::Crossplane => "crossplane",
            Substrate::OpenStack => "openstack",
        }
    }
}

/// The composite a blueprint renders: the object handed to its substrate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompositeTemplate {
    /// e.g. `blueprints.plexsphere.com/v1alpha2`.
    pub api_version: String,
    /// e.g. `XOpenStackInstance`.
    pub kind: String,
}

/// A blueprint as written in its YAML file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Blueprint {
    /// The slug, e.g. `openstack-instance`: 1-63 of `a-z0-9-`.
    pub name: String,
    /// e.g. `v1alpha2`: 1-32 of `a-z0-9.-`.
    pub version: String,
    /// The `--kind` a resource of this blueprint is created with, e.g. `node` or `bucket`.
    pub resource_kind: String,
    pub class: Class,
    pub substrate: Substrate,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub parameters: BTreeMap<String, Param>,
    pub composite: CompositeTemplate,
}

/// Why a blueprint file was refused. `at` is `<file>` or `<file>:<line>:<column>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlueprintError {
    #[error("{at}: not a blueprint: {reason}; see docs/broker.md for the blueprint format")]
    Syntax { at: String, reason: String },
    #[error("{at}: {what}; fix the blueprint file and reload")]
    Invalid { at: String, what: String },
    #[error(
        "{at}: blueprint {name}@{version} is also defined in {first}; give one of them another version"
    )]
    Duplicate {
        at: String,
        first: String,
        name: String,
        version: String,
    },
    #[error("cannot read the blueprint file {at}: {reason}; check the path the server was given")]
    Read { at: String, reason: String },
}

fn slug_ok(s: &str, max: usize, extra: &[u8]) -> bool {
    (1..=max).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || extra.contains(&b))
        && !s.starts_with('-')
}

/// Whether a parameter name is acceptable: a letter, then letters, digits or `_` (64 at most).
fn param_name_ok(s: &str) -> bool {
    s.len() <= 64
        && s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Blueprint {
    /// Parses and checks one blueprint file's text. `file` only labels errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, BlueprintError> {
        let mut bp: Blueprint = serde_yaml::from_str(text).map_err(|e| BlueprintError::Syntax {
            at: match e.location() {
                Some(l) => format!("{file}:{}:{}", l.line(), l.column()),
                None => file.to_owned(),
            },
            reason: e.to_string(),
        })?;
        bp.check(file, text)?;
        Ok(bp)
    }

    fn check(&mut self, file: &str, text: &str) -> Result<(), BlueprintError> {
        let invalid = |key: &str, what: String| BlueprintError::Invalid {
            at: at_key(file, text, key),
            what,
        };
        if !slug_ok(&self.name, 63, b"-") {
            return Err(invalid(
                "name",
                format!("name `{}` must be 1-63 of a-z, 0-9 and `-`", self.name),
            ));
        }
        if !slug_ok(&self.version, 32, b".-") {
            return Err(invalid(
                "version",
                format!(
                    "version `{}` must be 1-32 of a-z, 0-9, `.` and `-`",
                    self.version
                ),
            ));
        }
        if !slug_ok(&self.resource_kind, 63, b"-") {
            return Err(invalid(
                "resource_kind",
                format!(
                    "resource_kind `{}` must be 1-63 of a-z, 0-9 and `-`",
                    self.resource_kind
                ),
            ));
        }
        if self.composite.api_version.trim().is_empty() || self.composite.kind.trim().is_empty() {
            return Err(invalid(
                "composite",
                "composite needs a non-empty api_version and kind".to_owned(),
            ));
        }
        for (name, p) in &mut self.parameters {
            if !param_name_ok(name) {
                return Err(invalid(
                    name,
                    format!(
                        "parameter name `{name}` must start with a letter and hold only letters, digits and `_`"
                    ),
                ));
            }
            check_param(name, p).map_err(|what| invalid(name, what))?;
        }
        Ok(())
    }

    /// The stable id of this blueprint version.
    pub fn version_id(&self) -> Uuid {
        version_id(&self.name, &self.version)
    }

    /// `<name>@<version>`.
    pub fn label(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

fn check_param(name: &str, p: &mut Param) -> Result<(), String> {
    if let Some(pattern) = &p.pattern {
        if p.ty != ParamType::String {
            return Err(format!(
                "parameter `{name}` has a pattern but is of type {}; patterns apply to strings",
                p.ty.as_str()
            ));
        }
        let anchored = format!("^(?:{pattern})$");
        let re = Regex::new(&anchored).map_err(|e| {
            format!(
                "parameter `{name}`: pattern `{pattern}` is not a valid regular expression: {e}"
            )
        })?;
        p.compiled = Some(re);
    }
    if (p.minimum.is_some() || p.maximum.is_some()) && p.ty != ParamType::Integer {
        return Err(format!(
            "parameter `{name}` has a minimum or maximum but is of type {}; bounds apply to integers",
            p.ty.as_str()
        ));
    }
    if let (Some(lo), Some(hi)) = (p.minimum, p.maximum)
        && lo > hi
    {
        return Err(format!(
            "parameter `{name}`: minimum {lo} is above maximum {hi}"
        ));
    }
    if let Some(default) = &p.default {
        if p.required {
            return Err(format!(
                "parameter `{name}` is required and has a default; drop one of them"
            ));
        }
        crate::param::check_value(name, p, default).map_err(|e| format!("its default: {e}"))?;
    }
    Ok(())
}

/// `<file>:<line>:<col>` of a top-level or nested key's first occurrence, else `<file>`.
fn at_key(file: &str, text: &str, key: &str) -> String {
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix(key)
            && rest.trim_start().starts_with(':')
        {
            let col = line.len() - trimmed.len() + 1;
            return format!("{file}:{}:{col}", i + 1);
        }
    }
    file.to_owned()
}
