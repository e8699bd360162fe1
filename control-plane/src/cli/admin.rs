//! The one-shot commands: `seed apply`, `operator-token create|list|revoke`, `migrate`.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use anyhow::Context as _;
use plexsphere_wire::admin::{OperatorScope, OperatorTokenStatus};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use uuid::Uuid;

use super::args::DataArgs;
use super::audit::{AuditKeyArgs, host_pepper, record_host};
use super::failure::Failure;
use crate::operator_tokens::{self, TokenSpec};
use crate::seed::{self, SeedReport};
use crate::store::{Store, projects};

/// Creates the data directory (0700) when missing, connects and migrates.
pub(crate) async fn open_store(data: &DataArgs) -> Result<Store, Failure> {
    ensure_data_dir(&data.data_dir)?;
    let url = data
        .database_url
        .clone()
        .unwrap_or_else(|| Store::sqlite_url(&data.data_dir));
    let store = Store::connect(&url)
        .await
        .with_context(|| format!("cannot open the database of {}", data.data_dir.display()))?;
    store
        .migrate()
        .await
        .context("cannot migrate the database")?;
    Ok(store)
}

pub(crate) fn ensure_data_dir(dir: &Path) -> Result<(), Failure> {
    if !dir.exists() {
        std::fs::create_dir_all(dir).map_err(|e| {
            Failure::Config(format!(
                "cannot create the data directory {}: {e}; pass --data-dir with a writable path",
                dir.display()
            ))
        })?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot set the mode of {}", dir.display()))?;
    } else if !dir.is_dir() {
        return Err(Failure::Config(format!(
            "--data-dir {} is not a directory",
            dir.display()
        )));
    }
    // Everything plexsphere keeps lives here: a full or read-only disk stops the start now,
    // with its cause and path, not at the first write a node asks for.
    crate::store::probe_writable(dir, "the data directory")
        .map_err(|e| Failure::Runtime(e.into()))?;
    Ok(())
}

pub(crate) fn print_seed_report(report: &SeedReport) {
    if report.changed() {
        for d in &report.domains_created {
            println!("created domain {d}");
        }
        for p in &report.projects_created {
            println!("created project {p}");
        }
        for p in &report.projects_updated {
            println!("updated project {p}");
        }
    } else {
        println!("seed already applied: nothing changed");
    }
}

pub(crate) async fn seed_apply(data: &DataArgs, file: &Path) -> Result<(), Failure> {
    let manifest = seed::load(file).map_err(|e| Failure::Config(e.to_string()))?;
    let store = open_store(data).await?;
    let report = seed::apply(
        &store,
        &manifest,
        &file.display().to_string(),
        OffsetDateTime::now_utc(),
    )
    .await
    .map_err(|e| Failure::Runtime(e.into()))?;
    print_seed_report(&report);
    for (what, id) in &report.ids {
        println!("{what}: {id}");
    }
    store.close().await;
    Ok(())
}

/// A project named by id or slug (a slug must name one project across the Domains).
async fn resolve_project(store: &Store, text: &str) -> Result<Uuid, Failure> {
    let mut conn = store.acquire().await.context("cannot read the projects")?;
    let all = projects::list(&mut conn)
        .await
        .context("cannot read the projects")?;
    let by_id = Uuid::parse_str(text).ok();
    let found: Vec<Uuid> = all
        .iter()
        .filter(|p| Some(p.id) == by_id || p.slug == text)
        .map(|p| p.id)
        .collect();
    match found.as_slice() {
        [one] => Ok(*one),
        [] => Err(Failure::Config(format!(
            "--project {text:?} names no project; `plexctl project list` shows them"
        ))),
        _ => Err(Failure::Config(format!(
            "--project {text:?} is the slug of several projects (in different Domains); pass the project's id"
        ))),
    }
}

/// What `plexsphere operator-token create` was asked for.
pub(crate) struct TokenArgs<'a> {
    pub name: &'a str,
    pub scope: &'a str,
    pub project: Option<&'a str>,
    pub expires_in: &'a str,
}

pub(crate) async fn token_create(
    data: &DataArgs,
    audit: &AuditKeyArgs,
    args: TokenArgs<'_>,
) -> Result<(), Failure> {
    let TokenArgs {
        name,
        scope,
        project,
        expires_in,
    } = args;
    let pepper = host_pepper(&data.data_dir, audit)?;
    let scope = OperatorScope::parse(scope).ok_or_else(|| {
        Failure::Config(format!(
            "--scope {scope:?} is not one of read-only, operator, admin"
        ))
    })?;
    let expiry = operator_tokens::parse_expires_in(expires_in)
        .map_err(|e| Failure::Config(e.to_string()))?;
    let store = open_store(data).await?;
    let project_id = match project {
        Some(p) => Some(resolve_project(&store, p).await?),
        None => None,
    };
    let spec = TokenSpec {
        name: name.to_owned(),
        scope,
        project_id,
        expiry,
    };
    spec.check().map_err(|e| Failure::Config(e.to_string()))?;
    let (token, row) = operator_tokens::create_scoped(&store, &spec, OffsetDateTime::now_utc())
        .await
        .context("cannot create the operator token")?;
    let detail = serde_json::json!({"name": row.name, "scope": row.scope, "project_id": row.project_id, "expires_at": row.expires_at});
    record_host(
        &store,
        pepper.as_ref(),
        "operator-token.create",
        format!("operator-token/{}", row.id),
        detail,
    )
    .await?;
    println!("{}", token.expose());
    store.close().await;
    Ok(())
}

fn rfc3339(t: Option<OffsetDateTime>) -> String {
    t.and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "-".into())
}

pub(crate) async fn token_list(data: &DataArgs) -> Result<(), Failure> {
    let store = open_store(data).await?;
    let rows = operator_tokens::list(&store)
        .await
        .context("cannot list operator tokens")?;
    let now = OffsetDateTime::now_utc();
    println!(
        "{:<16}  {:<24}  {:<9}  {:<36}  {:<20}  {:<20}  {:<20}  STATUS",
        "ID", "NAME", "SCOPE", "PROJECT", "CREATED", "EXPIRES", "LAST USED"
    );
    for r in rows {
        let v = operator_tokens::view(&r, crate::store::unix(now))
            .context("cannot read an operator token")?;
        let status = match (v.status, v.legacy) {
            (OperatorTokenStatus::Active, true) => {
                "active (legacy: admin, never expires; replace it)"
            }
            (OperatorTokenStatus::Active, false) => "active",
            (OperatorTokenStatus::Expired, _) => "expired",
            (OperatorTokenStatus::Revoked, _) => "revoked",
        };
        let project = v
            .project_id
            .map_or_else(|| "(all)".to_owned(), |p| p.to_string());
        let expires = match v.expires_at {
            None => "never".to_owned(),
            t => rfc3339(t),
        };
        println!(
            "{:<16}  {:<24}  {:<9}  {:<36}  {:<20}  {:<20}  {:<20}  {status}",
            v.id,
            v.name,
            v.scope.as_str(),
            project,
            rfc3339(Some(v.created_at)),
            expires,
            rfc3339(v.last_used_at),
        );
    }
    store.close().await;
    Ok(())
}

pub(crate) async fn token_revoke(
    data: &DataArgs,
    audit: &AuditKeyArgs,
    id: &str,
) -> Result<(), Failure> {
    let pepper = host_pepper(&data.data_dir, audit)?;
    let store = open_store(data).await?;
    let found = operator_tokens::revoke(&store, id, OffsetDateTime::now_utc())
        .await
        .context("cannot revoke the operator token")?;
    if found {
        let detail = serde_json::json!({});
        record_host(
            &store,
            pepper.as_ref(),
            "operator-token.revoke",
            format!("operator-token/{id}"),
            detail,
        )
        .await?;
    }
    store.close().await;
    if !found {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "no operator token with id {id}; `plexsphere operator-token list` shows them"
        )));
    }
    println!("revoked operator token {id}");
    Ok(())
}

pub(crate) async fn migrate(data: &DataArgs) -> Result<(), Failure> {
    let store = open_store(data).await?;
    println!("database schema is up to date");
    store.close().await;
    Ok(())
}
