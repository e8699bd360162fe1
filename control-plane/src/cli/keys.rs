//! `plexsphere kek generate` (a key-encryption key), `plexsphere kek rotate` (every Domain key
//! sealed again under a new KEK) and `plexsphere domain-key` (print a Domain's signing public
//! keys), and how `serve` finds its KEK.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use plexsphere_wire::signed::DomainSigner;

use super::failure::Failure;
use crate::keys::{self, Kek};
use crate::store::domains::{self, Domain};
use crate::store::{Store, domain_keys};

#[derive(Debug, Subcommand)]
pub enum KekCommand {
    /// Make a key-encryption key and write it to a new file (mode 0600, never overwritten).
    Generate {
        /// The file to write (give the same one to every replica).
        #[arg(long)]
        out: PathBuf,
    },
    /// Seal every Domain key and cloud credential in the database again under a new KEK, in one
    /// transaction (stop the replicas first, then start them with the new KEK;
    /// docs/operations.md)
    Rotate {
        /// The control plane's data directory (for the default SQLite database).
        #[arg(
            long,
            env = "PLEXSPHERE_DATA_DIR",
            default_value = "/var/lib/plexsphere"
        )]
        data_dir: PathBuf,
        /// `sqlite://...` or `postgres://...`; default: `<data-dir>/plexsphere.db`.
        #[arg(long, env = "PLEXSPHERE_DATABASE_URL")]
        database_url: Option<String>,
        /// The KEK the Domain keys are sealed under now.
        #[arg(long)]
        old_key_encryption_key_file: PathBuf,
        /// The new KEK (`plexsphere kek generate --out <file>` makes one).
        #[arg(long)]
        key_encryption_key_file: PathBuf,
    },
}

/// `plexsphere domain-key`.
#[derive(Debug, Args)]
pub struct DomainKeyArgs {
    /// The control plane's data directory (its database, older seed files).
    #[arg(
        long,
        env = "PLEXSPHERE_DATA_DIR",
        default_value = "/var/lib/plexsphere"
    )]
    pub data_dir: PathBuf,
    /// `sqlite://...` or `postgres://...`; default: `<data-dir>/plexsphere.db`.
    #[arg(long, env = "PLEXSPHERE_DATABASE_URL")]
    pub database_url: Option<String>,
    /// The Domain's slug; may be left out when there is one Domain.
    #[arg(long)]
    pub domain: Option<String>,
}

pub(crate) async fn kek(cmd: KekCommand) -> Result<(), Failure> {
    match cmd {
        KekCommand::Generate { out } => {
            keys::kek::generate(&out).map_err(|e| Failure::Config(e.to_string()))?;
            println!("key-encryption key written to {}", out.display());
            Ok(())
        }
        KekCommand::Rotate {
            data_dir,
            database_url,
            old_key_encryption_key_file,
            key_encryption_key_file,
        } => {
            let config = |e: keys::KekError| Failure::Config(e.to_string());
            let old = Kek::read(&old_key_encryption_key_file).map_err(config)?;
            let new = Kek::read(&key_encryption_key_file).map_err(config)?;
            let url = database_url.unwrap_or_else(|| Store::sqlite_url(&data_dir));
            let store = Store::connect(&url).await.map_err(runtime)?;
            let done = reseal_everything(&store, &data_dir, &old, &new).await;
            store.close().await;
            let (done, credentials) = done?;
            println!(
                "cloud credentials: {} sealed again under {}, {} already were",
                credentials.resealed,
                new.origin(),
                credentials.already
            );
            if done.resealed == 0 {
                println!(
                    "nothing to do: every Domain key ({}) already opens with the key-encryption key {}",
                    done.already,
                    new.origin()
                );
            } else {
                println!(
                    "sealed {} Domain keys again under the key-encryption key {} ({} already were); start every replica with it now",
                    done.resealed,
                    new.origin(),
                    done.already
                );
            }
            Ok(())
        }
    }
}

/// `kek rotate`'s work: the Domain keys and the cloud credentials sealed again under `new` in
/// one transaction, so a failure in either (or a crash before the commit) leaves both under
/// `old`, and a credential never stays sealed under a KEK the replicas no longer hold.
async fn reseal_everything(
    store: &Store,
    data_dir: &Path,
    old: &Kek,
    new: &Kek,
) -> Result<(keys::reseal::Resealed, crate::broker::sealing::Resealed), Failure> {
    let config = |e: crate::error::Error| Failure::Config(e.to_string());
    store.migrate().await.map_err(runtime)?;
    // Read before the transaction starts: an unreadable file fails before anything is done.
    let legacy = crate::broker::sealing::legacy_key(data_dir).map_err(config)?;
    let mut tx = store.begin().await.map_err(runtime)?;
    let done = keys::reseal::reseal_in(&mut tx, old, new)
        .await
        .map_err(|e| match e {
            keys::reseal::ResealError::Store(s) => runtime(s),
            other => Failure::Config(other.to_string()),
        })?;
    let credentials = crate::broker::sealing::reseal_in(&mut tx, old, new, legacy.as_ref())
        .await
        .map_err(config)?;
    tx.commit()
        .await
        .map_err(|e| runtime(crate::store::StoreError::from(e)))?;
    Ok((done, credentials))
}

/// The KEK of a replica: `--key-encryption-key-file`, else the systemd credential.
pub(super) fn replica_kek(flag: Option<&Path>) -> Result<Kek, Failure> {
    let credentials = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    Kek::locate(flag, credentials.as_deref()).map_err(|e| Failure::Config(e.to_string()))
}

/// A key error at start: the database's are runtime failures, the rest configuration.
pub(super) fn key_failure(e: keys::KeyError) -> Failure {
    match e {
        keys::KeyError::Store(s) => Failure::Runtime(anyhow::Error::new(s)),
        other => Failure::Config(other.to_string()),
    }
}

/// Prints the public key the Domain signs with now and, during a rotation's overlap, the next
/// one on a second line (a relay must trust both meanwhile; `--domain-key-file` takes the
/// lines). No KEK needed: public keys are stored in the clear. Before the database has a key,
/// the key of an older version's seed file not imported yet.
pub(crate) async fn domain_key(args: &DomainKeyArgs) -> Result<(), Failure> {
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| Store::sqlite_url(&args.data_dir));
    let store = Store::connect(&url).await.map_err(runtime)?;
    store.migrate().await.map_err(runtime)?;
    let mut conn = store.acquire().await.map_err(runtime)?;
    let domain = pick(&mut conn, args.domain.as_deref()).await?;
    let stored = domain_keys::list(&mut conn, domain.id)
        .await
        .map_err(runtime)?;
    let now = keys::unix_now();
    let current = stored
        .iter()
        .rev()
        .find(|k| k.active_from <= now)
        .or(stored.first());
    let next = current.and_then(|c| {
        stored
            .iter()
            .find(|k| k.generation > c.generation && k.active_from > now)
    });
    let key = match current {
        Some(k) => k.public_key.clone(),
        None => {
            let seed = keys::seed_file::read(&args.data_dir, &domain.slug)
                .map_err(|e| Failure::Config(e.to_string()))?
                .ok_or_else(|| {
                    Failure::Config(format!(
                        "the Domain {} has no signing key yet (the server makes one when it starts)",
                        domain.slug
                    ))
                })?;
            DomainSigner::from_seed(&seed)
                .map_err(|_| Failure::Config(format!("the seed of {} is unusable", domain.slug)))?
                .public_key_b64()
        }
    };
    println!("{key}");
    if let Some(next) = next {
        println!("{}", next.public_key);
    }
    drop(conn);
    store.close().await;
    Ok(())
}

async fn pick(conn: &mut sqlx::AnyConnection, slug: Option<&str>) -> Result<Domain, Failure> {
    let all = domains::list(conn).await.map_err(runtime)?;
    match slug {
        Some(s) => all.into_iter().find(|d| d.slug == s).ok_or_else(|| {
            Failure::Config(format!(
                "there is no Domain {s:?}; is --data-dir (or --database-url) the control plane's?"
            ))
        }),
        None if all.len() == 1 => all
            .into_iter()
            .next()
            .ok_or_else(|| Failure::Config("there is no Domain".into())),
        None if all.is_empty() => Err(Failure::Config(
            "there is no Domain yet; apply a seed first".into(),
        )),
        None => Err(Failure::Config(format!(
            "there are several Domains ({}); pick one with --domain",
            all.iter()
                .map(|d| d.slug.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

fn runtime(e: crate::store::StoreError) -> Failure {
    Failure::Runtime(anyhow::Error::new(e))
}

/// The KEK a restore checks the restored Domain keys with: `--key-encryption-key-file`, else
/// `plexsphere dev`'s file in the backup or in the data directory, else the systemd credential;
/// None when there is none of them.
pub(super) fn restore_kek(
    flag: Option<&Path>,
    from: &Path,
    data_dir: &Path,
) -> Result<Option<Kek>, Failure> {
    let dev_in = |dir: &Path| dir.join(keys::kek::DEV_KEK_FILE);
    let found = if let Some(f) = flag {
        Some(f.to_owned())
    } else if dev_in(from).is_file() {
        Some(dev_in(from))
    } else if dev_in(data_dir).is_file() {
        Some(dev_in(data_dir))
    } else {
        std::env::var_os("CREDENTIALS_DIRECTORY")
            .map(|d| PathBuf::from(d).join(keys::kek::CREDENTIAL_NAME))
            .filter(|p| p.is_file())
    };
    found
        .map(|p| Kek::read(&p).map_err(|e| Failure::Config(e.to_string())))
        .transpose()
}

/// Checks that every Domain of the database has its signing key: sealed in the database (and
/// opened by `kek`; without one, sealed keys are refused unless `kek_optional`) or a seed file
/// of an older version in `seeds_dir`. Answers the number of Domains.
pub(super) async fn check_domain_keys(
    conn: &mut sqlx::AnyConnection,
    seeds_dir: &Path,
    kek: Option<&Kek>,
    kek_optional: bool,
) -> Result<usize, Failure> {
    let all = domains::list(conn).await.map_err(runtime)?;
    for d in &all {
        let rows = domain_keys::list(conn, d.id).await.map_err(runtime)?;
        if rows.is_empty() {
            if keys::seed_file::read(seeds_dir, &d.slug)
                .map_err(|e| Failure::Config(e.to_string()))?
                .is_none()
            {
                return Err(Failure::Config(format!(
                    "the database has no signing key for Domain {} and there is no seed file {}; its nodes trust only that key: restore the database dump that holds it",
                    d.slug,
                    keys::seed_path(seeds_dir, &d.slug).display()
                )));
            }
            continue;
        }
        match kek {
            Some(kek) => {
                keys::open_all(kek, d, &rows).map_err(|e| Failure::Config(e.to_string()))?
            }
            None if kek_optional => {}
            None => {
                return Err(Failure::Config(format!(
                    "the Domain {}'s key is sealed in the database under a key-encryption key, and none is at hand: pass --key-encryption-key-file (or put plexsphere dev's `{}` into --from)",
                    d.slug,
                    keys::kek::DEV_KEK_FILE
                )));
            }
        }
    }
    Ok(all.len())
}
