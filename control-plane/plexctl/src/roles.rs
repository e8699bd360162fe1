//! `plexctl role bind|unbind|list` (docs/auth.md): roles bound to the issuer's subjects,
//! e-mail addresses or groups. Binding needs the admin role on the platform or the Domain.

use clap::{ArgGroup, Subcommand};
use serde_json::{Value, json};

use crate::config::Settings;
use crate::failure::Failure;
use crate::output::Format;
use crate::session::{operator_api, project_id};

#[derive(Debug, Subcommand)]
pub enum RoleCommand {
    /// Bind a role to a subject, an e-mail address or a group
    #[command(group(ArgGroup::new("scope").required(true).args(["platform", "domain", "project"])))]
    #[command(group(ArgGroup::new("who").required(true).args(["subject", "email", "group"])))]
    Bind {
        /// admin (everything in the scope), member (reads and operates), auditor (reads, audit log)
        #[arg(long, value_parser = ["admin", "auditor", "member"])]
        role: String,
        /// On the whole platform
        #[arg(long)]
        platform: bool,
        /// On one Domain (its id)
        #[arg(long, value_name = "ID")]
        domain: Option<String>,
        /// On one project (id or slug)
        #[arg(long, value_name = "PROJECT")]
        project: Option<String>,
        /// The issuer's subject (`sub`)
        #[arg(long, value_name = "SUB")]
        subject: Option<String>,
        /// A verified e-mail address
        #[arg(long, value_name = "ADDRESS")]
        email: Option<String>,
        /// A group of the issuer's groups claim
        #[arg(long, value_name = "GROUP")]
        group: Option<String>,
    },
    /// Remove a binding; sessions it carried lose the role at their next request
    Unbind {
        /// The binding's id (the ID column of `role list`)
        #[arg(value_name = "ID")]
        id: String,
    },
    /// List the bindings on the scopes you reach
    List,
}

fn row(b: &Value) -> String {
    let scope = match b["scope"]["id"].as_str() {
        Some(id) => format!("{} {id}", b["scope"]["kind"].as_str().unwrap_or_default()),
        None => "platform".to_owned(),
    };
    format!(
        "{:<16}  {:<7}  {:<46}  {}:{}\n",
        b["id"].as_str().unwrap_or_default(),
        b["role"].as_str().unwrap_or_default(),
        scope,
        b["principal_kind"].as_str().unwrap_or_default(),
        b["principal"].as_str().unwrap_or_default()
    )
}

pub async fn run(
    cmd: &RoleCommand,
    format: Format,
    settings: &Settings,
) -> Result<String, Failure> {
    let api = operator_api(settings)?;
    let answer: Value = match cmd {
        RoleCommand::List => {
            let v: Value = api.get(&["v1", "role-bindings"], &[]).await?;
            if format == Format::Json {
                return Ok(format!("{}\n", serde_json::to_string_pretty(&v["items"])?));
            }
            let mut out = format!(
                "{:<16}  {:<7}  {:<46}  {}\n",
                "ID", "ROLE", "SCOPE", "BOUND TO"
            );
            for b in v["items"].as_array().into_iter().flatten() {
                out.push_str(&row(b));
            }
            return Ok(out);
        }
        RoleCommand::Unbind { id } => {
            api.post::<(), Value>(&["v1", "role-bindings", id, "delete"], None)
                .await?
        }
        RoleCommand::Bind {
            role,
            platform,
            domain,
            project,
            subject,
            email,
            group,
        } => {
            let (scope, scope_id) = match (platform, domain, project) {
                (true, _, _) => ("platform", None),
                (_, Some(d), _) => ("domain", Some(d.clone())),
                (_, _, Some(p)) => ("project", Some(project_id(&api, p).await?.to_string())),
                _ => {
                    return Err(Failure::Usage(
                        "give --platform, --domain ID or --project ID".into(),
                    ));
                }
            };
            let (kind, who) = match (subject, email, group) {
                (Some(s), _, _) => ("subject", s),
                (_, Some(e), _) => ("email", e),
                (_, _, Some(g)) => ("group", g),
                _ => return Err(Failure::Usage("give --subject, --email or --group".into())),
            };
            let body = json!({"role": role, "scope": scope, "scope_id": scope_id, "principal_kind": kind, "principal": who});
            api.post(&["v1", "role-bindings"], Some(&body)).await?
        }
    };
    if format == Format::Json {
        Ok(format!("{}\n", serde_json::to_string_pretty(&answer)?))
    } else {
        Ok(row(&answer))
    }
}
