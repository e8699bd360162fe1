//! The status socket's protocol: one [`Request`] per connection as one JSON line, one
//! [`Answer`] as one JSON document. `plexd status` and `plexd leave` speak it to the daemon.

use serde::{Deserialize, Serialize};

use super::status::StatusReport;

/// One request per connection on `<run_dir>/plexd.sock`, as one JSON line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Request {
    Status,
    /// Run the GSO path probe now, then answer the status (`plexd status --probe-gso`).
    ProbeGso,
    Leave,
    /// Rotate the WireGuard key now (`plexd rotate-key`).
    RotateKey,
    /// Rotate the node credential now (`plexd rotate-credential`).
    RotateCredential,
    /// The policy this node enforces (`plexd policy`).
    Policy,
}

/// The answer, as one JSON document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    Status(Box<StatusReport>),
    Policy(Box<super::policy_status::PolicyReport>),
    Left {
        message: String,
    },
    /// A rotation finished.
    Rotated {
        message: String,
    },
    Error {
        message: String,
        /// The exit status `plexd` ends with for this failure; absent: 14, a refusal.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
    },
}

impl Answer {
    pub fn error(message: impl Into<String>, code: crate::exit::ExitCode) -> Self {
        Answer::Error {
            message: message.into(),
            exit_code: Some(code.as_i32()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_json_is_pinned() {
        assert_eq!(
            serde_json::to_string(&Request::Status).unwrap(),
            r#"{"command":"status"}"#
        );
        let r: Request = serde_json::from_str(r#"{"command":"leave"}"#).unwrap();
        assert_eq!(r, Request::Leave);
        let a = Answer::Left {
            message: "bye".into(),
        };
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"left":{"message":"bye"}}"#
        );
        let e = Answer::error("down", crate::exit::ExitCode::ApiUnreachable);
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"error":{"message":"down","exit_code":13}}"#
        );
        let older: Answer = serde_json::from_str(r#"{"error":{"message":"x"}}"#).unwrap();
        assert_eq!(
            older,
            Answer::Error {
                message: "x".into(),
                exit_code: None
            }
        );
    }
}
