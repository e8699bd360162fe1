//! The plexd downloads of `serve` and `dev`: which release, from where, signed by which
//! Domain key. Checked before anything binds.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use plexsphere_downloads::manifest::{self, ReleaseKey};
use plexsphere_downloads::release;
use plexsphere_downloads::{
    ChecksumSigner, Downloads, DownloadsConfig, MirrorConfig, PinnedChecksums, Source,
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
    /// Fetch plexd from an upstream mirror instead: an https URL template with {version},
    /// {arch}, {platform} or {file}; needs --plexd-mirror-manifest (with --plexd-release-key)
    /// or --plexd-pinned-checksums.
    #[arg(long, env = "PLEXSPHERE_PLEXD_MIRROR")]
    pub plexd_mirror: Option<String>,
    /// The https URL ({version} allowed) of the release's signed manifest, plexd-release.json
    /// (`plexsphere release sign` writes it); trusted only when a --plexd-release-key signed it.
    #[arg(long, env = "PLEXSPHERE_PLEXD_MIRROR_MANIFEST")]
    pub plexd_mirror_manifest: Option<String>,
    /// A trusted release-signing public key (base64, what `plexsphere release-key generate`
    /// prints); repeat it (or separate with commas) to trust an old and a new key while rotating.
    #[arg(
        long = "plexd-release-key",
        env = "PLEXSPHERE_PLEXD_RELEASE_KEYS",
        value_delimiter = ','
    )]
    pub plexd_release_keys: Vec<String>,
    /// A file with the release's sha256sum list, pinned in the server's configuration (instead
    /// of a signed manifest).
    #[arg(long, env = "PLEXSPHERE_PLEXD_PINNED_CHECKSUMS")]
    pub plexd_pinned_checksums: Option<PathBuf>,
    /// No longer accepted: checksums fetched from the mirror were trusted on first use.
    #[arg(long, env = "PLEXSPHERE_PLEXD_MIRROR_CHECKSUMS", hide = true)]
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
    pub(crate) fn config(&self, data_dir: &Path) -> Result<DownloadsConfig, Failure> {
        let config = |msg: &str| Err(Failure::Config(msg.to_owned()));
        if self.plexd_mirror_checksums.is_some() {
            return config(
                "--plexd-mirror-checksums (PLEXSPHERE_PLEXD_MIRROR_CHECKSUMS) is no longer accepted: checksums fetched from the mirror were trusted on first use; sign the release (`plexsphere release sign`) and give --plexd-mirror-manifest with --plexd-release-key, or pin them with --plexd-pinned-checksums <file> (docs/downloads.md)",
            );
        }
        let Some(template) = &self.plexd_mirror else {
            if self.plexd_mirror_ca.is_some()
                || self.plexd_mirror_manifest.is_some()
                || self.plexd_pinned_checksums.is_some()
                || !self.plexd_release_keys.is_empty()
            {
                return config(
                    "--plexd-mirror-ca, --plexd-mirror-manifest, --plexd-release-key and --plexd-pinned-checksums only apply with --plexd-mirror",
                );
            }
            let dir = self
                .plexd_artifacts
                .clone()
                .unwrap_or_else(|| data_dir.join("artifacts"));
            return Ok(DownloadsConfig::local(self.plexd_version.clone(), dir));
        };
        if self.plexd_artifacts.is_some() {
            return config("--plexd-artifacts and --plexd-mirror are two sources; give one");
        }
        let checksums = match (&self.plexd_mirror_manifest, &self.plexd_pinned_checksums) {
            (Some(url), None) => PinnedChecksums::SignedManifest {
                url: url.clone(),
                keys: self.release_keys()?,
            },
            (None, Some(file)) => {
                if !self.plexd_release_keys.is_empty() {
                    return config(
                        "--plexd-release-key applies to --plexd-mirror-manifest, not to --plexd-pinned-checksums",
                    );
                }
                let text = std::fs::read_to_string(file).map_err(|e| {
                    Failure::Config(format!(
                        "cannot read --plexd-pinned-checksums {}: {e}",
                        file.display()
                    ))
                })?;
                PinnedChecksums::Inline(text)
            }
            (Some(_), Some(_)) => {
                return config(
                    "--plexd-mirror-manifest and --plexd-pinned-checksums are two sources of checksums; give one",
                );
            }
            (None, None) => {
                return config(
                    "--plexd-mirror needs the release's checksums from the server's configuration: --plexd-mirror-manifest <https URL of plexd-release.json> with --plexd-release-key <base64>, or --plexd-pinned-checksums <file>",
                );
            }
        };
        let mut mirror =
            MirrorConfig::new(template.clone(), checksums, data_dir.join("plexd-cache"));
        mirror.ca_file = self.plexd_mirror_ca.clone();
        Ok(DownloadsConfig::mirror(self.plexd_version.clone(), mirror))
    }

    fn release_keys(&self) -> Result<Vec<ReleaseKey>, Failure> {
        if self.plexd_release_keys.is_empty() {
            return Err(Failure::Config(
                "--plexd-mirror-manifest needs at least one --plexd-release-key (the base64 public key `plexsphere release-key generate` printed)".into(),
            ));
        }
        self.plexd_release_keys
            .iter()
            .map(|k| {
                manifest::decode_key(k).ok_or_else(|| {
                    Failure::Config(format!(
                        "--plexd-release-key {k:?} is not a 32-byte Ed25519 public key in base64; `plexsphere release-key generate` prints one"
                    ))
                })
            })
            .collect()
    }
}

/// The release keys of a mirror configuration, to check none is a Domain key.
fn release_keys_of(config: &DownloadsConfig) -> &[ReleaseKey] {
    match &config.source {
        Source::Mirror(MirrorConfig {
            checksums: PinnedChecksums::SignedManifest { keys, .. },
            ..
        }) => keys,
        _ => &[],
    }
}

/// Opens the downloads, signed by the key of the Domain `slug` (when it exists in the store).
pub(crate) async fn open(
    config: DownloadsConfig,
    store: &Store,
    keys: &Keyring,
    slug: Option<&str>,
) -> Result<Arc<Downloads>, Failure> {
    let signer = match signing_domain(store, slug).await? {
        Some(d) => {
            let slug = d.slug.clone();
            let domain = keys
                .signer(&d)
                .await
                .map_err(|e| Failure::Runtime(anyhow::anyhow!("{e}")))?;
            let signer = ChecksumSigner::from_domain(domain).map_err(|e| {
                Failure::Runtime(anyhow::anyhow!(
                    "cannot sign checksums.sha256 with the Domain {slug}'s key: {e}"
                ))
            })?;
            if release_keys_of(&config).contains(signer.public_key()) {
                return Err(Failure::Config(format!(
                    "a --plexd-release-key is the Domain {slug}'s own key; a release key must be a separate key (`plexsphere release-key generate`)"
                )));
            }
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
async fn signing_domain(
    store: &Store,
    slug: Option<&str>,
) -> Result<Option<domains::Domain>, Failure> {
    let mut conn = store
        .acquire()
        .await
        .map_err(|e| Failure::Runtime(e.into()))?;
    let all = domains::list(&mut conn)
        .await
        .map_err(|e| Failure::Runtime(e.into()))?;
    match slug {
        Some(s) if all.iter().any(|d| d.slug == s) => Ok(all.into_iter().find(|d| d.slug == s)),
        Some(s) => Err(Failure::Config(format!(
            "--plexd-signing-domain {s:?} is not a Domain of this server; `plexctl domain list` shows them"
        ))),
        None if all.len() == 1 => Ok(all.into_iter().next()),
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
pub(crate) fn stage_sibling_plexd(artifacts: &Path) -> Result<Option<PathBuf>, Failure> {
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

/// `plexsphere release-key ...`: the keys that sign plexd releases (separate from every Domain
/// key; kept by whoever publishes releases, not on the control plane).
#[derive(Debug, clap::Subcommand)]
pub enum ReleaseKeyCommand {
    /// Write a new Ed25519 release-signing key (PKCS#8 PEM, 0600; never overwrites) and print
    /// its public key, what the server's --plexd-release-key takes.
    Generate {
        /// The private key file to create.
        #[arg(long)]
        out: PathBuf,
    },
    /// Print the public key of a release-signing key.
    Public {
        #[arg(long)]
        key: PathBuf,
    },
}

/// `plexsphere release sign`: the signed manifest of a plexd release.
#[derive(Debug, clap::Subcommand)]
pub enum ReleaseCommand {
    /// Hash plexd-linux-amd64 / plexd-linux-arm64 in a directory and write plexd-release.json
    /// there: their manifest for the version, signed by each --key (two while rotating).
    Sign {
        /// A release-signing key (`release-key generate`); repeat to sign with several.
        #[arg(long = "key", required = true)]
        keys: Vec<PathBuf>,
        /// The plexd version of the binaries (what servers pin as PLEXD_VERSION).
        #[arg(long)]
        version: String,
        /// The directory holding the binaries; plexd-release.json is written there.
        dir: PathBuf,
    },
}

pub(crate) fn release_key(cmd: ReleaseKeyCommand) -> Result<(), Failure> {
    let failed = |e: release::ReleaseError| Failure::Config(e.to_string());
    match cmd {
        ReleaseKeyCommand::Generate { out } => {
            let public = release::generate_key(&out).map_err(failed)?;
            eprintln!(
                "wrote the release-signing key {} (keep it offline; it signs plexd releases)",
                out.display()
            );
            println!("{public}");
        }
        ReleaseKeyCommand::Public { key } => {
            let pair = release::load_key(&key).map_err(failed)?;
            println!("{}", release::public_key_b64(&pair));
        }
    }
    Ok(())
}

pub fn release(cmd: ReleaseCommand) -> Result<(), Failure> {
    let failed = |e: release::ReleaseError| Failure::Config(e.to_string());
    let ReleaseCommand::Sign { keys, version, dir } = cmd;
    let pairs = keys
        .iter()
        .map(|k| release::load_key(k))
        .collect::<Result<Vec<_>, _>>()
        .map_err(failed)?;
    let refs: Vec<&_> = pairs.iter().collect();
    let out = dir.join(manifest::ENVELOPE_FILE);
    let signed = release::sign_dir(&dir, &version, &refs, &out).map_err(failed)?;
    for (platform, file) in &signed.platforms {
        println!(
            "{}  {}  {} bytes",
            hex::encode(file.sha256),
            platform.file_name(),
            file.size
        );
    }
    for pair in &pairs {
        println!("signed by {}", release::public_key_b64(pair));
    }
    println!("wrote {}", signed.path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(mirror: Option<&str>) -> DownloadArgs {
        DownloadArgs {
            plexd_version: "1.2.3".into(),
            plexd_artifacts: None,
            plexd_mirror: mirror.map(str::to_owned),
            plexd_mirror_manifest: None,
            plexd_release_keys: Vec::new(),
            plexd_pinned_checksums: None,
            plexd_mirror_checksums: None,
            plexd_mirror_ca: None,
            plexd_signing_domain: None,
        }
    }

    fn refused(a: &DownloadArgs) -> String {
        match a.config(Path::new("/tmp/none")) {
            Err(Failure::Config(msg)) => msg,
            Err(Failure::Runtime(e)) => panic!("expected a config error, got {e}"),
            Ok(c) => panic!("expected a config error, got {c:?}"),
        }
    }

    #[test]
    fn a_mirror_needs_checksums_from_the_configuration() {
        let template = "https://m.example/{version}/plexd-linux-{arch}";
        assert!(refused(&args(Some(template))).contains("--plexd-mirror-manifest"));

        let mut legacy = args(Some(template));
        legacy.plexd_mirror_checksums = Some("https://m.example/checksums".into());
        assert!(refused(&legacy).contains("no longer accepted"));

        let mut no_key = args(Some(template));
        no_key.plexd_mirror_manifest =
            Some("https://m.example/{version}/plexd-release.json".into());
        assert!(refused(&no_key).contains("--plexd-release-key"));

        let mut bad_key = no_key.clone();
        bad_key.plexd_release_keys = vec!["not a key".into()];
        assert!(refused(&bad_key).contains("not a 32-byte"));

        let mut good = no_key.clone();
        good.plexd_release_keys = vec![base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            [7u8; 32],
        )];
        let Ok(config) = good.config(Path::new("/tmp/none")) else {
            panic!("a manifest URL with a key is a configuration");
        };
        assert_eq!(release_keys_of(&config), &[[7u8; 32]]);

        let mut stray = args(None);
        stray.plexd_release_keys = good.plexd_release_keys.clone();
        assert!(refused(&stray).contains("only apply with --plexd-mirror"));
    }
}
