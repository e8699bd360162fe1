//! `plexsphere-downloads`: the plexd downloads of the control plane.
//!
//! Serves the pinned plexd release (`PLEXD_VERSION`) under `/downloads/plexd`:
//!
//! | path | answer |
//! |---|---|
//! | `GET /downloads/plexd` | JSON [`Index`]: version, platforms with their SHA-256, paths |
//! | `GET\|HEAD /downloads/plexd/linux-{amd64,arm64}` | the binary, `application/octet-stream`, `ETag`, single `Range`s (206/416), `If-Range`, `If-None-Match` |
//! | `GET\|HEAD /downloads/plexd/checksums.sha256` | `<sha256>  plexd-linux-<arch>` lines (`sha256sum -c`) |
//! | `GET\|HEAD /downloads/plexd/checksums.sha256.sig` | 64 raw bytes: Ed25519 by the Domain key over the checksums' bytes |
//! | `GET\|HEAD /downloads/plexd/signing-key.pem` | the SPKI PEM of the Domain public key |
//!
//! Refusals are `wire::ApiError`s: an unknown platform, or one the release lacks, is 404
//! `unknown_platform`; a mirror that is unreachable while nothing is cached is 502
//! `plexd_download_upstream_unavailable`; a mirrored binary that does not match its pinned
//! checksum is 502 [`CHECKSUM_MISMATCH`] (`plexd_download_checksum_mismatch`) and is never
//! cached; without a signer `.sig` and `signing-key.pem` are 404 `not_found`.
//!
//! ```no_run
//! # async fn f(seed: [u8; 32]) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use plexsphere_downloads::{ChecksumSigner, Downloads, DownloadsConfig};
//! use plexsphere_wire::signed::DomainSigner;
//!
//! let signer = ChecksumSigner::from_domain(Arc::new(DomainSigner::from_seed(&seed)?))?;
//! let downloads = Downloads::open(
//!     DownloadsConfig::local("0.1.0", "/var/lib/plexsphere/artifacts"),
//!     Some(signer),
//! )
//! .await?;
//! let app: axum::Router = axum::Router::new().merge(plexsphere_downloads::router(Arc::new(downloads)));
//! # Ok(()) }
//! ```

mod atomic;
pub mod checksums;
pub mod config;
mod downloads;
pub mod error;
mod http;
mod local;
pub mod manifest;
mod mirror;
mod mirror_client;
pub mod platform;
pub mod range;
pub mod release;
pub mod signing;
mod slot;

pub use checksums::{Checksums, ChecksumsError};
pub use config::{ConfigError, DownloadsConfig, MirrorConfig, PinnedChecksums, Source};
pub use downloads::{BASE_PATH, ChecksumsFile, Downloads, Index, IndexPlatform};
pub use error::{CHECKSUM_MISMATCH, DownloadError, RELEASE_UNVERIFIED};
pub use http::router;
pub use platform::Platform;
pub use signing::{ChecksumSigner, SigningError};
pub use slot::OpenedFile;
