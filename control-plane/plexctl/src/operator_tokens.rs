//! `plexctl whoami` (the calling token: scope, project, expiry, last use) and
//! `plexctl operator-token list|create|revoke` (admin tokens only, through the API).

use clap::Subcommand;
use plexsphere_wire::admin::{
    CreateOperatorToken, CreatedOperatorToken, List, OperatorScope, OperatorTokenStatus,
    OperatorTokenView,
};

use crate::config::Settings;
use crate::failure::Failure;
use crate::output::{Format, details, render, table, time};
use crate::session::{operator_api, project_id};

#[derive(Debug, Subcommand)]
pub enum OperatorTokenCommand {
    /// List every operator token with its scope, project, expiry and last use (needs admin)
    List,
    /// Create an operator token; its text is shown this once (needs admin)
    Create {
        /// A name that says who or what uses the token
        #[arg(long, value_name = "NAME")]
        name: String,
        /// read-only (GET only), operator (bootstrap tokens, nodes, resources) or admin
        #[arg(long, default_value = "operator", value_parser = ["read-only", "operator", "admin"])]
        scope: String,
        /// Limit the token to one project (id or slug); not for admin tokens
        #[arg(long, value_name = "PROJECT")]
        project: Option<String>,
        /// When the token stops working: 90d, 12h, 1d12h... or `never` (admin only) [default: 90d]
        #[arg(long, value_name = "DURATION")]
        expires_in: Option<String>,
    },
    /// Revoke an operator token (needs admin)
    Revoke {
        /// The token's id (the ID column of `operator-token list`)
        #[arg(value_name = "ID")]
        id: String,
    },
}

/// `whoami`: the calling token.
pub async fn whoami(format: Format, settings: &Settings) -> Result<String, Failure> {
    let me: OperatorTokenView = operator_api(settings)?
        .get(&["v1", "operator-tokens", "self"], &[])
        .await?;
    render(format, &me, token)
}

pub async fn run(
    cmd: &OperatorTokenCommand,
    format: Format,
    settings: &Settings,
) -> Result<String, Failure> {
    match cmd {
        OperatorTokenCommand::List => {
            let list: List<OperatorTokenView> = operator_api(settings)?
                .get(&["v1", "operator-tokens"], &[])
                .await?;
            render(format, list.items.as_slice(), tokens)
        }
        OperatorTokenCommand::Create {
            name,
            scope,
            project,
            expires_in,
        } => {
            let scope = OperatorScope::parse(scope).ok_or_else(|| {
                Failure::Usage(format!(
                    "--scope `{scope}` is not one of read-only, operator, admin"
                ))
            })?;
            let api = &operator_api(settings)?;
            let project_id = match project {
                Some(p) => Some(project_id(api, p).await?),
                None => None,
            };
            let request = CreateOperatorToken {
                name: name.clone(),
                scope,
                project_id,
                expires_in: expires_in.clone(),
            };
            let created: CreatedOperatorToken =
                api.post(&["v1", "operator-tokens"], Some(&request)).await?;
            render(format, &created, created_token)
        }
        OperatorTokenCommand::Revoke { id } => {
            let id = id.trim();
            if id.len() != 16 || !id.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(Failure::Usage(format!(
                    "`{id}` is not an operator token id (16 hex characters, the ID column of `plexctl operator-token list`; not the token text)"
                )));
            }
            let view: OperatorTokenView = operator_api(settings)?
                .post::<(), _>(&["v1", "operator-tokens", id, "revoke"], None)
                .await?;
            render(format, &view, token)
        }
    }
}

fn status(t: &OperatorTokenView) -> &'static str {
    match (t.status, t.legacy) {
        (OperatorTokenStatus::Active, true) => "active (legacy)",
        (OperatorTokenStatus::Active, false) => "active",
        (OperatorTokenStatus::Expired, _) => "expired",
        (OperatorTokenStatus::Revoked, _) => "revoked",
    }
}

fn project(t: &OperatorTokenView) -> String {
    t.project_id
        .map_or_else(|| "(all)".to_owned(), |p| p.to_string())
}

fn expires(t: &OperatorTokenView) -> String {
    t.expires_at.map_or_else(|| "never".to_owned(), time)
}

fn last_used(t: &OperatorTokenView) -> String {
    t.last_used_at.map_or_else(|| "never".to_owned(), time)
}

/// One token, label by label (`whoami`, `revoke`).
pub fn token(t: &OperatorTokenView) -> String {
    let mut out = details(&[
        ("id", t.id.clone()),
        ("name", t.name.clone()),
        ("scope", t.scope.as_str().to_owned()),
        ("project", project(t)),
        ("status", status(t).to_owned()),
        ("created at", time(t.created_at)),
        ("expires at", expires(t)),
        ("last used", last_used(t)),
    ]);
    if t.legacy {
        out.push_str(
            "note: a legacy token (from before scopes): admin, never expires; create a scoped one and revoke this\n",
        );
    }
    out
}

/// `operator-token list`.
pub fn tokens(items: &[OperatorTokenView]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|t| {
            vec![
                t.id.clone(),
                t.name.clone(),
                t.scope.as_str().to_owned(),
                project(t),
                status(t).to_owned(),
                expires(t),
                last_used(t),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "NAME",
            "SCOPE",
            "PROJECT",
            "STATUS",
            "EXPIRES",
            "LAST USED",
        ],
        &rows,
    )
}

/// `operator-token create`: the bare token text first, alone on its line.
pub fn created_token(c: &CreatedOperatorToken) -> String {
    let mut out = format!("{}\n", c.token);
    out.push_str(&token(&c.view));
    out.push_str(
        "note: the token is shown only once; store it now (a file of mode 0600 for --token-file)\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;
    use uuid::Uuid;

    fn view(legacy: bool) -> OperatorTokenView {
        OperatorTokenView {
            id: "0123456789abcdef".into(),
            name: "ci".into(),
            scope: if legacy {
                OperatorScope::Admin
            } else {
                OperatorScope::ReadOnly
            },
            project_id: (!legacy).then(|| Uuid::from_u128(2)),
            legacy,
            status: OperatorTokenStatus::Active,
            created_at: datetime!(2026-11-30 10:00 UTC),
            expires_at: (!legacy).then_some(datetime!(2027-02-28 10:00 UTC)),
            last_used_at: (!legacy).then_some(datetime!(2026-12-01 08:30 UTC)),
            revoked_at: None,
        }
    }

    #[test]
    fn the_list_shows_scope_project_expiry_and_last_use() {
        let text = tokens(&[view(false), view(true)]);
        assert_eq!(
            text,
            "ID                NAME  SCOPE      PROJECT                               STATUS           EXPIRES               LAST USED\n\
             0123456789abcdef  ci    read-only  00000000-0000-0000-0000-000000000002  active           2027-02-28T10:00:00Z  2026-12-01T08:30:00Z\n\
             0123456789abcdef  ci    admin      (all)                                 active (legacy)  never                 never\n"
        );
    }

    #[test]
    fn whoami_flags_a_legacy_token() {
        let text = token(&view(true));
        assert!(text.contains("scope:       admin\n"), "{text}");
        assert!(text.contains("expires at:  never\n"), "{text}");
        assert!(text.contains("note: a legacy token"), "{text}");
        assert!(!token(&view(false)).contains("legacy"));
    }
}
