//! The one-shot commands: `seed apply`, `operator-token create|list|revoke`, `migrate`.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use anyhow::Context as _;
use time::OffsetDateTime;

use super::args::DataArgs;
use super::failure::Failure;
use crate::operator_tokens;
use crate::seed::{self, SeedReport};
use crate::store::Store;

/// Creates the data directory (0700) when missing, connects and migrates.
pub async fn open_store(data: &DataArgs) -> Result<Store, Failure> {
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

pub fn ensure_data_dir(dir: &Path) -> Result<(), Failure> {
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

pub fn print_seed_report(report: &SeedReport) {
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

pub async fn seed_apply(data: &DataArgs, file: &Path) -> Result<(), Failure> {
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

pub async fn token_create(data: &DataArgs, name: &str) -> Result<(), Failure> {
    let store = open_store(data).await?;
    let token = operator_tokens::create(&store, name, OffsetDateTime::now_utc())
        .await
        .context("cannot create the operator token")?;
    println!("{}", token.expose());
    store.close().await;
    Ok(())
}

pub async fn token_list(data: &DataArgs) -> Result<(), Failure> {
    let store = open_store(data).await?;
    let rows = operator_tokens::list(&store)
        .await
        .context("cannot list operator tokens")?;
    println!("{:<16}  {:<24}  {:<20}  STATUS", "ID", "NAME", "CREATED");
    for r in rows {
        let created = OffsetDateTime::from_unix_timestamp(r.created_at)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_else(|| "-".into());
        let status = if r.revoked_at.is_some() {
            "revoked"
        } else {
            "active"
        };
        println!("{:<16}  {:<24}  {:<20}  {status}", r.id, r.name, created);
    }
    store.close().await;
    Ok(())
}

pub async fn token_revoke(data: &DataArgs, id: &str) -> Result<(), Failure> {
    let store = open_store(data).await?;
    let found = operator_tokens::revoke(&store, id, OffsetDateTime::now_utc())
        .await
        .context("cannot revoke the operator token")?;
    store.close().await;
    if !found {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "no operator token with id {id}; `plexsphere operator-token list` shows them"
        )));
    }
    println!("revoked operator token {id}");
    Ok(())
}

pub async fn migrate(data: &DataArgs) -> Result<(), Failure> {
    let store = open_store(data).await?;
    println!("database schema is up to date");
    store.close().await;
    Ok(())
}
