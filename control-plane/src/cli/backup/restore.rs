//! `plexsphere restore`: a backup back into an empty data directory (the manifest's MAC, every
//! file and every path checked before the first write), or, with `--database-url`, the keys
//! and files kept beside a Postgres dump.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sqlx::Row as _;

use super::files::{
    self, check_tree, check_write_path, copy_private, create_dirs_below, sha256_file,
};
use super::manifest::{self, MANIFEST_LIMIT, Manifest, Parsed};
use super::{DB_FILE, KekFound, MANIFEST, advance_logs, check_keys, outside_kek};
use crate::cli::admin::ensure_data_dir;
use crate::cli::args::DataArgs;
use crate::cli::failure::Failure;
use crate::keys::Kek;
use crate::keys::kek::{CREDENTIAL_NAME, DEV_KEK_FILE};
use crate::store::{Store, events};

pub(crate) async fn restore(
    from: &Path,
    data: &DataArgs,
    kek_file: Option<&Path>,
    allow_unkeyed: bool,
) -> Result<(), Failure> {
    if let Some(url) = &data.database_url {
        check_tree(from)?;
        let kek = crate::cli::keys::restore_kek(kek_file, from, &data.data_dir)?;
        return restore_external(from, data, url, kek).await;
    }
    // Everything is checked before the first write: the manifest's MAC, every file, the tree.
    check_tree(from)?;
    let manifest_path = from.join(MANIFEST);
    let text = files::read_small(&manifest_path, MANIFEST_LIMIT).map_err(|e| match e {
        Failure::Runtime(e) => Failure::Runtime(anyhow::anyhow!(
            "{e:#}; pass --from the directory plexsphere backup wrote"
        )),
        other => other,
    })?;
    let outside = outside_kek(kek_file, &data.data_dir)?;
    let (m, kek) = match manifest::parse(&text, &manifest_path)? {
        Parsed::Unkeyed(m) => {
            if !allow_unkeyed {
                return Err(Failure::Config(format!(
                    "{} is an unkeyed manifest of an older plexsphere (format 1): it finds damage but not a file changed together with its line; restore it only from a copy nobody else could write, with --allow-unkeyed-backup (or take a new backup); nothing was written",
                    manifest_path.display()
                )));
            }
            eprintln!(
                "warning: --allow-unkeyed-backup: {} has no MAC; its files are checked against their SHA-256 only (damage, not tampering)",
                manifest_path.display()
            );
            let kek = match outside {
                Some(k) => Some(KekFound::Outside(k)),
                None => backup_kek(from, &m)?.map(KekFound::InBackup),
            };
            (m, kek)
        }
        Parsed::Keyed {
            manifest: m,
            body,
            kek_id,
            mac,
        } => {
            let kek = match outside {
                Some(k) => KekFound::Outside(k),
                None => match backup_kek(from, &m)? {
                    Some(k) => KekFound::InBackup(k),
                    None => {
                        return Err(Failure::Config(format!(
                            "the manifest {} is keyed under the key-encryption key of the server that made the backup, and the backup does not hold it (it is a secret, left out without --include-secrets): pass --key-encryption-key-file with it (plexsphere dev: the old data directory's {DEV_KEK_FILE}; serve: the file of its --key-encryption-key-file or credential {CREDENTIAL_NAME}); nothing was written",
                            manifest_path.display()
                        )));
                    }
                },
            };
            let (KekFound::Outside(k) | KekFound::InBackup(k)) = &kek;
            manifest::verify(&body, &kek_id, &mac, k, &manifest_path)?;
            if let KekFound::InBackup(k) = &kek {
                eprintln!(
                    "warning: the manifest was checked under the key-encryption key inside the backup ({}): that finds damage, not a change by whoever could write the backup; pass --key-encryption-key-file with the KEK kept apart to check that",
                    k.origin()
                );
            }
            (m, Some(kek))
        }
    };
    for e in &m.files {
        let (sha256, size) = sha256_file(&from.join(&e.path))?;
        if sha256 != e.sha256 || e.size.is_some_and(|s| s != size) {
            return Err(Failure::Runtime(anyhow::anyhow!(
                "{} does not match the backup's manifest (SHA-256 {sha256}, {size} bytes; manifest {}); the backup was changed or damaged, nothing was written",
                from.join(&e.path).display(),
                e.sha256
            )));
        }
    }
    if m.file(Path::new(DB_FILE)).is_none() {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "{} lists no {DB_FILE}",
            manifest_path.display()
        )));
    }
    // The KEK given from outside goes where plexsphere dev reads it, when the backup left
    // dev's file out.
    let write_kek = match &kek {
        Some(KekFound::Outside(k))
            if m.omitted.iter().any(|p| p == Path::new(DEV_KEK_FILE))
                && fs::symlink_metadata(data.data_dir.join(DEV_KEK_FILE)).is_err() =>
        {
            Some(k.clone())
        }
        _ => None,
    };
    for rel in m
        .files
        .iter()
        .map(|e| e.path.as_path())
        .chain(write_kek.as_ref().map(|_| Path::new(DEV_KEK_FILE)))
    {
        check_write_path(&data.data_dir, rel)?;
    }
    let db = data.data_dir.join(DB_FILE);
    if fs::symlink_metadata(&db).is_ok() {
        return Err(Failure::Config(format!(
            "{} already holds a database; restore into an empty data directory, or move {} away first",
            data.data_dir.display(),
            db.display()
        )));
    }
    let kek = kek.map(|(KekFound::Outside(k) | KekFound::InBackup(k))| k);
    let summary = check_keys(from, kek.as_ref(), false).await?;

    ensure_data_dir(&data.data_dir)?;
    for e in &m.files {
        if let Some(parent) = e.path.parent() {
            create_dirs_below(&data.data_dir, parent)?;
        }
        copy_private(
            &from.join(&e.path),
            &data.data_dir.join(&e.path),
            Some((&e.sha256, e.size)),
        )?;
    }
    if let Some(k) = &write_kek {
        let path = data.data_dir.join(DEV_KEK_FILE);
        k.write_new(&path)
            .map_err(|e| Failure::Config(e.to_string()))?;
        eprintln!(
            "wrote the key-encryption key {} to {} (where plexsphere dev reads it)",
            k.origin(),
            path.display()
        );
    }
    let store = Store::connect(&Store::sqlite_url(&data.data_dir))
        .await
        .context("cannot open the restored database")?;
    store
        .migrate()
        .await
        .context("cannot bring the restored database's schema up to date")?;
    let domains = advance_logs(&store).await?;
    store.close().await;
    for rel in &m.omitted {
        eprintln!("{}", left_out(rel, &data.data_dir));
    }
    println!(
        "restored {} into {}: {}; every Domain's event log moved {} ahead ({domains} Domains) so that nodes take the restored state as newer than what they saw; start plexsphere with --data-dir {}",
        from.display(),
        data.data_dir.display(),
        summary,
        events::RESTORE_SEQ_GAP,
        data.data_dir.display()
    );
    Ok(())
}

/// The KEK file a backup taken with `--include-secrets` holds (listed in its manifest).
fn backup_kek(from: &Path, m: &Manifest) -> Result<Option<Kek>, Failure> {
    if m.file(Path::new(DEV_KEK_FILE)).is_none() {
        return Ok(None);
    }
    // check_tree refused symlinks; read_small opens without following.
    let path = from.join(DEV_KEK_FILE);
    files::read_small(&path, 4096)?;
    Kek::read(&path)
        .map(Some)
        .map_err(|e| Failure::Config(e.to_string()))
}

/// What a restore says about a secret the backup left out.
fn left_out(rel: &Path, data_dir: &Path) -> String {
    let dst = data_dir.join(rel);
    let then = if rel == Path::new(DEV_KEK_FILE) {
        "the key-encryption key given was written there (above), or was there already".to_owned()
    } else if rel.starts_with("domain-keys") {
        "not needed: the database holds the Domain's key, sealed (checked above)".to_owned()
    } else if rel == Path::new(crate::audit::pepper::DEV_PEPPER_FILE) {
        format!(
            "copy it from the old data directory to {} (mode 0600) before plexsphere dev starts, or dev makes a new one and `plexctl audit verify` reports every older row as not written by plexsphere (their MACs were made under the old pepper)",
            dst.display()
        )
    } else if rel == Path::new("operator-token") {
        "plexsphere dev makes a new admin operator token at its start; the old one keeps working for whoever holds it until `plexsphere operator-token revoke`".to_owned()
    } else if rel == Path::new("tls/ca.key") {
        format!(
            "copy it from the old data directory to {} (mode 0600) before plexsphere dev starts, or dev makes a new lab CA the nodes do not trust (they would have to enrol again)",
            dst.display()
        )
    } else {
        format!(
            "copy it from the old data directory to {} (mode 0600) before plexsphere dev starts, or dev makes a new certificate (under the lab CA when its key is there)",
            dst.display()
        )
    };
    format!(
        "left out of the backup (a secret): {}: {then}",
        rel.display()
    )
}

/// The restore of a database plexsphere does not hold itself (Postgres): the operator restored
/// it (`pg_restore`), and the sealed Domain keys with it; this checks that every Domain of the
/// database has its key and that the KEK opens it, brings `plexsphere dev`'s KEK file and any
/// older seed files from `from` into the data directory (never over different ones), migrates
/// and moves the event logs ahead.
async fn restore_external(
    from: &Path,
    data: &DataArgs,
    url: &str,
    kek: Option<crate::keys::Kek>,
) -> Result<(), Failure> {
    let store = Store::connect(url)
        .await
        .context("cannot open the restored database (--database-url)")?;
    store
        .migrate()
        .await
        .context("cannot bring the restored database's schema up to date")?;
    let slugs: Vec<String> = sqlx::query("SELECT slug FROM domains ORDER BY slug")
        .fetch_all(store.pool())
        .await
        .context("cannot read the Domains of the restored database")?
        .iter()
        .map(|r| r.try_get::<String, _>("slug"))
        .collect::<Result<_, _>>()
        .context("cannot read the Domains of the restored database")?;
    {
        let mut conn = store
            .acquire()
            .await
            .context("cannot open the restored database")?;
        crate::cli::keys::check_domain_keys(&mut conn, from, kek.as_ref(), false).await?;
    }
    // dev's KEK file and older seed files, as relative paths: the same below --from and the
    // data directory. Nothing is followed on either side.
    let rels = std::iter::once(PathBuf::from(DEV_KEK_FILE)).chain(
        slugs
            .iter()
            .map(|slug| Path::new("domain-keys").join(format!("{slug}.seed"))),
    );
    for rel in rels {
        if files::plain_relative(&rel.to_string_lossy()).is_none() {
            return Err(Failure::Config(format!(
                "{} is not a plain relative path (a Domain slug with `/` or `..`?); the restored database is not plexsphere's",
                rel.display()
            )));
        }
        let (src, dst) = (from.join(&rel), data.data_dir.join(&rel));
        if fs::symlink_metadata(&src).is_err() {
            continue;
        }
        check_write_path(&data.data_dir, &rel)?;
        if fs::symlink_metadata(&dst).is_ok() {
            if sha256_file(&dst)? != sha256_file(&src)? {
                return Err(Failure::Config(format!(
                    "{} holds another key than {}; move it away first if the backup's key is the one the nodes trust",
                    dst.display(),
                    src.display()
                )));
            }
            continue;
        }
        ensure_data_dir(&data.data_dir)?;
        if let Some(parent) = rel.parent() {
            create_dirs_below(&data.data_dir, parent)?;
        }
        copy_private(&src, &dst, None)?;
    }
    let domains = advance_logs(&store).await?;
    store.close().await;
    println!(
        "restored the Domain keys of {} Domains into {}; every Domain's event log moved {} ahead ({domains} Domains) so that nodes take the restored state as newer than what they saw; start plexsphere with --database-url and --data-dir {}",
        slugs.len(),
        data.data_dir.display(),
        events::RESTORE_SEQ_GAP,
        data.data_dir.display()
    );
    Ok(())
}
