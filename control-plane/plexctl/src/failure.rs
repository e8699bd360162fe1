//! Why a plexctl command failed, and the exit code for each reason (see `main`).

use crate::client::ClientError;
use crate::config::ConfigError;

/// Why a command failed, and how plexctl exits for it.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A bad argument value: exit 64.
    #[error("{0}")]
    Usage(String),
    /// The server has no such object (found by plexctl itself, e.g. a project slug): exit 1.
    #[error("{0}")]
    NotFound(String),
    #[error("cannot print the answer as JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// `--wait` saw the resource settle in Failed (or vanish): exit 1.
    #[error("{0}")]
    ResourceFailed(String),
    /// An access policy document with problems, one `FILE:LINE:COLUMN: message` per line
    /// (`policy test`, `policy set`): exit 1.
    #[error("{0}")]
    PolicyInvalid(String),
    /// `plexctl login` did not get a session (the issuer or the server refused): exit 1.
    #[error("{0}")]
    Login(String),
    /// `--wait` gave up at `--timeout`: exit 2.
    #[error("{0}")]
    WaitTimedOut(String),
    /// `audit verify` found the chain tampered with, one problem per line: exit 1.
    #[error("{0}")]
    AuditTampered(String),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Config(_) | Failure::Usage(_) => 64,
            Failure::Client(e) => e.exit_code(),
            Failure::NotFound(_)
            | Failure::Json(_)
            | Failure::ResourceFailed(_)
            | Failure::PolicyInvalid(_)
            | Failure::AuditTampered(_)
            | Failure::Login(_) => 1,
            Failure::WaitTimedOut(_) => 2,
        }
    }
}
