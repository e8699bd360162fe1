//! The store's error, and what it says about the database: a lost race to retry, a unique
//! constraint that refused a row, or a storage fault to answer at once.

use std::borrow::Cow;

use super::fault::StorageFault;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),
    #[error(
        "schema migration failed: {0}; check the database URL and that it is not a newer plexsphere's database"
    )]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("the database holds a malformed value in {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
    /// The database, or the directory it lives in, cannot be written at start-up.
    #[error("{target} cannot be used: {} ({detail}); {}, then start plexsphere again", fault.describe(), fault.remedy())]
    Open {
        target: String,
        fault: StorageFault,
        detail: String,
    },
}

impl StoreError {
    pub(crate) fn corrupt(what: &'static str, detail: impl std::fmt::Display) -> Self {
        StoreError::Corrupt {
            what,
            detail: detail.to_string(),
        }
    }

    /// A lost race with another writer: SQLite busy/locked, a Postgres serialization failure
    /// or deadlock. Retrying the whole transaction is the fix.
    pub(crate) fn is_busy(&self) -> bool {
        let StoreError::Sqlx(sqlx::Error::Database(db)) = self else {
            return false;
        };
        let code = db.code().unwrap_or(Cow::Borrowed(""));
        let msg = db.message();
        // SQLite primary result codes: 5 BUSY (extended 261, 517, 773), 6 LOCKED (262, 518).
        matches!(
            code.as_ref(),
            "5" | "6" | "261" | "262" | "517" | "518" | "773" | "40001" | "40P01"
        ) || msg.contains("database is locked")
            || msg.contains("database table is locked")
    }

    /// The database server cannot be reached or is going away (a Postgres that is down,
    /// restarting or cut off; the pool found no connection in time): the request is answered
    /// `503 unavailable` at once, and the pool reconnects by itself once it is back.
    pub(crate) fn is_unreachable(&self) -> bool {
        use std::io::ErrorKind as K;
        match self {
            StoreError::Sqlx(sqlx::Error::Io(io)) => matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::NotConnected
                    | K::BrokenPipe
                    | K::UnexpectedEof
                    | K::TimedOut
                    | K::NotFound
                    | K::HostUnreachable
                    | K::NetworkUnreachable
            ),
            StoreError::Sqlx(sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed) => true,
            // Postgres: 08xxx connection exceptions, 57P01-57P03 shutting down / starting up.
            StoreError::Sqlx(sqlx::Error::Database(db)) => {
                let code = db.code().unwrap_or(Cow::Borrowed(""));
                code.len() == 5 && (code.starts_with("08") || code.starts_with("57P0"))
            }
            _ => false,
        }
    }

    /// The storage fault behind this error (a full disk, a read-only file, an I/O error), if
    /// it is one: the request is answered at once with a retryable error that says so.
    pub(crate) fn fault(&self) -> Option<StorageFault> {
        match self {
            StoreError::Sqlx(e) | StoreError::Migrate(sqlx::migrate::MigrateError::Execute(e)) => {
                StorageFault::of_sqlx(e)
            }
            StoreError::Open { fault, .. } => Some(*fault),
            _ => None,
        }
    }

    /// A unique constraint refused a row (two writers picked the same mesh IP, slug, id...).
    pub fn is_unique_violation(&self) -> bool {
        match self {
            StoreError::Sqlx(sqlx::Error::Database(db)) => {
                db.kind() == sqlx::error::ErrorKind::UniqueViolation
                    || db.message().contains("UNIQUE constraint failed")
            }
            _ => false,
        }
    }
}

/// Converts a row value that must parse (a UUID, an IP, a CIDR) or reports which column was bad.
pub(crate) fn parse_col<T: std::str::FromStr>(what: &'static str, s: &str) -> Result<T, StoreError>
where
    T::Err: std::fmt::Display,
{
    s.parse::<T>()
        .map_err(|e| StoreError::corrupt(what, format!("{s:?}: {e}")))
}
