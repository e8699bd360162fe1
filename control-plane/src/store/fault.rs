//! What a failed database call says about the storage under it. A full disk, a read-only
//! filesystem or an I/O error is nobody's bug and no lost race: the request is answered at once
//! with a retryable error that names the cause (`api::error`), and nothing of it was stored.

use std::borrow::Cow;

/// Why the database could not store (or read) what it was asked to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageFault {
    /// No space left: SQLite `SQLITE_FULL`, Postgres `53100 disk_full`, `ENOSPC`.
    Full,
    /// The file or filesystem cannot be written: `SQLITE_READONLY`, Postgres `25006`, `EROFS`.
    ReadOnly,
    /// The disk failed a read or write, or the database cannot be reached: `SQLITE_IOERR`,
    /// `SQLITE_CANTOPEN`, Postgres `58030`, a broken connection, a pool that timed out.
    Io,
}

impl StorageFault {
    /// The cause in words an operator acts on.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            StorageFault::Full => "the disk is full",
            StorageFault::ReadOnly => {
                "the database cannot be written (read-only file or filesystem)"
            }
            StorageFault::Io => {
                "the database cannot be read or written right now (I/O error or unreachable)"
            }
        }
    }

    /// What to do about it.
    pub(crate) fn remedy(self) -> &'static str {
        match self {
            StorageFault::Full => "free space on that filesystem",
            StorageFault::ReadOnly => {
                "make the data directory writable (remount it read-write, or pass --data-dir with a writable directory)"
            }
            StorageFault::Io => "check the disk, or the database server and the network to it",
        }
    }

    /// The fault an OS error stands for.
    pub(crate) fn of_io(e: &std::io::Error) -> StorageFault {
        match e.raw_os_error() {
            Some(ENOSPC) | Some(EDQUOT) => StorageFault::Full,
            Some(EROFS) | Some(EACCES) | Some(EPERM) => StorageFault::ReadOnly,
            _ => StorageFault::Io,
        }
    }

    /// The fault behind a database error, if it is one of storage.
    pub(crate) fn of_sqlx(e: &sqlx::Error) -> Option<StorageFault> {
        match e {
            sqlx::Error::Database(db) => of_code(
                db.code().unwrap_or(Cow::Borrowed("")).as_ref(),
                db.message(),
            ),
            sqlx::Error::Io(io) => Some(StorageFault::of_io(io)),
            sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
                Some(StorageFault::Io)
            }
            _ => None,
        }
    }
}

const EPERM: i32 = 1;
const EACCES: i32 = 13;
const ENOSPC: i32 = 28;
const EROFS: i32 = 30;
const EDQUOT: i32 = 122;

/// Postgres reports a five-character SQLSTATE; SQLite an extended result code of at most four
/// digits, whose low byte is the primary code.
fn of_code(code: &str, message: &str) -> Option<StorageFault> {
    if code.len() == 5 {
        return match code {
            "53100" => Some(StorageFault::Full),
            "25006" => Some(StorageFault::ReadOnly),
            "58030" => Some(StorageFault::Io),
            _ => None,
        };
    }
    if let Ok(extended) = code.parse::<u32>() {
        return match extended & 0xff {
            13 => Some(StorageFault::Full),
            8 => Some(StorageFault::ReadOnly),
            10 | 14 => Some(StorageFault::Io),
            _ => None,
        };
    }
    message
        .contains("database or disk is full")
        .then_some(StorageFault::Full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_and_postgres_codes() {
        // SQLITE_FULL, SQLITE_READONLY and its extended codes, SQLITE_IOERR_WRITE (778),
        // SQLITE_CANTOPEN.
        assert_eq!(of_code("13", ""), Some(StorageFault::Full));
        assert_eq!(of_code("8", ""), Some(StorageFault::ReadOnly));
        assert_eq!(of_code("1032", ""), Some(StorageFault::ReadOnly));
        assert_eq!(of_code("778", ""), Some(StorageFault::Io));
        assert_eq!(of_code("14", ""), Some(StorageFault::Io));
        // Busy, locked and constraint errors are not storage faults.
        assert_eq!(of_code("5", ""), None);
        assert_eq!(of_code("517", ""), None);
        assert_eq!(of_code("2067", ""), None);
        assert_eq!(of_code("53100", ""), Some(StorageFault::Full));
        assert_eq!(of_code("25006", ""), Some(StorageFault::ReadOnly));
        assert_eq!(of_code("23505", ""), None);
        // A five-character code is never read as a SQLite code: 00269 would be SQLITE_FULL.
        assert_eq!(of_code("00269", ""), None);
        assert_eq!(
            of_code("", "database or disk is full"),
            Some(StorageFault::Full)
        );
    }

    #[test]
    fn os_errors() {
        let full = std::io::Error::from_raw_os_error(ENOSPC);
        assert_eq!(StorageFault::of_io(&full), StorageFault::Full);
        let ro = std::io::Error::from_raw_os_error(EROFS);
        assert_eq!(StorageFault::of_io(&ro), StorageFault::ReadOnly);
        let other = std::io::Error::from_raw_os_error(5);
        assert_eq!(StorageFault::of_io(&other), StorageFault::Io);
    }
}
