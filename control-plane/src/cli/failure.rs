//! How a `plexsphere` command failed: bad configuration (exit 64) or at run time (exit 1).

/// A failure and how the process should exit.
#[derive(Debug)]
pub(crate) enum Failure {
    Config(String),
    Runtime(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Runtime(e)
    }
}
