//! What a leave's outcome means for the operator: the control plane's answer read as a note
//! or a refusal ([`note`]), and the line a finished leave prints. Pure: the core and the
//! shell's `leave_direct` (`daemon/leave.rs`, which removes the files) decide with it.

use std::path::PathBuf;

use crate::exit::{ExitCode, Failure};
use crate::identity::Identity;
use crate::node_api::{CallError, LeaveAnswer};

/// The files a leave removed, for the operator.
pub fn files_text(files: &[PathBuf]) -> String {
    if files.is_empty() {
        return "nothing (no local files were left)".to_owned();
    }
    files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the control plane's answer to a leave means, for the operator: `Ok` with a note
/// when the node may clean up, `Err` (saying why it could not deregister) when it must not.
/// Pure: the daemon's core and `leave_direct` both decide with it.
pub fn note(id: &Identity, answer: Result<LeaveAnswer, CallError>) -> Result<String, Failure> {
    match answer {
        Ok(LeaveAnswer::Deleted) => Ok(format!("deregistered from {}", id.api_url)),
        Ok(LeaveAnswer::AlreadyGone(status)) => Ok(format!(
            "the control plane no longer knew it (HTTP {status}, already gone)"
        )),
        Err(CallError::Revoked) => {
            Ok("it was revoked on the control plane (an operator deletes it there)".to_owned())
        }
        Err(CallError::Unauthorized) => {
            Ok("the control plane no longer knew it (HTTP 401, already gone)".to_owned())
        }
        Err(e) => {
            let code = match e {
                CallError::Unreachable(_) => ExitCode::ApiUnreachable,
                _ => ExitCode::ServerRefused,
            };
            Err(Failure::new(
                code,
                format!(
                    "cannot deregister node {} from {}: {e}",
                    id.node_id, id.api_url
                ),
            ))
        }
    }
}

/// The line a finished leave prints.
pub fn left_message(node_id: uuid::Uuid, note: &str, removed: &[PathBuf]) -> String {
    format!(
        "node {node_id} left the mesh: {note}; removed {}",
        files_text(removed)
    )
}
