//! `plexd join --result-file PATH`: how the last join ended, for a supervisor that cannot read
//! plexd's stderr (the broker reads it inside a provisioned machine after cloud-init fails).
//!
//! On failure the file holds one small JSON object, `{"exit_code": 11, "message": "..."}`,
//! the exit status and the same one-line message plexd prints; it is written atomically (a
//! reader sees the whole object or none) with mode 0644, its directory created if missing.
//! On success a file left by an earlier failed join is removed, so the file never describes an
//! older attempt than the last one.

use std::path::Path;

pub use plexsphere_wire::node::JoinResult;

use crate::exit::Failure;
use crate::fsutil::{self, FsError};

/// The mode of the result file: it holds no secret (plexd's messages never quote a token).
pub(crate) const RESULT_FILE_MODE: u32 = 0o644;

/// The file's contents for a failed join.
pub(crate) fn of_failure(f: &Failure) -> JoinResult {
    JoinResult {
        exit_code: f.code.as_i32(),
        message: f.message.clone(),
    }
}

/// Writes `result` to `path` atomically (temp file + rename), creating its directory.
pub fn write(path: &Path, result: &JoinResult) -> Result<(), FsError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fsutil::ensure_dir(dir, 0o755)?;
    }
    let mut body = serde_json::to_vec(result).map_err(|e| {
        FsError::new(
            "cannot serialise the join result for",
            path,
            std::io::Error::other(e),
        )
    })?;
    body.push(b'\n');
    fsutil::write_atomic(path, &body, RESULT_FILE_MODE)
}

/// Removes a result file left by an earlier join; a missing file is fine.
pub fn clear(path: &Path) -> Result<(), FsError> {
    fsutil::remove_file_if_present(path)
        .map(|_| ())
        .map_err(|e| FsError::new("cannot remove the stale join result", path, e))
}

/// Records how a join ended at `path` (when `--result-file` was given). A file that cannot be
/// written is logged, never turned into another exit status: the join's own result stands.
pub fn record(path: Option<&Path>, outcome: Result<(), &Failure>) {
    let Some(path) = path else {
        return;
    };
    let done = match outcome {
        Ok(()) => clear(path),
        Err(f) => write(path, &of_failure(f)),
    };
    if let Err(e) = done {
        tracing::warn!(path = %path.display(), error = %e, "could not record the join's result (--result-file); the exit status still tells it");
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::exit::ExitCode;

    fn read(path: &Path) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn a_failure_is_written_as_exit_code_and_message_with_its_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("run/plexd/join-result.json");
        let f = Failure::new(
            ExitCode::TokenInvalid,
            "the bootstrap token in /etc/plexd/bootstrap-token was refused: revoked (token_revoked, HTTP 403); write a fresh token",
        );
        record(Some(&path), Err(&f));
        assert_eq!(
            read(&path),
            serde_json::json!({
                "exit_code": 11,
                "message": "the bootstrap token in /etc/plexd/bootstrap-token was refused: revoked (token_revoked, HTTP 403); write a fresh token"
            })
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        // No temp file is left next to it.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("join-result.json")]);
    }

    #[test]
    fn a_later_failure_replaces_the_earlier_one() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("r.json");
        record(Some(&path), Err(&Failure::new(ExitCode::Io, "first")));
        record(
            Some(&path),
            Err(&Failure::new(ExitCode::TokenConsumed, "second")),
        );
        let v = read(&path);
        assert_eq!(v["exit_code"], 10);
        assert_eq!(v["message"], "second");
    }

    #[test]
    fn success_removes_a_stale_file_and_tolerates_none() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("r.json");
        write(
            &path,
            &JoinResult {
                exit_code: 13,
                message: "old".into(),
            },
        )
        .unwrap();
        assert!(path.exists());
        record(Some(&path), Ok(()));
        assert!(!path.exists());
        // Nothing to remove: still fine, and nothing is created.
        record(Some(&path), Ok(()));
        assert!(!path.exists());
        record(None, Err(&Failure::new(ExitCode::Io, "x")));
        assert!(!path.exists());
    }

    #[test]
    fn an_unwritable_path_is_reported_not_fatal() {
        let tmp = tempfile::tempdir().unwrap();
        // The parent is a file, so the directory cannot be created.
        let blocker = tmp.path().join("file");
        std::fs::write(&blocker, b"x").unwrap();
        let path = blocker.join("r.json");
        assert!(write(&path, &of_failure(&Failure::new(ExitCode::Io, "m"))).is_err());
        record(Some(&path), Err(&Failure::new(ExitCode::Io, "m")));
        assert!(!path.exists());
    }
}
