//! `plexsphere backup` and `plexsphere restore`: the embedded default's data directory, copied
//! while the server runs, and brought back on another machine or directory.
//!
//! A backup is a directory (0700) holding:
//! - `plexsphere.db`: the database as of one instant, written by SQLite's `VACUUM INTO` from a
//!   read transaction, so the server goes on serving (and writing) while it is made;
//! - the Domain signing keys, inside the database, sealed under the key-encryption key (KEK);
//!   `key-encryption-key`, `plexsphere dev`'s KEK, when the data directory has it (a `serve`
//!   replica's KEK is kept apart from its backups); `domain-keys/<slug>.seed`, the seed files
//!   of older versions, when present;
//! - `tls/`: the lab CA and server certificate of `plexsphere dev`, when the data dir has them
//!   (nodes trust that CA); `operator-token`, when present;
//! - `BACKUP`: a manifest, the SHA-256 of every file above, checked by `restore`.
//!
//! Every file is written 0600: the keys and the database are secrets. `restore` refuses a
//! data directory that already holds a database, a backup whose manifest does not match its
//! files, one that lacks the key of a Domain its database names, and one whose sealed keys the
//! KEK at hand does not open.
//!
//! Either way a restore moves every Domain's event log ahead ([`events::RESTORE_SEQ_GAP`]):
//! nodes refuse any state at or below the newest they applied, and they applied newer ones from
//! the old server after the backup was taken. With `--database-url` (Postgres, restored with
//! `pg_restore`), the keys came back with the dump; `restore` checks them against the KEK and
//! does the rest.

use std::fs;
use std::io::Read as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use sqlx::Row as _;

use super::admin::ensure_data_dir;
use super::args::DataArgs;
use super::failure::Failure;
use crate::store::{Store, events};

/// The database file in a data directory and in a backup.
const DB_FILE: &str = "plexsphere.db";
/// The manifest of a backup.
const MANIFEST: &str = "BACKUP";
/// The first line of a manifest (and its format's version).
const MANIFEST_HEADER: &str = "plexsphere backup 1";
/// What besides the database a backup carries, relative to the data directory.
const CARRIED_DIRS: [&str; 2] = ["domain-keys", "tls"];
const CARRIED_FILES: [&str; 2] = ["operator-token", crate::keys::kek::DEV_KEK_FILE];

pub async fn backup(data: &DataArgs, out: &Path) -> Result<(), Failure> {
    if data.database_url.is_some() {
        return Err(Failure::Config(
            "backup copies the embedded SQLite database; for Postgres use pg_dump (the Domain keys are in it, sealed) and keep the key-encryption key apart".into(),
        ));
    }
    let db = data.data_dir.join(DB_FILE);
    if !db.exists() {
        return Err(Failure::Config(format!(
            "{} holds no database ({DB_FILE}); pass the --data-dir plexsphere serves from",
            data.data_dir.display()
        )));
    }
    create_private_dir(out)?;
    let store = Store::connect(&Store::sqlite_url(&data.data_dir))
        .await
        .with_context(|| format!("cannot open the database of {}", data.data_dir.display()))?;
    let target = out.join(DB_FILE);
    let mut conn = store.acquire().await.context("cannot open the database")?;
    sqlx::query("VACUUM INTO $1")
        .bind(target.display().to_string())
        .execute(&mut *conn)
        .await
        .with_context(|| format!("cannot write the database copy {}", target.display()))?;
    drop(conn);
    store.close().await;
    fs::set_permissions(&target, fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot set the mode of {}", target.display()))?;

    let mut files = vec![PathBuf::from(DB_FILE)];
    files.extend(copy_carried(&data.data_dir, out)?);
    let kek = super::keys::restore_kek(None, out, out)?;
    let summary = check_keys(out, kek.as_ref(), true).await?;
    write_manifest(out, &files)?;
    if kek.is_none() {
        println!(
            "the Domain keys in this backup are sealed under the key-encryption key, which is not in it: keep that file safe apart from the backup"
        );
    }
    println!(
        "backed up {} to {}: {} ({} files)",
        data.data_dir.display(),
        out.display(),
        summary,
        files.len()
    );
    Ok(())
}

pub async fn restore(from: &Path, data: &DataArgs, kek_file: Option<&Path>) -> Result<(), Failure> {
    let kek = super::keys::restore_kek(kek_file, from, &data.data_dir)?;
    if let Some(url) = &data.database_url {
        return restore_external(from, data, url, kek).await;
    }
    let files = read_manifest(from)?;
    ensure_data_dir(&data.data_dir)?;
    let db = data.data_dir.join(DB_FILE);
    if db.exists() {
        return Err(Failure::Config(format!(
            "{} already holds a database; restore into an empty data directory, or move {} away first",
            data.data_dir.display(),
            db.display()
        )));
    }
    let summary = check_keys(from, kek.as_ref(), false).await?;
    for rel in &files {
        let (src, dst) = (from.join(rel), data.data_dir.join(rel));
        if let Some(parent) = dst.parent() {
            create_private_dir_all(parent)?;
        }
        copy_private(&src, &dst)?;
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
        super::keys::check_domain_keys(&mut conn, from, kek.as_ref(), false).await?;
    }
    let dev_kek = (
        from.join(crate::keys::kek::DEV_KEK_FILE),
        data.data_dir.join(crate::keys::kek::DEV_KEK_FILE),
    );
    let seeds = slugs.iter().map(|slug| {
        (
            crate::keys::seed_path(from, slug),
            crate::keys::seed_path(&data.data_dir, slug),
        )
    });
    for (src, dst) in std::iter::once(dev_kek).chain(seeds) {
        if !src.is_file() {
            continue;
        }
        if dst.exists() {
            if sha256_file(&dst)? != sha256_file(&src)? {
                return Err(Failure::Config(format!(
                    "{} holds another key than {}; move it away first if the backup's key is the one the nodes trust",
                    dst.display(),
                    src.display()
                )));
            }
            continue;
        }
        if let Some(parent) = dst.parent() {
            create_private_dir_all(parent)?;
        }
        copy_private(&src, &dst)?;
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

/// Moves every Domain's event log past what the nodes can have seen since the backup
/// ([`events::RESTORE_SEQ_GAP`]), in one transaction.
async fn advance_logs(store: &Store) -> anyhow::Result<u64> {
    let mut tx = store
        .begin()
        .await
        .context("cannot open the restored database")?;
    let moved = events::advance_for_restore(&mut tx, events::RESTORE_SEQ_GAP)
        .await
        .context("cannot move the restored event logs ahead")?;
    tx.commit()
        .await
        .context("cannot move the restored event logs ahead")?;
    Ok(moved)
}

/// Copies the carried directories and files that exist; answers their paths relative to the
/// data directory.
fn copy_carried(data_dir: &Path, out: &Path) -> Result<Vec<PathBuf>, Failure> {
    let mut copied = Vec::new();
    for dir in CARRIED_DIRS {
        let src = data_dir.join(dir);
        if !src.is_dir() {
            continue;
        }
        create_private_dir(&out.join(dir))?;
        let mut names: Vec<_> = fs::read_dir(&src)
            .with_context(|| format!("cannot read {}", src.display()))?
            .collect::<Result<_, _>>()
            .with_context(|| format!("cannot read {}", src.display()))?;
        names.sort_by_key(|e| e.file_name());
        for entry in names {
            if entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
                let rel = Path::new(dir).join(entry.file_name());
                copy_private(&entry.path(), &out.join(&rel))?;
                copied.push(rel);
            }
        }
    }
    for file in CARRIED_FILES {
        let src = data_dir.join(file);
        if src.is_file() {
            copy_private(&src, &out.join(file))?;
            copied.push(PathBuf::from(file));
        }
    }
    Ok(copied)
}

/// Checks the database copy in `dir` (SQLite's integrity check) and that `dir` holds the key of
/// every Domain it names; answers a summary ("2 Domains, 40 nodes").
async fn check_keys(
    dir: &Path,
    kek: Option<&crate::keys::Kek>,
    kek_optional: bool,
) -> Result<String, Failure> {
    let url = format!("sqlite://{}?mode=ro", dir.join(DB_FILE).display());
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url)
        .await
        .with_context(|| format!("cannot open {}", dir.join(DB_FILE).display()))?;
    let integrity: String = sqlx::query("PRAGMA integrity_check")
        .fetch_one(&pool)
        .await
        .context("cannot check the database copy")?
        .try_get(0)
        .context("cannot read the integrity check")?;
    if integrity != "ok" {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "the database copy {} is damaged ({integrity}); take a new backup",
            dir.display()
        )));
    }
    let slugs: Vec<String> = sqlx::query("SELECT slug FROM domains ORDER BY slug")
        .fetch_all(&pool)
        .await
        .context("cannot read the Domains of the database copy")?
        .iter()
        .map(|r| r.try_get::<String, _>("slug"))
        .collect::<Result<_, _>>()
        .context("cannot read the Domains of the database copy")?;
    let nodes: i64 = sqlx::query("SELECT COUNT(*) AS n FROM nodes")
        .fetch_one(&pool)
        .await
        .context("cannot count the nodes of the database copy")?
        .try_get("n")
        .context("cannot count the nodes of the database copy")?;
    {
        let mut conn = pool
            .acquire()
            .await
            .context("cannot read the database copy")?;
        super::keys::check_domain_keys(&mut conn, dir, kek, kek_optional).await?;
    }
    pool.close().await;
    Ok(format!("{} Domains, {nodes} nodes", slugs.len()))
}

fn write_manifest(out: &Path, files: &[PathBuf]) -> Result<(), Failure> {
    let mut text = format!("{MANIFEST_HEADER}\n");
    for rel in files {
        text.push_str(&format!(
            "{}  {}\n",
            sha256_file(&out.join(rel))?,
            rel.display()
        ));
    }
    write_private(&out.join(MANIFEST), text.as_bytes())
}

/// The files a backup's manifest lists, each checked against its SHA-256.
fn read_manifest(from: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let path = from.join(MANIFEST);
    let text = fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {}; pass --from the directory plexsphere backup wrote",
            path.display()
        )
    })?;
    let mut lines = text.lines();
    if lines.next() != Some(MANIFEST_HEADER) {
        bail!("{} is not a plexsphere backup manifest", path.display());
    }
    let mut files = Vec::new();
    for line in lines {
        let Some((digest, rel)) = line.split_once("  ") else {
            bail!("{}: malformed line {line:?}", path.display());
        };
        let rel = PathBuf::from(rel);
        if rel.is_absolute() || rel.components().any(|c| c.as_os_str() == "..") {
            bail!(
                "{}: {} leaves the backup directory",
                path.display(),
                rel.display()
            );
        }
        let actual = sha256_file(&from.join(&rel))?;
        if actual != digest {
            bail!(
                "{} does not match the backup's manifest (SHA-256 {actual}, manifest {digest}); the backup was changed or damaged",
                from.join(&rel).display()
            );
        }
        files.push(rel);
    }
    if !files.iter().any(|f| f == Path::new(DB_FILE)) {
        bail!("{} lists no {DB_FILE}", path.display());
    }
    Ok(files)
}

/// The SHA-256 of a file, read in pieces (a database need not fit in memory).
fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut f = fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(hex::encode(ctx.finish().as_ref()))
}

/// Creates `dir` (0700); it must not exist yet or be empty.
fn create_private_dir(dir: &Path) -> Result<(), Failure> {
    if dir.exists() {
        let empty = fs::read_dir(dir)
            .with_context(|| format!("cannot read {}", dir.display()))?
            .next()
            .is_none();
        if !empty {
            return Err(Failure::Config(format!(
                "{} exists and is not empty; name a new directory for the backup",
                dir.display()
            )));
        }
    }
    create_private_dir_all(dir)
}

fn create_private_dir_all(dir: &Path) -> Result<(), Failure> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot set the mode of {}", dir.display()))?;
    Ok(())
}

/// Copies `src` to `dst` (0600, synced, renamed into place), streaming: a database need not fit
/// in memory.
fn copy_private(src: &Path, dst: &Path) -> Result<(), Failure> {
    let tmp = dst.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let copied = (|| {
        let mut from = fs::File::open(src)?;
        let mut to = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        std::io::copy(&mut from, &mut to)?;
        to.sync_all()?;
        fs::rename(&tmp, dst)
    })();
    if copied.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    copied.with_context(|| format!("cannot copy {} to {}", src.display(), dst.display()))?;
    Ok(())
}

/// Writes `bytes` to `path` (0600, synced, renamed into place).
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    crate::tls::write_private(path, bytes).map_err(|e| Failure::Runtime(e.into()))
}
