//! One function per subcommand: check the operator's input, call the API, render the answer.
//! Each returns the exact text for stdout; `main` prints it and maps failures to exit codes.

use plexsphere_wire::admin::{
    DomainView, IssueTokenRequest, IssuedToken, List, NodeView, ObservationList, ProjectView,
    TokenView, VersionInfo,
};
use plexsphere_wire::node::{UdpOffload, UdpOffloadRequest};
use plexsphere_wire::secret::{TokenKind, valid_env_prefix};
use plexsphere_wire::signing_keys_admin::{
    MAX_OVERLAP_SECS, RotateSigningKeyRequest, SigningKeyView,
};

use crate::broker;
use crate::cli::{Command, DomainCommand, ListCommand, NodeCommand, TokenCommand};
use crate::client::Api;
use crate::config::Settings;
use crate::failure::Failure;
use crate::names::node_id;
use crate::node_output;
use crate::observations;
use crate::operator_tokens;
use crate::output::{self, Format, render};
use crate::session::project_id;
use crate::session::{confirm, operator_api};
use plexsphere_wire::duration;

/// Runs one command and answers what to print on stdout.
pub async fn run(
    command: &Command,
    format: Format,
    settings: &Settings,
) -> Result<String, Failure> {
    match command {
        Command::Version => version(format, settings).await,
        Command::Whoami => operator_tokens::whoami(format, settings).await,
        Command::OperatorToken(cmd) => operator_tokens::run(cmd, format, settings).await,
        Command::Login { no_device } => crate::login::login(settings, *no_device).await,
        Command::Logout => crate::login::logout(settings).await,
        Command::Role(cmd) => crate::roles::run(cmd, format, settings).await,
        Command::BootstrapToken(cmd) => tokens(cmd, format, settings).await,
        Command::Node(cmd) => nodes(cmd, format, settings).await,
        Command::Project(ListCommand::List) => {
            let list: List<ProjectView> = operator_api(settings)?
                .get(&["v1", "projects"], &[])
                .await?;
            render(format, list.items.as_slice(), output::projects)
        }
        Command::Resource(cmd) => broker::resources(cmd, format, settings).await,
        Command::CloudCredential(cmd) => broker::credentials(cmd, format, settings).await,
        Command::Blueprint(ListCommand::List) => broker::blueprints(format, settings).await,
        Command::Domain(cmd) => domains(cmd, format, settings).await,
        Command::Policy(cmd) => crate::policy::run(cmd, format, settings).await,
        Command::Dns(cmd) => crate::routes::dns(cmd, format, settings).await,
        Command::Route(cmd) => crate::routes::run(cmd, format, settings).await,
        Command::Audit(cmd) => crate::audit::run(cmd, format, settings).await,
    }
}

async fn domains(
    cmd: &DomainCommand,
    format: Format,
    settings: &Settings,
) -> Result<String, Failure> {
    match cmd {
        DomainCommand::List => {
            let list: List<DomainView> =
                operator_api(settings)?.get(&["v1", "domains"], &[]).await?;
            render(format, list.items.as_slice(), output::domains)
        }
        DomainCommand::SigningKeys { domain } => {
            let list: List<SigningKeyView> = operator_api(settings)?
                .get(&["v1", "domains", domain, "signing-keys"], &[])
                .await?;
            render(format, list.items.as_slice(), output::signing_keys)
        }
        DomainCommand::RotateKey { domain, overlap } => {
            let body = RotateSigningKeyRequest {
                overlap_secs: Some(overlap_secs(overlap)?),
            };
            let key: SigningKeyView = operator_api(settings)?
                .post(&["v1", "domains", domain, "signing-keys"], Some(&body))
                .await?;
            render(format, &key, |k| {
                output::signing_keys(std::slice::from_ref(k))
            })
        }
    }
}

/// `--overlap`: a duration of 0s to the server's 30 days, checked before the server is asked.
fn overlap_secs(text: &str) -> Result<u64, Failure> {
    let rules = duration::Rules {
        bare_seconds: false,
        zero: true,
    };
    let secs =
        duration::parse_with(text, rules).map_err(|e| Failure::Usage(format!("--overlap: {e}")))?;
    if secs > MAX_OVERLAP_SECS {
        return Err(Failure::Usage(format!(
            "--overlap {text} is longer than the 30d a rotation may last; give 0s to 30d"
        )));
    }
    Ok(secs)
}

async fn version(format: Format, settings: &Settings) -> Result<String, Failure> {
    let client = VersionInfo {
        name: "plexctl".to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
    };
    // `/v1/version` is public: no token needed, and no server configured is not an error.
    let server = match settings.server {
        None => None,
        Some(_) => {
            let ca_file = settings.ca_file.as_ref().map(|(path, _)| path.as_path());
            let api = Api::new(settings.server_url()?, None, ca_file)?;
            Some(api.get::<VersionInfo>(&["v1", "version"], &[]).await?)
        }
    };
    render(
        format,
        &output::Versions { client, server },
        output::versions,
    )
}

/// Each arm checks the operator's arguments before it needs the server or the token.
async fn tokens(
    cmd: &TokenCommand,
    format: Format,
    settings: &Settings,
) -> Result<String, Failure> {
    match cmd {
        TokenCommand::Issue {
            project,
            kind,
            env_prefix,
            ttl,
            uses,
            ephemeral,
            ephemeral_offline,
            tags,
        } => {
            let ephemeral = ephemeral.then_some(ephemeral_offline.as_str());
            let mut request = issue_request(kind, env_prefix, ttl, *uses, ephemeral)?;
            request.tags = crate::tags::checked_tags(tags)?;
            let api = &operator_api(settings)?;
            let project = project_id(api, project).await?;
            let path = ["v1", "projects", &project.to_string(), "bootstrap-tokens"];
            let issued: IssuedToken = api.post(&path, Some(&request)).await?;
            render(format, &issued, output::issued_token)
        }
        TokenCommand::List { project } => {
            let api = &operator_api(settings)?;
            let project = project_id(api, project).await?;
            let path = ["v1", "projects", &project.to_string(), "bootstrap-tokens"];
            let list: List<TokenView> = api.get(&path, &[]).await?;
            render(format, list.items.as_slice(), output::tokens)
        }
        TokenCommand::Revoke { id, id_flag } => {
            let id = token_id(id.as_deref().or(id_flag.as_deref()))?;
            let view: TokenView = operator_api(settings)?
                .post::<(), _>(&["v1", "bootstrap-tokens", id, "revoke"], None)
                .await?;
            render(format, &view, |v| output::tokens(std::slice::from_ref(v)))
        }
    }
}

async fn nodes(cmd: &NodeCommand, format: Format, settings: &Settings) -> Result<String, Failure> {
    match cmd {
        NodeCommand::List { project } => {
            let api = &operator_api(settings)?;
            let project = match project {
                Some(p) => Some(project_id(api, p).await?.to_string()),
                None => None,
            };
            let query: Vec<(&str, &str)> =
                project.iter().map(|p| ("project_id", p.as_str())).collect();
            let list: List<NodeView> = api.get(&["v1", "nodes"], &query).await?;
            render(format, list.items.as_slice(), node_output::nodes)
        }
        NodeCommand::Get { id } => {
            let api = &operator_api(settings)?;
            let id = node_id(api, id).await?;
            let node: NodeView = api.get(&["v1", "nodes", &id.to_string()], &[]).await?;
            render(format, &node, node_output::node)
        }
        NodeCommand::Observations { id, limit, kind } => {
            let api = &operator_api(settings)?;
            let id = node_id(api, id).await?.to_string();
            let limit = limit.map(|n| n.to_string());
            let mut query: Vec<(&str, &str)> = Vec::new();
            if let Some(n) = &limit {
                query.push(("limit", n));
            }
            if let Some(k) = kind {
                query.push(("kind", k));
            }
            let list: ObservationList = api
                .get(&["v1", "nodes", &id, "observations"], &query)
                .await?;
            render(format, &list, observations::render)
        }
        NodeCommand::Revoke { id, yes } => {
            let api = &operator_api(settings)?;
            let id = node_id(api, id).await?;
            let path = ["v1", "nodes", &id.to_string()];
            if !yes {
                let node: NodeView = api.get(&path, &[]).await?;
                confirm_revoke(&node)?;
            }
            let node: NodeView = api
                .post::<(), _>(&["v1", "nodes", &id.to_string(), "revoke"], None)
                .await?;
            render(format, &node, node_output::node)
        }
        NodeCommand::RotateKey { id } | NodeCommand::RotateCredential { id } => {
            let api = &operator_api(settings)?;
            let id = node_id(api, id).await?.to_string();
            let what = match cmd {
                NodeCommand::RotateKey { .. } => "rotate-key",
                _ => "rotate-credential",
            };
            let node: NodeView = api.post::<(), _>(&["v1", "nodes", &id, what], None).await?;
            render(format, &node, node_output::node)
        }
        NodeCommand::Rename { id, name } => {
            plexsphere_wire::routes::check_label(name)
                .map_err(|e| crate::failure::Failure::Usage(e.to_string()))?;
            let api = &operator_api(settings)?;
            let id = node_id(api, id).await?.to_string();
            let body = plexsphere_wire::routes::RenameRequest { name: name.clone() };
            let node: NodeView = api.put(&["v1", "nodes", &id, "name"], &body).await?;
            render(format, &node, node_output::node)
        }
        NodeCommand::Tag { id, tags } => {
            let change = crate::tags::TagChange::Add(tags);
            let node = crate::tags::tag_node(settings, id, change).await?;
            render(format, &node, node_output::node)
        }
        NodeCommand::Untag { id, tags, all } => {
            let change = if *all {
                crate::tags::TagChange::Clear
            } else {
                crate::tags::TagChange::Remove(tags)
            };
            let node = crate::tags::tag_node(settings, id, change).await?;
            render(format, &node, node_output::node)
        }
        NodeCommand::Set { id, udp_offload } => {
            let api = &operator_api(settings)?;
            let id = node_id(api, id).await?.to_string();
            // clap allows only on, off and default; default is no setting.
            let body = UdpOffloadRequest {
                udp_offload: UdpOffload::parse(udp_offload),
            };
            let node: NodeView = api.put(&["v1", "nodes", &id, "udp-offload"], &body).await?;
            render(format, &node, node_output::node)
        }
    }
}

/// Asks on the terminal before revoking; without a terminal, `--yes` is required.
fn confirm_revoke(node: &NodeView) -> Result<(), Failure> {
    confirm(
        &format!("revoke node {}", node.id),
        &format!(
            "revoke node {} ({}, {})? Its credential stops working and its peers drop it.",
            node.id,
            node.name(),
            node.mesh_ip
        ),
        &format!("not revoked: node {} is unchanged", node.id),
    )
}

/// The most nodes one bootstrap token may make (the server's limit too).
pub const MAX_USES: u32 = 1_000;

/// Checks `bootstrap-token issue`'s arguments before anything is sent. `ephemeral` is the
/// `--ephemeral-offline` text when `--ephemeral` is given.
pub fn issue_request(
    kind: &str,
    env_prefix: &str,
    ttl: &str,
    uses: u32,
    ephemeral: Option<&str>,
) -> Result<IssueTokenRequest, Failure> {
    let kind = TokenKind::parse(kind).ok_or_else(|| {
        Failure::Usage(format!(
            "--kind `{kind}` is not a token kind; the only kind is node"
        ))
    })?;
    if !valid_env_prefix(env_prefix) {
        return Err(Failure::Usage(format!(
            "--env-prefix `{env_prefix}` must be 1-16 characters of a-z and 0-9, e.g. lab"
        )));
    }
    let ttl_secs = duration::parse(ttl).map_err(|e| Failure::Usage(format!("--ttl: {e}")))?;
    if !(1..=MAX_USES).contains(&uses) {
        return Err(Failure::Usage(format!(
            "--uses {uses} is out of range: a token may make 1 to {MAX_USES} nodes; issue several tokens for a larger group"
        )));
    }
    let ephemeral_offline_secs = ephemeral
        .map(|text| {
            duration::parse(text).map_err(|e| Failure::Usage(format!("--ephemeral-offline: {e}")))
        })
        .transpose()?;
    Ok(IssueTokenRequest {
        kind,
        env_prefix: env_prefix.to_owned(),
        ttl_secs,
        max_uses: (uses != 1).then_some(uses),
        ephemeral_offline_secs,
        tags: Vec::new(),
    })
}

/// A token id as `bootstrap-token list` shows it: letters and digits only.
pub fn token_id(given: Option<&str>) -> Result<&str, Failure> {
    let id = given.map(str::trim).unwrap_or_default();
    if id.is_empty() || id.len() > 64 || !id.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(Failure::Usage(format!(
            "`{id}` is not a bootstrap token id; give the ID column of `plexctl bootstrap-token list` (not the token text)"
        )));
    }
    Ok(id)
}

#[cfg(test)]
#[path = "commands_tests.rs"]
mod tests;
