//! Opening the store: the pool, each connection's settings, the start-up check of a SQLite
//! file's disk, and the check every SQLite connection passes when it comes back to the pool.
//!
//! Why that last check exists (the registrations answered `201` and then lost on a full disk):
//! sqlx counts a connection's open transactions itself. When SQLite ends a transaction on its
//! own, as it does on `SQLITE_FULL` and some I/O errors, the `ROLLBACK` sqlx sends afterwards
//! fails ("no transaction is active") and its count stays at 1. The next `begin` on that
//! connection then issues `SAVEPOINT` instead of `BEGIN`; the next failed transaction's
//! `ROLLBACK TO SAVEPOINT` leaves that savepoint, and so a transaction, open in SQLite; from
//! then on every "commit" only releases an inner savepoint. Those writes are answered as
//! committed, seen by that one connection only, hold SQLite's write lock (every other writer
//! waits out the busy timeout) and are rolled back when the connection closes. A connection
//! whose count is not zero, or on which SQLite still has a transaction open, is therefore
//! closed instead of being handed out again: closing it rolls back what is open, and nothing
//! of that was ever acknowledged, because the count only goes wrong after an error.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{AnyConnection, AnyPool, Connection as _, Executor as _, Row as _};

use super::error::StoreError;
use super::fault::StorageFault;

/// Connections in the pool.
pub(crate) const MAX_CONNECTIONS: u32 = 8;
/// How long a request waits for a free connection before it is answered `503`.
pub(crate) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a SQLite writer waits for another writer before `SQLITE_BUSY` (then the whole
/// transaction is retried, see `store::retry`).
pub(crate) const SQLITE_BUSY_TIMEOUT_MS: u32 = 5_000;
/// After how many WAL pages (of 4 KiB) a commit checkpoints the WAL into the database file
/// (SQLite's default is 1000). A small WAL keeps what the database holds on disk close to its
/// real size, so a small or nearly full disk is not taken up by a log of old page images.
pub(crate) const SQLITE_WAL_AUTOCHECKPOINT_PAGES: u32 = 128;
/// What a WAL file is cut back to after a checkpoint restarted it, in bytes: space a burst of
/// writes took goes back to the filesystem.
pub(crate) const SQLITE_WAL_SIZE_LIMIT_BYTES: u64 = 1024 * 1024;
/// What the start-up check writes (and removes) beside the database file: a disk with less
/// room than this is reported full before anything is served.
pub(crate) const START_UP_PROBE_BYTES: usize = 64 * 1024;

/// The pool for `url`: SQLite files are checked first ([`prepare_sqlite`]), every SQLite
/// connection gets [`configure_sqlite`], and is checked when it comes back ([`sqlite_is_idle`]).
pub(crate) async fn pool(url: &str) -> Result<AnyPool, StoreError> {
    install_default_drivers();
    let is_sqlite = url.starts_with("sqlite:");
    let file = sqlite_file(url);
    if let Some(path) = &file {
        prepare_sqlite(url, path).await?;
    }
    let pool = AnyPoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                if is_sqlite {
                    configure_sqlite(conn).await?;
                }
                Ok(())
            })
        })
        .after_release(move |conn, _meta| {
            Box::pin(async move { Ok(!is_sqlite || sqlite_is_idle(conn).await) })
        })
        .connect(url)
        .await;
    match (pool, &file) {
        (Ok(pool), _) => Ok(pool),
        (Err(e), Some(path)) => Err(opening(path, e)),
        (Err(e), None) => Err(e.into()),
    }
}

/// The file a `sqlite:` URL names, or None for another database or an in-memory one.
fn sqlite_file(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && !path.starts_with(":memory:")).then(|| PathBuf::from(path))
}

/// Each connection's settings: wait for another writer instead of failing at once, enforce
/// foreign keys, `synchronous = FULL` (a commit is on disk, the WAL synced, before it is
/// acknowledged), and a small WAL. The journal mode is the file's, set once by
/// [`prepare_sqlite`].
async fn configure_sqlite(conn: &mut AnyConnection) -> Result<(), sqlx::Error> {
    let settings = format!(
        "PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}; \
         PRAGMA foreign_keys = ON; \
         PRAGMA synchronous = FULL; \
         PRAGMA wal_autocheckpoint = {SQLITE_WAL_AUTOCHECKPOINT_PAGES}; \
         PRAGMA journal_size_limit = {SQLITE_WAL_SIZE_LIMIT_BYTES}"
    );
    conn.execute(sqlx::AssertSqlSafe(settings)).await?;
    Ok(())
}

/// Whether a connection that came back to the pool may be handed out again: sqlx's count of
/// open transactions is zero and SQLite agrees that none is open (the module doc says why).
/// The probe runs after any rollback sqlx queued when a transaction was dropped, so the
/// count read after it is current.
async fn sqlite_is_idle(conn: &mut AnyConnection) -> bool {
    let open_in_sqlite = conn.execute("BEGIN").await.is_err();
    if !open_in_sqlite && conn.execute("ROLLBACK").await.is_err() {
        return false;
    }
    let idle = !open_in_sqlite && !conn.is_in_transaction();
    if !idle {
        tracing::warn!(
            open_in_sqlite,
            "closing a database connection whose transaction state went out of step with SQLite's after a storage error; nothing it held was acknowledged"
        );
    }
    idle
}

/// The start-up check of a SQLite database: its directory takes a write of
/// [`START_UP_PROBE_BYTES`] (synced, then removed), and the file opens in WAL mode. A full,
/// read-only or failing disk is reported here, naming the cause and the path, instead of as
/// a pool that times out later.
pub(crate) async fn prepare_sqlite(url: &str, path: &Path) -> Result<(), StoreError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    probe_writable(&dir, "the database's directory")?;
    let mut conn = AnyConnection::connect(url)
        .await
        .map_err(|e| opening(path, e))?;
    let mode = async {
        configure_sqlite(&mut conn).await?;
        let row = sqlx::query("PRAGMA journal_mode = WAL")
            .fetch_one(&mut conn)
            .await?;
        row.try_get::<String, _>(0)
    }
    .await;
    let closed = conn.close().await;
    let mode = mode.map_err(|e| opening(path, e))?;
    closed.map_err(|e| opening(path, e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Open {
            target: format!("the database {}", path.display()),
            fault: StorageFault::Io,
            detail: format!("SQLite kept the journal mode {mode:?} instead of WAL"),
        });
    }
    Ok(())
}

/// Whether `dir` takes a write of [`START_UP_PROBE_BYTES`]: a probe file is written, synced
/// and removed. A full, read-only or failing filesystem is a [`StoreError::Open`] naming `dir`
/// as `what` ("the data directory").
pub(crate) fn probe_writable(dir: &Path, what: &str) -> Result<(), StoreError> {
    probe_dir(dir).map_err(|e| StoreError::Open {
        target: format!("{what} {}", dir.display()),
        fault: StorageFault::of_io(&e),
        detail: e.to_string(),
    })
}

fn probe_dir(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".plexsphere-probe-{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&probe)?;
        f.write_all(&[0u8; START_UP_PROBE_BYTES])?;
        f.sync_all()
    })();
    let removed = std::fs::remove_file(&probe);
    written?;
    match removed {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A failure to open the SQLite file at `path`: a storage fault names the file, anything else
/// stays the database error it is.
fn opening(path: &Path, e: sqlx::Error) -> StoreError {
    match StorageFault::of_sqlx(&e) {
        Some(fault) => StoreError::Open {
            target: format!("the database {}", path.display()),
            fault,
            detail: e.to_string(),
        },
        None => StoreError::Sqlx(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls_name_their_file() {
        assert_eq!(
            sqlite_file("sqlite:///var/lib/plexsphere/plexsphere.db?mode=rwc"),
            Some(PathBuf::from("/var/lib/plexsphere/plexsphere.db"))
        );
        assert_eq!(
            sqlite_file("sqlite:data/x.db"),
            Some(PathBuf::from("data/x.db"))
        );
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("postgres://u@h/db"), None);
    }

    /// The connection check closes exactly the connections the module doc describes: one that
    /// SQLite still has a transaction open on, and one whose count sqlx got wrong.
    #[tokio::test]
    async fn a_connection_out_of_step_with_sqlite_is_not_handed_out_again() {
        install_default_drivers();
        let dir = tempfile::tempdir().unwrap();
        let url = format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("plexsphere.db").display()
        );
        let mut conn = AnyConnection::connect(&url).await.unwrap();
        assert!(
            sqlite_is_idle(&mut conn).await,
            "a fresh connection is idle"
        );

        // SQLite has a transaction open that sqlx does not know of.
        conn.execute("BEGIN").await.unwrap();
        assert!(!sqlite_is_idle(&mut conn).await);
        conn.execute("ROLLBACK").await.unwrap();
        assert!(sqlite_is_idle(&mut conn).await);

        // sqlx counts a transaction that SQLite has already ended (as after SQLITE_FULL).
        let tx = conn.begin().await.unwrap();
        std::mem::forget(tx);
        conn.execute("ROLLBACK").await.unwrap();
        assert!(conn.is_in_transaction());
        assert!(!sqlite_is_idle(&mut conn).await);
    }
}
