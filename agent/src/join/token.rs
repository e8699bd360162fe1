//! Reading the bootstrap token file. Errors name the file and never echo the token.

use std::path::{Path, PathBuf};

use plexsphere_wire::secret::BootstrapToken;

use crate::exit::{ExitCode, Failure};

#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error(
        "there is no bootstrap token at {path} ({source}); write the token from `plexctl bootstrap-token issue` to {path} (mode 0600) and start plexd again"
    )]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the bootstrap token file {path} is empty; write the token from `plexctl bootstrap-token issue` to it and start plexd again"
    )]
    Empty { path: PathBuf },
    #[error(
        "the file {path} does not hold a bootstrap token: {reason}; a token reads pxbt_<env>_node_<id>_<secret>; write a fresh one to {path} and start plexd again"
    )]
    Malformed { path: PathBuf, reason: String },
}

/// A token file plexd cannot use is fixed by writing a fresh token: exit 11.
impl From<TokenFileError> for Failure {
    fn from(e: TokenFileError) -> Self {
        Failure::new(ExitCode::TokenInvalid, e)
    }
}

/// Reads and parses the bootstrap token file.
pub fn read_token(path: &Path) -> Result<BootstrapToken, TokenFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Unreadable {
        path: path.to_path_buf(),
        source,
    })?;
    if text.trim().is_empty() {
        return Err(TokenFileError::Empty {
            path: path.to_path_buf(),
        });
    }
    BootstrapToken::parse(&text).map_err(|e| TokenFileError::Malformed {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use plexsphere_wire::secret::TokenKind;

    use super::*;

    #[test]
    fn token_file_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bootstrap-token");
        let e = read_token(&p).unwrap_err().to_string();
        assert!(
            e.contains("there is no bootstrap token at") && e.contains("bootstrap-token"),
            "{e}"
        );
        std::fs::write(&p, "\n  \n").unwrap();
        assert!(matches!(read_token(&p), Err(TokenFileError::Empty { .. })));
        std::fs::write(&p, "ghp_secretlooking_value\n").unwrap();
        let e = read_token(&p).unwrap_err().to_string();
        assert!(
            e.contains("does not hold a bootstrap token") && e.contains("pxbt_"),
            "{e}"
        );
        assert!(!e.contains("secretlooking"), "{e}");
        let t = BootstrapToken::generate("lab", TokenKind::Node).unwrap();
        std::fs::write(&p, format!("{}\n", t.expose())).unwrap();
        assert_eq!(read_token(&p).unwrap(), t);
    }
}
