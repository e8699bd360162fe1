//! The broker's answers as plexctl reads them, and how it prints them.
//!
//! plexctl does not depend on the broker crate: [`ResourceView`] mirrors only the fields of
//! `plexsphere_broker::resource::Resource` it shows, and [`Resource`] keeps the server's JSON
//! object as it came, so `--output json` prints it unchanged (`jq -r '.id'`,
//! `jq -r '.provisioning.phase'`). Blueprints are read as JSON values for the same reason.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::output::{details, table, time};

/// A resource: the server's object as-is plus the fields plexctl reads from it.
#[derive(Debug, Clone)]
pub struct Resource {
    pub raw: Value,
    pub view: ResourceView,
}

impl<'de> Deserialize<'de> for Resource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Value::deserialize(d)?;
        let view = ResourceView::deserialize(&raw).map_err(D::Error::custom)?;
        Ok(Self { raw, view })
    }
}

impl Serialize for Resource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct ResourceView {
    pub id: Uuid,
    pub project_id: Uuid,
    pub kind: String,
    #[serde(default)]
    pub origin: Option<String>,
    #[serde(default)]
    pub blueprint_version_id: Option<Uuid>,
    #[serde(default)]
    pub cloud_credential_id: Option<Uuid>,
    #[serde(default)]
    pub node_id: Option<Uuid>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub created_at: Option<OffsetDateTime>,
    pub provisioning: ProvisioningView,
}

/// The `provisioning` object: the phase, why it failed, and what was observed when.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ProvisioningView {
    pub phase: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub observed_at: OffsetDateTime,
    #[serde(default)]
    pub history: Vec<HistoryView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct HistoryView {
    pub phase: String,
    #[serde(default)]
    pub observed: String,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
}

/// A cloud credential as the server shows it (never its payload).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CredentialView {
    pub id: Uuid,
    pub name: String,
    pub provider: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub revoked_at: Option<OffsetDateTime>,
}

/// `{"items":[...]}` of JSON values, printed as a bare array.
#[derive(Debug, Deserialize)]
pub struct Items<T> {
    pub items: Vec<T>,
}

fn dash(value: Option<String>) -> String {
    match value {
        Some(v) if !v.is_empty() => v,
        _ => "-".to_owned(),
    }
}

/// `resource create`: one row, what a script or a person needs next.
pub fn created(r: &Resource) -> String {
    let v = &r.view;
    table(
        &["ID", "KIND", "PHASE", "PROJECT"],
        &[vec![
            v.id.to_string(),
            v.kind.clone(),
            v.provisioning.phase.clone(),
            v.project_id.to_string(),
        ]],
    )
}

pub fn resources(items: &[Resource]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|r| {
            let v = &r.view;
            vec![
                v.id.to_string(),
                v.kind.clone(),
                v.provisioning.phase.clone(),
                time(v.provisioning.observed_at),
                dash(v.node_id.map(|n| n.to_string())),
                v.project_id.to_string(),
            ]
        })
        .collect();
    table(&["ID", "KIND", "PHASE", "SINCE", "NODE", "PROJECT"], &rows)
}

/// `resource get` and `resource delete`: the fields, then the phase history.
pub fn resource(r: &Resource) -> String {
    let v = &r.view;
    let p = &v.provisioning;
    let parameters = r
        .raw
        .get("parameters")
        .map(Value::to_string)
        .filter(|s| s != "{}" && s != "null");
    let mut out = details(&[
        ("id", v.id.to_string()),
        ("kind", v.kind.clone()),
        ("origin", dash(v.origin.clone())),
        ("phase", p.phase.clone()),
        ("since", time(p.observed_at)),
        ("reason", dash(p.reason.clone())),
        ("project", v.project_id.to_string()),
        (
            "blueprint version",
            dash(v.blueprint_version_id.map(|b| b.to_string())),
        ),
        (
            "cloud credential",
            dash(v.cloud_credential_id.map(|c| c.to_string())),
        ),
        ("parameters", dash(parameters)),
        ("node", dash(v.node_id.map(|n| n.to_string()))),
        ("created", dash(v.created_at.map(time))),
    ]);
    if !p.history.is_empty() {
        out.push_str("history:\n");
        let width = p.history.iter().map(|h| h.phase.chars().count()).max();
        let width = width.unwrap_or(0);
        for h in &p.history {
            let line = format!("  {}  {:<width$}  {}", time(h.at), h.phase, h.observed);
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}

pub fn credentials(items: &[CredentialView]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|c| {
            vec![
                c.id.to_string(),
                dash(Some(c.name.clone())),
                c.provider.clone(),
                time(c.created_at),
                dash(c.revoked_at.map(time)),
            ]
        })
        .collect();
    table(&["ID", "NAME", "PROVIDER", "CREATED", "REVOKED"], &rows)
}

/// `blueprint list`: one row per version. REQUIRED PARAMETERS names the parameters without
/// which `resource create` is refused.
pub fn blueprints(items: &[Value]) -> String {
    let field = |b: &Value, key: &str| dash(b.get(key).map(scalar));
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|b| {
            vec![
                field(b, "version_id"),
                field(b, "name"),
                field(b, "version"),
                field(b, "resource_kind"),
                field(b, "class"),
                field(b, "substrate"),
                dash(Some(required_parameters(b.get("parameters")).join(","))),
            ]
        })
        .collect();
    table(
        &[
            "VERSION ID",
            "NAME",
            "VERSION",
            "KIND",
            "CLASS",
            "SUBSTRATE",
            "REQUIRED PARAMETERS",
        ],
        &rows,
    )
}

/// A JSON value as a cell: strings without quotes, anything else as JSON.
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The names of the required parameters, from `{"name": {"required": true, ...}}` (the
/// catalog's shape) or `[{"name": "...", "required": true}]`, sorted.
pub fn required_parameters(parameters: Option<&Value>) -> Vec<String> {
    let required = |p: &Value| p.get("required").and_then(Value::as_bool) == Some(true);
    let mut names: Vec<String> = match parameters {
        Some(Value::Object(map)) => map
            .iter()
            .filter(|(_, p)| required(p))
            .map(|(name, _)| name.clone())
            .collect(),
        Some(Value::Array(list)) => list
            .iter()
            .filter(|p| required(p))
            .filter_map(|p| p.get("name").and_then(Value::as_str).map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    names.sort();
    names
}

#[cfg(test)]
#[path = "broker_output_tests.rs"]
mod tests;
