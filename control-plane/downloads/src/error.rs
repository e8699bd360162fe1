//! What can go wrong serving a download, and the ONE mapping to an HTTP status and a stable
//! machine code (every error body is a `wire::ApiError`).

use std::path::PathBuf;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use plexsphere_wire::{ApiError, codes};

use crate::platform::Platform;

/// 502: a binary fetched from the mirror does not have its pinned checksum. It is not cached;
/// the next request fetches again. Documented here, not in `wire::codes`: only operators and
/// download tools read it.
pub const CHECKSUM_MISMATCH: &str = "plexd_download_checksum_mismatch";
/// 502: the mirror's release manifest is not signed by a trusted release key, is malformed or
/// names another version. Nothing is served from it; a manifest verified earlier stays.
pub const RELEASE_UNVERIFIED: &str = "plexd_download_release_unverified";

#[derive(Debug, Clone, thiserror::Error)]
pub enum DownloadError {
    #[error(
        "plexd is not built for the platform {0:?}; the platforms are linux-amd64 and linux-arm64"
    )]
    UnknownPlatform(String),
    /// A known platform the pinned release does not have (no file in the artifacts directory,
    /// or no line in the pinned checksums). Also `unknown_platform`: for the client it is the
    /// same fact, "no plexd build for this platform here".
    #[error("plexd {version} has no {platform} build on this server ({reason})")]
    NotInRelease {
        version: String,
        platform: Platform,
        reason: String,
    },
    #[error(
        "plexd {version} has no build on this server yet ({reason}); checksums.sha256 lists nothing"
    )]
    NothingAvailable { version: String, reason: String },
    #[error("this server does not sign checksums.sha256 (no Domain signing key was configured)")]
    NotSigned,
    #[error("the plexd mirror is unavailable: {url}: {reason}")]
    UpstreamUnavailable { url: String, reason: String },
    #[error(
        "{file} from the plexd mirror ({url}) has SHA-256 {actual}, but plexd {version} pins {expected}; it was discarded, not cached"
    )]
    ChecksumMismatch {
        version: String,
        file: &'static str,
        url: String,
        expected: String,
        actual: String,
    },
    #[error(
        "the plexd {version} release manifest from the mirror ({url}) is refused: {reason}; nothing was served from it"
    )]
    ReleaseUnverified {
        version: String,
        url: String,
        reason: String,
    },
    #[error("{what} {path}: {reason}")]
    Io {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
}

impl DownloadError {
    pub fn io(what: &'static str, path: impl Into<PathBuf>, e: &std::io::Error) -> Self {
        Self::Io {
            what,
            path: path.into(),
            reason: e.to_string(),
        }
    }

    /// The status and the machine code of this error.
    pub fn classify(&self) -> (StatusCode, &'static str) {
        match self {
            Self::UnknownPlatform(_) | Self::NotInRelease { .. } => {
                (StatusCode::NOT_FOUND, codes::UNKNOWN_PLATFORM)
            }
            Self::NothingAvailable { .. } | Self::NotSigned => {
                (StatusCode::NOT_FOUND, codes::NOT_FOUND)
            }
            Self::UpstreamUnavailable { .. } => (
                StatusCode::BAD_GATEWAY,
                codes::PLEXD_DOWNLOAD_UPSTREAM_UNAVAILABLE,
            ),
            Self::ChecksumMismatch { .. } => (StatusCode::BAD_GATEWAY, CHECKSUM_MISMATCH),
            Self::ReleaseUnverified { .. } => (StatusCode::BAD_GATEWAY, RELEASE_UNVERIFIED),
            Self::Io { .. } => (StatusCode::INTERNAL_SERVER_ERROR, codes::INTERNAL),
        }
    }

    /// What the client reads. 4xx say exactly what is missing; 5xx say what happened without
    /// the server's paths or the mirror's address (the server log has those).
    pub fn public_message(&self) -> String {
        match self {
            Self::UpstreamUnavailable { .. } => {
                "the server cannot reach its plexd mirror and has no cached copy of this file; retry later (the server log names the mirror and the reason)".to_owned()
            }
            Self::ChecksumMismatch { file, version, .. } => format!(
                "{file} from the plexd mirror does not match the checksum pinned for plexd {version}; it was discarded; retry later or ask the operator to check the mirror"
            ),
            Self::ReleaseUnverified { version, .. } => format!(
                "the plexd {version} release manifest on the mirror is not signed by a release key this server trusts (or is malformed, or for another version); nothing was served from it; ask the operator to check the mirror (the server log says why)"
            ),
            Self::Io { .. } => {
                "an internal error occurred serving the download; the server log has the detail"
                    .to_owned()
            }
            other => other.to_string(),
        }
    }
}

impl IntoResponse for DownloadError {
    fn into_response(self) -> Response {
        let (status, code) = self.classify();
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %self, code, "download failed");
        } else if status.is_server_error() {
            // Logged in full (with the mirror's address) where it was detected.
            tracing::debug!(error = %self, code, "download refused");
        }
        (status, Json(ApiError::new(code, self.public_message()))).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_codes() {
        let cases = [
            (
                DownloadError::UnknownPlatform("linux-riscv64".into()),
                404,
                "unknown_platform",
            ),
            (
                DownloadError::NotInRelease {
                    version: "1".into(),
                    platform: Platform::LinuxArm64,
                    reason: "no file".into(),
                },
                404,
                "unknown_platform",
            ),
            (DownloadError::NotSigned, 404, "not_found"),
            (
                DownloadError::UpstreamUnavailable {
                    url: "https://m/x".into(),
                    reason: "connection refused".into(),
                },
                502,
                "plexd_download_upstream_unavailable",
            ),
            (
                DownloadError::ChecksumMismatch {
                    version: "1".into(),
                    file: "plexd-linux-amd64",
                    url: "https://m/x".into(),
                    expected: "aa".into(),
                    actual: "bb".into(),
                },
                502,
                "plexd_download_checksum_mismatch",
            ),
            (
                DownloadError::ReleaseUnverified {
                    version: "1".into(),
                    url: "https://m/x".into(),
                    reason: "untrusted".into(),
                },
                502,
                "plexd_download_release_unverified",
            ),
        ];
        for (e, status, code) in cases {
            let (s, c) = e.classify();
            assert_eq!((s.as_u16(), c), (status, code), "{e}");
        }
    }

    #[test]
    fn five_hundreds_hide_paths_and_addresses() {
        let e = DownloadError::UpstreamUnavailable {
            url: "https://secret-mirror.internal/x".into(),
            reason: "dns".into(),
        };
        assert!(!e.public_message().contains("secret-mirror"));
        let e = DownloadError::Io {
            what: "cannot read",
            path: "/var/lib/plexsphere/cache".into(),
            reason: "EIO".into(),
        };
        assert!(!e.public_message().contains("/var/lib"));
    }
}
