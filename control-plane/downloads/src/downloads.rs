//! [`Downloads`]: the pinned release, its source and its signer, behind one API the HTTP
//! handlers (and anything else in the server) call.

use std::sync::Mutex;
use std::time::Instant;

use plexsphere_wire::ApiError;
use serde::{Deserialize, Serialize};

use crate::checksums::{Checksums, Digest, sha256};
use crate::config::{ConfigError, DownloadsConfig, Source, validate};
use crate::error::DownloadError;
use crate::local::LocalSource;
use crate::mirror::MirrorSource;
use crate::platform::Platform;
use crate::signing::ChecksumSigner;
use crate::slot::OpenedFile;

/// The base path every download lives under.
pub const BASE_PATH: &str = "/downloads/plexd";

/// The pinned plexd release this server hands out.
pub struct Downloads {
    version: String,
    source: SourceImpl,
    signer: Option<ChecksumSigner>,
    /// The last checksums text signed and its signature (the signer may be slow or remote).
    signed: Mutex<Option<(String, [u8; 64])>>,
}

enum SourceImpl {
    Local(Box<LocalSource>),
    Mirror(Box<MirrorSource>),
}

/// `checksums.sha256` as served: the text, its digest (for the `ETag`) and, when the server
/// has a Domain signer, the detached signature of exactly these bytes.
#[derive(Debug, Clone)]
pub struct ChecksumsFile {
    pub text: String,
    pub digest: Digest,
    pub signature: Option<[u8; 64]>,
}

/// `GET /downloads/plexd`: what this server offers.
///
/// ```json
/// {"name":"plexd","version":"1.4.2","source":"local",
///  "platforms":[{"platform":"linux-amd64","file":"plexd-linux-amd64",
///                "path":"/downloads/plexd/linux-amd64","sha256":"<64 hex>"}],
///  "checksums":"/downloads/plexd/checksums.sha256",
///  "signature":"/downloads/plexd/checksums.sha256.sig",
///  "signing_key":"/downloads/plexd/signing-key.pem"}
/// ```
///
/// `signature` and `signing_key` are `null` without a signer. When the checksums cannot be
/// had right now (the mirror is down before they were fetched) `platforms` is empty and
/// `problem` says why (an `ApiError`); the version is always there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    pub name: String,
    pub version: String,
    pub source: String,
    pub platforms: Vec<IndexPlatform>,
    pub checksums: String,
    pub signature: Option<String>,
    pub signing_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<ApiError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexPlatform {
    pub platform: String,
    pub file: String,
    pub path: String,
    pub sha256: String,
}

impl Downloads {
    /// Checks the configuration and opens the source: a local directory is hashed now; a
    /// mirror gets its cache directory and HTTP client (nothing is fetched yet).
    pub async fn open(
        config: DownloadsConfig,
        signer: Option<ChecksumSigner>,
    ) -> Result<Self, ConfigError> {
        let inline = validate(&config)?;
        let source = match config.source {
            Source::Local { dir } => {
                SourceImpl::Local(Box::new(LocalSource::open(&config.version, &dir).await))
            }
            Source::Mirror(m) => SourceImpl::Mirror(Box::new(
                MirrorSource::open(&config.version, m, inline).await?,
            )),
        };
        if signer.is_none() {
            tracing::info!("checksums.sha256 is served unsigned: no Domain signing key was given");
        }
        Ok(Self {
            version: config.version,
            source,
            signer,
            signed: Mutex::new(None),
        })
    }

    /// The pinned version (`PLEXD_VERSION`).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// `local` or `mirror`.
    pub fn source_kind(&self) -> &'static str {
        match self.source {
            SourceImpl::Local(_) => "local",
            SourceImpl::Mirror(_) => "mirror",
        }
    }

    pub fn signer(&self) -> Option<&ChecksumSigner> {
        self.signer.as_ref()
    }

    /// The platform's binary, opened and verified, ready to stream.
    pub async fn binary(&self, platform: Platform) -> Result<OpenedFile, DownloadError> {
        let arrived = Instant::now();
        match &self.source {
            SourceImpl::Local(l) => l.binary(platform).await,
            SourceImpl::Mirror(m) => m.binary(platform, arrived).await,
        }
    }

    /// The digests of every platform of the release.
    pub async fn checksums(&self) -> Result<Checksums, DownloadError> {
        let arrived = Instant::now();
        match &self.source {
            SourceImpl::Local(l) => l.checksums().await,
            SourceImpl::Mirror(m) => m.checksums(arrived).await,
        }
    }

    /// `checksums.sha256` with its digest and signature.
    pub async fn checksums_file(&self) -> Result<ChecksumsFile, DownloadError> {
        let text = self.checksums().await?.render();
        let signature = self.signer.as_ref().map(|s| self.signature_of(s, &text));
        Ok(ChecksumsFile {
            digest: sha256(text.as_bytes()),
            text,
            signature,
        })
    }

    fn signature_of(&self, signer: &ChecksumSigner, text: &str) -> [u8; 64] {
        let mut memo = match self.signed.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some((signed_text, sig)) = memo.as_ref()
            && signed_text == text
        {
            return *sig;
        }
        let sig = signer.sign(text.as_bytes());
        *memo = Some((text.to_owned(), sig));
        sig
    }

    /// What `GET /downloads/plexd` answers.
    pub async fn index(&self) -> Index {
        let (platforms, problem) = match self.checksums().await {
            Ok(c) => (
                c.platforms()
                    .filter_map(|p| {
                        c.get(p).map(|d| IndexPlatform {
                            platform: p.slug().to_owned(),
                            file: p.file_name().to_owned(),
                            path: format!("{BASE_PATH}/{}", p.slug()),
                            sha256: hex::encode(d),
                        })
                    })
                    .collect(),
                None,
            ),
            Err(e) => (
                Vec::new(),
                Some(ApiError::new(e.classify().1, e.public_message())),
            ),
        };
        let signed = self.signer.is_some();
        Index {
            name: "plexd".to_owned(),
            version: self.version.clone(),
            source: self.source_kind().to_owned(),
            platforms,
            checksums: format!("{BASE_PATH}/checksums.sha256"),
            signature: signed.then(|| format!("{BASE_PATH}/checksums.sha256.sig")),
            signing_key: signed.then(|| format!("{BASE_PATH}/signing-key.pem")),
            problem,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_json_shape_is_pinned() {
        let index = Index {
            name: "plexd".into(),
            version: "1.4.2".into(),
            source: "local".into(),
            platforms: vec![IndexPlatform {
                platform: "linux-amd64".into(),
                file: "plexd-linux-amd64".into(),
                path: "/downloads/plexd/linux-amd64".into(),
                sha256: "ab".repeat(32),
            }],
            checksums: "/downloads/plexd/checksums.sha256".into(),
            signature: None,
            signing_key: None,
            problem: None,
        };
        let json = serde_json::to_string(&index).unwrap();
        assert_eq!(
            json,
            format!(
                r#"{{"name":"plexd","version":"1.4.2","source":"local","platforms":[{{"platform":"linux-amd64","file":"plexd-linux-amd64","path":"/downloads/plexd/linux-amd64","sha256":"{}"}}],"checksums":"/downloads/plexd/checksums.sha256","signature":null,"signing_key":null}}"#,
                "ab".repeat(32)
            )
        );
        let back: Index = serde_json::from_str(&json).unwrap();
        assert_eq!(back, index);
    }
}
