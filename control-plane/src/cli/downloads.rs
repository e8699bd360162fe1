//! The plexd downloads of `serve` and `dev`: which release, from where, signed by which
//! Domain key. Checked before anything binds.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use plexsphere_downloads::{
    ChecksumSigner, Downloads, DownloadsConfig, MirrorConfig, PinnedChecksums,
};

use super::failure::Failure;
use crate::keys::Keyring;
use crate::store::{Store, domains};

#[derive(Debug, Clone, Args)]
pub struct DownloadArgs {
    /// The pinned plexd release served under /downloads/plexd.
    #[arg(long, env = "PLEXD_VERSION", default_value = env!("CARGO_PKG_VERSION"))]
    pub plexd_version: String,
    /// A directory with plexd-linux-amd64 / plexd-linux-arm64; default `<data-dir>/artifacts`.
    #[arg(long, env = "PLEXSPHERE_PLEXD_ARTIFACTS")]
    pub plexd_artifacts: Option<PathBuf>,
    /// Fetch plexd from an upstream mirror instead: a URL template with {version}, {arch},
    /// {platform} or {file}; needs --plexd-mirror-checksums.
    #[arg(long, env = "PLEXSPHERE_PLEXD_MIRROR")]
    pub plexd_mirror: Option<String>,
    /// The URL of the mirror's sha256sum list ({version} allowed): the pinned checksums.
    #[arg(long, env = "PLEXSPHERE_PLEXD_MIRROR_CHECKSUMS")]
    pub plexd_mirror_checksums: Option<String>,
    /// A PEM CA trusted for the mirror besides the system store.
    #[arg(long, env = "PLEXSPHERE_PLEXD_MIRROR_CA")]
    pub plexd_mirror_ca: Option<PathBuf>,
    /// The Domain whose key signs checksums.sha256; default: the only Domain (`dev`: lab).
    #[arg(long, env = "PLEXSPHERE_PLEXD_SIGNING_DOMAIN")]
    pub plexd_signing_domain: Option<String>,
}

impl DownloadArgs {
    /// The downloads configuration, or a config error naming the flag.
    pub fn config(&self, data_dir: &Path) -> Result<DownloadsConfig, Failure> {
        match (&self.plexd_mirror, &self.plexd_mirror_checksums) {
            (None, None) => {
                if self.plexd_mirror_ca.is_some() {
                    return Err(Failure::Config(
                        "--plexd-mirror-ca only applies with --plexd-mirror".into(),
                    ));
                }
                let dir = self
                    .plexd_artifacts
                    .clone()
                    .unwrap_or_else(|| data_dir.join("artifacts"));
                Ok(DownloadsConfig::local(self.plexd_version.clone(), dir))
            }
            (Some(template), Some(checksums)) => {
                if self.plexd_artifacts.is_some() {
                    return Err(Failure::Config(
                        "--plexd-artifacts and --plexd-mirror are two sources; give one".into(),
                    ));
                }
                let mut mirror = MirrorConfig::new(
                    template.clone(),
                    PinnedChecksums::Url(checksums.clone()),
                    data_dir.join("plexd-cache"),
                );
                mirror.ca_file = self.plexd_mirror_ca.clone();
                Ok(DownloadsConfig::mirror(self.plexd_version.clone(), mirror))
            }
            (Some(_), None) => Err(Failure::Config(
                "--plexd-mirror needs --plexd-mirror-checksums (the URL of the release's sha256sum list)".into(),
            )),
            (None, Some(_)) => Err(Failure::Config(
                "--plexd-mirror-checksums only applies with --plexd-mirror".into(),
            )),
        }
    }
}

/// Opens the downloads, signed by the key of the Domain `slug` (when it exists in the store).
pub async fn open(
    config: DownloadsConfig,
    store: &Store,
    keys: &Keyring,
    slug: Option<&str>,
) -> Result<Arc<Downloads>, Failure> {
    let signer = match signing_domain(store, slug).await? {
        Some(slug) => {
            let domain = keys
                .signer(&slug)
                .map_err(|e| Failure::Runtime(anyhow::anyhow!("{e}")))?;
            let signer = ChecksumSigner::from_domain(domain).map_err(|e| {
                Failure::Runtime(anyhow::anyhow!(
                    "cannot sign checksums.sha256 with the Domain {slug}'s key: {e}"
                ))
            })?;
            tracing::info!(domain = %slug, "checksums.sha256 is signed by the Domain's key");
            Some(signer)
        }
        None => None,
    };
    let downloads = Downloads::open(config, signer)
        .await
        .map_err(|e| Failure::Config(e.to_string()))?;
    tracing::info!(
        version = downloads.version(),
        source = downloads.source_kind(),
        "serving plexd downloads"
    );
    Ok(Arc::new(downloads))
}

/// The Domain whose key signs the checksums: the one named, or the only Domain there is.
async fn signing_domain(store: &Store, slug: Option<&str>) -> Result<Option<String>, Failure> {
    let mut conn = store
        .acquire()
        .await
        .map_err(|e| Failure::Runtime(e.into()))?;
    let all = domains::list(&mut conn)
        .await
        .map_err(|e| Failure::Runtime(e.into()))?;
    match slug {
        Some(s) if all.iter().any(|d| d.slug == s) => Ok(Some(s.to_owned())),
        Some(s) => Err(Failure::Config(format!(
            "--plexd-signing-domain {s:?} is not a Domain of this server; `plexctl domain list` shows them"
        ))),
        None if all.len() == 1 => Ok(all.into_iter().next().map(|d| d.slug)),
        None => {
            if !all.is_empty() {
                tracing::info!(
                    "several Domains and no --plexd-signing-domain: checksums.sha256 is served unsigned"
                );
            }
            Ok(None)
        }
    }
}

/// `dev`: copies the sibling `plexd` of the running binary into the artifacts directory as
/// `plexd-linux-<host arch>` (written beside, then renamed), so the embedded default serves
/// the plexd built from this workspace. Answers the file written, if any.
pub fn stage_sibling_plexd(artifacts: &Path) -> Result<Option<PathBuf>, Failure> {
    let Ok(exe) = std::env::current_exe() else {
        return Ok(None);
    };
    let Some(sibling) = exe.parent().map(|d| d.join("plexd")) else {
        return Ok(None);
    };
    if !sibling.is_file() {
        return Ok(None);
    }
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        _ => return Ok(None),
    };
    let target = artifacts.join(format!("plexd-linux-{arch}"));
    let tmp = artifacts.join(format!(".plexd-linux-{arch}.{}.part", std::process::id()));
    let copy = || -> std::io::Result<()> {
        std::fs::create_dir_all(artifacts)?;
        std::fs::copy(&sibling, &tmp)?;
        std::fs::rename(&tmp, &target)
    };
    copy().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Failure::Runtime(anyhow::anyhow!(
            "cannot copy {} to {}: {e}; check the data directory's permissions",
            sibling.display(),
            target.display()
        ))
    })?;
    Ok(Some(target))
}
