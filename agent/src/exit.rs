//! The exit codes of `plexd`, in one place, and the pure mapping from a server refusal to one.
//!
//! | code | meaning | next step |
//! |------|---------|-----------|
//! | 0  | success | |
//! | 1  | `plexd ping`: no echo reply came back; `plexd netcheck`: a check failed | see the verdicts and hints |
//! | 3  | `plexd status`, `ping`, `rotate-*`: no daemon answers on the status socket (`--output json` prints `{"ok":false,"exit_code":3,"error":"not_running",...}`) | `systemctl start plexd` |
//! | 10 | the bootstrap token was already used (`token_consumed`) | write a fresh token |
//! | 11 | the bootstrap token is missing, malformed, unknown, expired, revoked, of the wrong kind, or for another project | write a fresh token / fix `registration.project_id` |
//! | 12 | still rate-limited (HTTP 429) when `--max-wait` ran out | wait, then start again |
//! | 13 | the API is not trusted (TLS) or not reachable (DNS, refused, timeout); `join` and `run` retry an unreachable API with backoff and give up with 13 when `--max-wait` ran out | install the CA / check the network (`plexd netcheck`) |
//! | 14 | another server refusal (mesh range exhausted, 5xx, an unexpected answer) | see the message |
//! | 15 | the node was revoked (`node_revoked`) or deleted on the control plane (401) | `plexd leave`, then enrol again |
//! | 16 | the state dir was enrolled on another host (a copy: local host check or `clone_refused`) | remove the state dir, enrol with a fresh token |
//! | 64 | bad command line (usage) | see `plexd --help` |
//! | 74 | a local step failed: a file could not be read or written (state dir, unit dir), `systemctl` failed, or `uninstall --force` met a daemon it cannot stop | see the message |
//! | 78 | bad configuration or a state file plexd cannot use | fix the named file |
//!
//! The systemd unit lists 10, 11, 15, 16, 64 and 78 in `RestartPreventExitStatus=`: they do not fix
//! themselves by restarting.

use plexsphere_wire::codes;

/// Why `plexd` stopped. `as_i32` is the process exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    Ok,
    /// A diagnostic found a problem (no echo reply, a failed check).
    CheckFailed,
    NotRunning,
    TokenConsumed,
    TokenInvalid,
    RateLimited,
    ApiUnreachable,
    ServerRefused,
    NodeGone,
    Cloned,
    Usage,
    Io,
    Config,
}

impl ExitCode {
    pub const ALL: [ExitCode; 13] = [
        ExitCode::Ok,
        ExitCode::CheckFailed,
        ExitCode::NotRunning,
        ExitCode::TokenConsumed,
        ExitCode::TokenInvalid,
        ExitCode::RateLimited,
        ExitCode::ApiUnreachable,
        ExitCode::ServerRefused,
        ExitCode::NodeGone,
        ExitCode::Cloned,
        ExitCode::Usage,
        ExitCode::Io,
        ExitCode::Config,
    ];

    /// The code with this exit status (as the daemon passes a failure over its socket).
    pub(crate) fn from_i32(status: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_i32() == status)
    }

    /// The control plane could not be reached or refused: trying again later may help.
    pub(crate) fn is_api_failure(self) -> bool {
        matches!(self, ExitCode::ApiUnreachable | ExitCode::ServerRefused)
    }

    pub fn as_i32(self) -> i32 {
        match self {
            ExitCode::Ok => 0,
            ExitCode::CheckFailed => 1,
            ExitCode::NotRunning => 3,
            ExitCode::TokenConsumed => 10,
            ExitCode::TokenInvalid => 11,
            ExitCode::RateLimited => 12,
            ExitCode::ApiUnreachable => 13,
            ExitCode::ServerRefused => 14,
            ExitCode::NodeGone => 15,
            ExitCode::Cloned => 16,
            ExitCode::Usage => 64,
            ExitCode::Io => 74,
            ExitCode::Config => 78,
        }
    }
}

impl ExitCode {
    /// The stable machine name `--output json` prints beside the number.
    pub fn name(self) -> &'static str {
        match self {
            ExitCode::Ok => "ok",
            ExitCode::CheckFailed => "check_failed",
            ExitCode::NotRunning => "not_running",
            ExitCode::TokenConsumed => "token_consumed",
            ExitCode::TokenInvalid => "token_invalid",
            ExitCode::RateLimited => "rate_limited",
            ExitCode::ApiUnreachable => "api_unreachable",
            ExitCode::ServerRefused => "server_refused",
            ExitCode::NodeGone => "node_gone",
            ExitCode::Cloned => "cloned",
            ExitCode::Usage => "usage",
            ExitCode::Io => "io",
            ExitCode::Config => "config",
        }
    }
}

/// A failure as `--output json` prints it on stdout (the plain line still goes to stderr).
pub(crate) fn failure_json(f: &Failure) -> serde_json::Value {
    serde_json::json!({
        "ok": false,
        "exit_code": f.code.as_i32(),
        "error": f.code.name(),
        "message": f.message,
    })
}

/// The exit-code table as `plexd --help` shows it.
pub(crate) const HELP: &str = "\
Exit codes:
  0   success
  1   plexd ping: no reply; plexd netcheck: a check failed
  3   plexd status, ping, rotate-*: the daemon is not running (no answer on its socket)
  10  the bootstrap token was already used (token_consumed): write a fresh token
  11  the bootstrap token is missing, malformed, unknown, expired, revoked, of the wrong kind,
      or for another project
  12  still rate-limited by the API when --max-wait ran out
  13  the API is not trusted (TLS) or not reachable (join and run retry an unreachable
      API until --max-wait runs out)
  14  another refusal by the server (mesh range exhausted, server error, unexpected answer)
  15  the node was revoked or deleted on the control plane: run plexd leave and enrol again
  16  the state dir was enrolled on another host (a copy): remove it here and enrol this
      host with its own token
  64  bad command line
  74  a local step failed: a file could not be read or written, systemctl failed, or
      plexd uninstall --force met a daemon it cannot stop
  78  bad configuration or unusable state file";

/// Maps a refusal of `POST /v1/register` (its HTTP status and machine code) to an exit code.
pub(crate) fn for_register_refusal(status: u16, code: &str) -> ExitCode {
    match code {
        codes::TOKEN_CONSUMED => ExitCode::TokenConsumed,
        codes::TOKEN_UNKNOWN
        | codes::TOKEN_EXPIRED
        | codes::TOKEN_REVOKED
        | codes::TOKEN_KIND_MISMATCH
        | codes::PROJECT_MISMATCH => ExitCode::TokenInvalid,
        codes::RATE_LIMITED => ExitCode::RateLimited,
        _ if status == 429 => ExitCode::RateLimited,
        _ => ExitCode::ServerRefused,
    }
}

/// A failed command: the exit code and the one-line message for the operator.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub code: ExitCode,
    pub message: String,
}

impl Failure {
    pub fn new(code: ExitCode, message: impl std::fmt::Display) -> Self {
        Self {
            code,
            message: message.to_string(),
        }
    }
}

// Where the library's errors become exit codes. This file imports only the modules below the
// commands (config, fsutil, tls, identity, api_client); a command's own error maps next to its
// definition (the token file's in join/token.rs), so no command imports this file back.

impl From<crate::config::ConfigError> for Failure {
    fn from(e: crate::config::ConfigError) -> Self {
        Failure::new(ExitCode::Config, e)
    }
}

impl From<crate::fsutil::FsError> for Failure {
    fn from(e: crate::fsutil::FsError) -> Self {
        Failure::new(ExitCode::Io, e)
    }
}

impl From<crate::tls::TlsError> for Failure {
    fn from(e: crate::tls::TlsError) -> Self {
        Failure::new(ExitCode::Config, e)
    }
}

impl From<crate::identity::KeyError> for Failure {
    fn from(e: crate::identity::KeyError) -> Self {
        use crate::identity::KeyError;
        match e {
            KeyError::Fs(f) => f.into(),
            e @ KeyError::Malformed { .. } => Failure::new(ExitCode::Config, e),
        }
    }
}

impl From<crate::identity::IdentityError> for Failure {
    fn from(e: crate::identity::IdentityError) -> Self {
        use crate::identity::IdentityError;
        match e {
            IdentityError::Fs(f) => f.into(),
            e => Failure::new(ExitCode::Config, e),
        }
    }
}

impl From<crate::identity::host::HostError> for Failure {
    fn from(e: crate::identity::host::HostError) -> Self {
        use crate::identity::host::HostError;
        match e {
            HostError::Fs(f) => f.into(),
            e @ HostError::Cloned(_) => Failure::new(ExitCode::Cloned, e),
            e => Failure::new(ExitCode::Config, e),
        }
    }
}

impl From<crate::api_client::ApiClientError> for Failure {
    fn from(e: crate::api_client::ApiClientError) -> Self {
        use crate::api_client::ApiClientError as E;
        let code = match &e {
            E::NotTrusted { .. } | E::Unreachable { .. } => ExitCode::ApiUnreachable,
            E::BadAnswer { .. } => ExitCode::ServerRefused,
            E::Tls(_) | E::Build(_) => ExitCode::Config,
        };
        Failure::new(code, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exit_status_maps_back_to_its_code() {
        for code in ExitCode::ALL {
            assert_eq!(ExitCode::from_i32(code.as_i32()), Some(code));
        }
        assert_eq!(ExitCode::from_i32(2), None);
    }

    #[test]
    fn refusals_map_to_their_exit_codes() {
        assert_eq!(
            for_register_refusal(403, codes::TOKEN_CONSUMED).as_i32(),
            10
        );
        for code in [
            codes::TOKEN_UNKNOWN,
            codes::TOKEN_EXPIRED,
            codes::TOKEN_REVOKED,
            codes::TOKEN_KIND_MISMATCH,
            codes::PROJECT_MISMATCH,
        ] {
            assert_eq!(for_register_refusal(403, code).as_i32(), 11, "{code}");
        }
        assert_eq!(for_register_refusal(429, codes::RATE_LIMITED).as_i32(), 12);
        assert_eq!(for_register_refusal(429, "something_new").as_i32(), 12);
        assert_eq!(
            for_register_refusal(409, codes::MESH_RANGE_EXHAUSTED).as_i32(),
            14
        );
        assert_eq!(for_register_refusal(500, codes::INTERNAL).as_i32(), 14);
        assert_eq!(
            for_register_refusal(422, codes::INVALID_REQUEST).as_i32(),
            14
        );
    }

    #[test]
    fn failures_in_json_carry_number_name_and_message() {
        let f = Failure::new(ExitCode::NotRunning, "plexd is not running");
        assert_eq!(
            failure_json(&f).to_string(),
            r#"{"error":"not_running","exit_code":3,"message":"plexd is not running","ok":false}"#
        );
        let mut names: Vec<&str> = ExitCode::ALL.iter().map(|c| c.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ExitCode::ALL.len());
    }

    #[test]
    fn help_lists_every_code() {
        for c in [
            ExitCode::Ok,
            ExitCode::CheckFailed,
            ExitCode::NotRunning,
            ExitCode::NodeGone,
            ExitCode::Cloned,
            ExitCode::TokenConsumed,
            ExitCode::TokenInvalid,
            ExitCode::RateLimited,
            ExitCode::ApiUnreachable,
            ExitCode::ServerRefused,
            ExitCode::Usage,
            ExitCode::Io,
            ExitCode::Config,
        ] {
            let needle = format!("\n  {:<3} ", c.as_i32());
            assert!(HELP.contains(&needle), "{needle:?} missing from HELP");
        }
    }
}
