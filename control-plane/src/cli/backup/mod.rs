//! `plexsphere backup` and `plexsphere restore`: the embedded default's data directory, copied
//! while the server runs, and brought back on another machine or directory.
//!
//! A backup is a directory (0700) holding:
//! - `plexsphere.db`: the database as of one instant, written by SQLite's `VACUUM INTO` from a
//!   read transaction, so the server goes on serving (and writing) while it is made; the Domain
//!   signing keys are in it, sealed under the key-encryption key (KEK);
//! - `tls/ca.crt`, `tls/server.crt`: the lab CA and server certificate of `plexsphere dev`,
//!   when the data dir has them (nodes trust that CA);
//! - with `--include-secrets` only ([`secret`] says which and why): `plexsphere dev`'s
//!   `key-encryption-key`, the `domain-keys/<slug>.seed` files of older versions, `tls/*.key`
//!   and `operator-token`; without it the manifest names them as left out;
//! - `BACKUP`: the manifest ([`manifest`]): every file's SHA-256 and size, keyed with an
//!   HMAC-SHA256 under a key derived from the KEK, so `restore` finds tampering, not only damage.
//!
//! `backup` needs the KEK (it keys the manifest and checks the sealed keys open with it).
//! `restore` checks the manifest's MAC under the KEK kept apart (`--key-encryption-key-file`,
//! dev's file in the data directory, the systemd credential; the copy inside a backup taken
//! with `--include-secrets` only as the last resort, and says what that proves), then every
//! file, refuses anything in the backup that is not a regular file or directory and any path it
//! writes that runs through a symlink ([`files`]), all before it writes anything. It refuses a
//! data directory that already holds a database, a backup that lacks the key of a Domain its
//! database names, and one whose sealed keys the KEK does not open.
//!
//! Either way a restore moves every Domain's event log ahead ([`events::RESTORE_SEQ_GAP`]):
//! nodes refuse any state at or below the newest they applied, and they applied newer ones from
//! the old server after the backup was taken. With `--database-url` (Postgres, restored with
//! `pg_restore`), the keys came back with the dump; `restore` checks them against the KEK and
//! does the rest.
//!
//! Its parts are [`files`], [`manifest`] and [`restore`]; it may import the store, the keys (the
//! KEK) and the audit pepper's file name, and nothing imports it but the CLI.

mod files;
mod manifest;
pub(crate) mod restore;

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sqlx::Row as _;

use self::files::{
    copy_private, create_dirs_below, create_private_dir, sha256_file, write_private,
};
use self::manifest::{Entry, Manifest};
use super::args::DataArgs;
use super::failure::Failure;
use crate::audit::pepper::DEV_PEPPER_FILE;
use crate::keys::Kek;
use crate::keys::kek::{CREDENTIAL_NAME, DEV_KEK_FILE};
use crate::store::{Store, events};

/// The database file in a data directory and in a backup.
const DB_FILE: &str = "plexsphere.db";
/// The manifest of a backup.
const MANIFEST: &str = "BACKUP";
/// What besides the database a backup carries, relative to the data directory.
const CARRIED_DIRS: [&str; 2] = ["domain-keys", "tls"];
const CARRIED_FILES: [&str; 3] = ["operator-token", DEV_KEK_FILE, DEV_PEPPER_FILE];

/// Whether a data directory's file (relative path) is a secret, and what a holder of it can do:
/// a backup leaves these out unless `--include-secrets`.
pub(crate) fn secret(rel: &Path) -> Option<&'static str> {
    let in_dir = |dir: &str| rel.parent() == Some(Path::new(dir));
    let ext = rel.extension().and_then(|e| e.to_str());
    if rel == Path::new(DEV_KEK_FILE) {
        Some(
            "opens every Domain signing key sealed in the backup's database: sign states and events every node of those Domains accepts (peers, routes, settings)",
        )
    } else if in_dir("domain-keys") {
        Some(
            "is a Domain signing key in the clear (an older version's seed file): sign states and events every node of that Domain accepts",
        )
    } else if rel == Path::new(DEV_PEPPER_FILE) {
        Some(
            "keys plexsphere dev's audit log: with write access to the database, rewrite its chains so that they verify; test guesses of people's e-mails against it",
        )
    } else if rel == Path::new("operator-token") {
        Some(
            "is plexsphere dev's admin operator token: the whole operator API of the server (tokens, nodes, Domains) until it is revoked",
        )
    } else if rel == Path::new("tls/ca.key") {
        Some(
            "is the private key of dev's lab CA: sign certificates the nodes trust for any name, impersonate the API to them and read their credentials",
        )
    } else if in_dir("tls") && ext == Some("key") {
        Some(
            "is a private key of dev's API certificate: serve as the API at its names, to nodes that reach that address, and read their credentials",
        )
    } else {
        None
    }
}

/// Where a KEK was found: outside the backup, or the copy inside it.
enum KekFound {
    Outside(Kek),
    InBackup(Kek),
}

/// The KEK kept apart from a backup: `--key-encryption-key-file`, else `plexsphere dev`'s file
/// in `data_dir`, else the systemd credential.
fn outside_kek(flag: Option<&Path>, data_dir: &Path) -> Result<Option<Kek>, Failure> {
    let dev = data_dir.join(DEV_KEK_FILE);
    let found = if let Some(f) = flag {
        Some(f.to_owned())
    } else if fs::symlink_metadata(&dev).is_ok() {
        Some(dev)
    } else {
        std::env::var_os("CREDENTIALS_DIRECTORY")
            .map(|d| PathBuf::from(d).join(CREDENTIAL_NAME))
            .filter(|p| p.is_file())
    };
    found
        .map(|p| Kek::read(&p).map_err(|e| Failure::Config(e.to_string())))
        .transpose()
}

pub(crate) async fn backup(
    data: &DataArgs,
    out: &Path,
    kek_file: Option<&Path>,
    include_secrets: bool,
) -> Result<(), Failure> {
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
    let kek = outside_kek(kek_file, &data.data_dir)?.ok_or_else(|| {
        Failure::Config(format!(
            "backup keys its manifest under the key-encryption key (and checks the sealed Domain keys open with it), and none is at hand: pass --key-encryption-key-file (or PLEXSPHERE_KEY_ENCRYPTION_KEY_FILE) with the file plexsphere serve uses, or run it with the systemd credential {CREDENTIAL_NAME}"
        ))
    })?;
    let carried = carried(&data.data_dir)?;
    create_private_dir(out)?;
    let target = out.join(DB_FILE);
    {
        let store = Store::connect(&Store::sqlite_url(&data.data_dir))
            .await
            .with_context(|| format!("cannot open the database of {}", data.data_dir.display()))?;
        let mut conn = store.acquire().await.context("cannot open the database")?;
        sqlx::query("VACUUM INTO $1")
            .bind(target.display().to_string())
            .execute(&mut *conn)
            .await
            .with_context(|| format!("cannot write the database copy {}", target.display()))?;
        drop(conn);
        store.close().await;
    }
    fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .with_context(|| format!("cannot set the mode of {}", target.display()))?;
    let (sha256, size) = sha256_file(&target)?;
    let mut m = Manifest {
        secrets_included: include_secrets,
        files: vec![Entry {
            path: PathBuf::from(DB_FILE),
            sha256,
            size: Some(size),
        }],
        omitted: Vec::new(),
    };
    let mut included = Vec::new();
    for rel in carried {
        if let Some(power) = secret(&rel) {
            if !include_secrets {
                m.omitted.push(rel);
                continue;
            }
            included.push((out.join(&rel), power));
        }
        if let Some(parent) = rel.parent() {
            create_dirs_below(out, parent)?;
        }
        let (sha256, size) = copy_private(&data.data_dir.join(&rel), &out.join(&rel), None)?;
        m.files.push(Entry {
            path: rel,
            sha256,
            size: Some(size),
        });
    }
    let summary = match check_keys(out, Some(&kek), false).await {
        Err(Failure::Config(msg)) if m.omitted.iter().any(|p| p.starts_with("domain-keys")) => {
            return Err(Failure::Config(format!(
                "{msg} (the seed files are secrets and left out: start the upgraded server once so that it imports them into the database, or pass --include-secrets)"
            )));
        }
        other => other?,
    };
    write_private(&out.join(MANIFEST), m.render(&kek).as_bytes())?;
    if !included.is_empty() {
        eprintln!(
            "warning: --include-secrets: {} holds {} secret files; store it encrypted, and whoever holds it can do what each allows:",
            out.display(),
            included.len()
        );
        for (path, power) in &included {
            eprintln!("warning: {} {power}", path.display());
        }
    }
    if !m.omitted.is_empty() {
        println!(
            "left out {} secret files (pass --include-secrets to carry them): {}",
            m.omitted.len(),
            m.omitted
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if m.file(Path::new(DEV_KEK_FILE)).is_none() {
        println!(
            "the Domain keys in this backup are sealed under the key-encryption key {}, and its manifest is keyed with it; the key is not in the backup: keep it safe apart, restore needs it (--key-encryption-key-file)",
            kek.origin()
        );
    }
    println!(
        "backed up {} to {}: {} ({} files)",
        data.data_dir.display(),
        out.display(),
        summary,
        m.files.len()
    );
    Ok(())
}

/// The carried files of `data_dir` that exist (relative paths, sorted per directory); refuses a
/// symlink or other non-regular file among them (nothing is followed).
fn carried(data_dir: &Path) -> Result<Vec<PathBuf>, Failure> {
    let mut found = Vec::new();
    for dir in CARRIED_DIRS {
        let src = data_dir.join(dir);
        match fs::symlink_metadata(&src) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Failure::Config(format!(
                    "{} is not a directory (a symlink?); backup follows nothing: replace it with the directory",
                    src.display()
                )));
            }
            Err(_) => continue,
        }
        let mut names: Vec<_> = fs::read_dir(&src)
            .with_context(|| format!("cannot read {}", src.display()))?
            .collect::<Result<_, _>>()
            .with_context(|| format!("cannot read {}", src.display()))?;
        names.sort_by_key(|e| e.file_name());
        for entry in names {
            let t = entry
                .file_type()
                .with_context(|| format!("cannot read {}", entry.path().display()))?;
            if t.is_file() {
                found.push(Path::new(dir).join(entry.file_name()));
            } else if !t.is_dir() {
                return Err(Failure::Config(format!(
                    "{} is not a regular file (a symlink?); backup follows nothing: replace it with the file",
                    entry.path().display()
                )));
            }
        }
    }
    for file in CARRIED_FILES {
        match fs::symlink_metadata(data_dir.join(file)) {
            Ok(m) if m.is_file() => found.push(PathBuf::from(file)),
            Ok(_) => {
                return Err(Failure::Config(format!(
                    "{} is not a regular file (a symlink?); backup follows nothing: replace it with the file",
                    data_dir.join(file).display()
                )));
            }
            Err(_) => {}
        }
    }
    Ok(found)
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
