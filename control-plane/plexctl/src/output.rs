//! What plexctl prints: aligned tables for people, one JSON document for scripts.
//!
//! Every renderer is a pure function from the wire view to the text, so the exact output is
//! pinned by tests. Times are RFC 3339 in UTC to the second (`2026-11-30T10:00:00Z`); an empty
//! value is `-`. JSON lists are printed as a bare array of items (not the server's
//! `{"items":[...]}`), which is what `jq '.[]'` wants.

use plexsphere_wire::admin::{DomainView, IssuedToken, ProjectView, TokenView, VersionInfo};
use plexsphere_wire::signing_keys_admin::SigningKeyView;
use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::failure::Failure;

/// `--output`: `table` (the default) or `json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// A value as `--output` asks: the table `table` makes of it, or its JSON.
pub fn render<T: Serialize + ?Sized>(
    format: Format,
    value: &T,
    table: impl FnOnce(&T) -> String,
) -> Result<String, Failure> {
    match format {
        Format::Table => Ok(table(value)),
        Format::Json => Ok(json(value)?),
    }
}

/// One JSON document, pretty-printed, ending in a newline.
pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<String, serde_json::Error> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    Ok(text)
}

/// Columns separated by two spaces, each as wide as its widest cell; no trailing spaces.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            let pad = widths
                .get(i)
                .copied()
                .unwrap_or(0)
                .saturating_sub(cell.chars().count());
            line.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `label:` / value lines with the values aligned, for one object.
pub fn details(pairs: &[(&str, String)]) -> String {
    let width = pairs
        .iter()
        .map(|(k, _)| k.chars().count() + 1)
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (key, value) in pairs {
        let label = format!("{key}:");
        out.push_str(&format!("{label:<width$}  {value}\n"));
    }
    out
}

/// RFC 3339 in UTC, to the second.
pub fn time(t: OffsetDateTime) -> String {
    let utc = t.to_offset(time::UtcOffset::UTC);
    let utc = utc.replace_nanosecond(0).unwrap_or(utc);
    utc.format(&Rfc3339).unwrap_or_else(|_| utc.to_string())
}

pub(crate) fn opt<T>(value: Option<T>, show: impl FnOnce(T) -> String) -> String {
    value.map(show).unwrap_or_else(|| "-".to_owned())
}

pub(crate) fn text(value: &str) -> String {
    if value.is_empty() {
        "-".to_owned()
    } else {
        value.to_owned()
    }
}

/// `bootstrap-token issue`: the bare token text first, alone on its line.
pub fn issued_token(t: &IssuedToken) -> String {
    let mut out = format!("{}\n", t.token);
    let mut pairs = vec![
        ("id", t.id.clone()),
        ("project", t.project_id.to_string()),
        ("kind", t.kind.as_str().to_owned()),
        ("env prefix", t.env_prefix.clone()),
        ("expires at", time(t.expires_at)),
        ("uses", uses_left(t.max_uses)),
        ("ephemeral", ephemeral(t.ephemeral_offline_secs)),
    ];
    if !t.tags.is_empty() {
        pairs.push(("tags", tags(&t.tags)));
    }
    out.push_str(&details(&pairs));
    out.push_str(
        "note: the token is shown only once; store it now (on the node: /etc/plexd/bootstrap-token, mode 0600)\n",
    );
    out
}

/// Tags as `tag:NAME` (what a policy names them by), comma-separated, or `-`.
pub(crate) fn tags(list: &[String]) -> String {
    if list.is_empty() {
        return "-".to_owned();
    }
    list.iter()
        .map(|t| format!("tag:{t}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `1 node` / `3 nodes` may register with a token.
fn uses_left(max_uses: u32) -> String {
    match max_uses {
        1 => "1 node (single use)".to_owned(),
        n => format!("up to {n} nodes"),
    }
}

/// `removed after 30m offline`, or `no`.
fn ephemeral(offline_secs: Option<u64>) -> String {
    match offline_secs {
        Some(s) => format!(
            "yes: its nodes are removed after {} offline",
            plexsphere_wire::duration::format(s)
        ),
        None => "no".to_owned(),
    }
}

/// The nodes a token made that still exist. Servers before reusable tokens send no `uses`
/// (read as 0) and no `nodes`, only the consumer of a single-use token: that one is shown.
fn token_nodes(t: &TokenView) -> String {
    if t.uses == 0 {
        return opt(t.consumed_by_node, |n| n.to_string());
    }
    if t.nodes.is_empty() {
        return "-".to_owned();
    }
    let ids: Vec<String> = t.nodes.iter().map(ToString::to_string).collect();
    ids.join(",")
}

pub fn tokens(items: &[TokenView]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|t| {
            vec![
                t.id.clone(),
                t.kind.as_str().to_owned(),
                text(&t.env_prefix),
                t.status.as_str().to_owned(),
                format!("{}/{}", t.uses, t.max_uses),
                opt(t.ephemeral_offline_secs, plexsphere_wire::duration::format),
                time(t.created_at),
                time(t.expires_at),
                token_nodes(t),
                tags(&t.tags),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "KIND",
            "ENV",
            "STATUS",
            "USES",
            "EPHEMERAL",
            "CREATED",
            "EXPIRES",
            "NODES",
            "TAGS",
        ],
        &rows,
    )
}

pub fn projects(items: &[ProjectView]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|p| {
            vec![
                p.id.to_string(),
                text(&p.slug),
                opt(p.display_name.as_deref(), text),
                opt(p.sub_range_cidr, |c| c.to_string()),
                p.domain_id.to_string(),
            ]
        })
        .collect();
    table(&["ID", "SLUG", "NAME", "SUB-RANGE", "DOMAIN"], &rows)
}

pub fn domains(items: &[DomainView]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|d| {
            vec![
                d.id.to_string(),
                text(&d.slug),
                d.mesh_cidr.to_string(),
                text(&d.signing_public_key),
            ]
        })
        .collect();
    table(&["ID", "SLUG", "MESH CIDR", "SIGNING KEY"], &rows)
}

/// A Domain's signing keys (`domain signing-keys`, and the new one of `domain rotate-key`).
pub fn signing_keys(items: &[SigningKeyView]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|k| {
            vec![
                k.generation.to_string(),
                k.status.as_str().to_owned(),
                text(&k.public_key),
                time(k.active_from),
                time(k.created_at),
            ]
        })
        .collect();
    table(
        &[
            "GENERATION",
            "STATUS",
            "PUBLIC KEY",
            "SIGNS FROM",
            "CREATED",
        ],
        &rows,
    )
}

/// `plexctl version --output json`: `{"client":{...},"server":{...} or null}`.
#[derive(Debug, Serialize)]
pub struct Versions {
    pub client: VersionInfo,
    pub server: Option<VersionInfo>,
}

pub fn versions(v: &Versions) -> String {
    let server = match &v.server {
        Some(s) => format!("{} {}", s.name, s.version),
        None => "- (no server configured)".to_owned(),
    };
    details(&[
        ("client", format!("{} {}", v.client.name, v.client.version)),
        ("server", server),
    ])
}

#[cfg(test)]
#[path = "output_tests.rs"]
mod tests;
