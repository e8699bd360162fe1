//! What the server is told to serve: a pinned plexd version and where its binaries come from.
//! Everything here is checked once, before the server binds anything.

use std::path::PathBuf;
use std::time::Duration;

use crate::checksums::{Checksums, ChecksumsError};
use crate::manifest::ReleaseKey;
use crate::platform::Platform;

/// The pinned release and its source.
#[derive(Debug, Clone)]
pub struct DownloadsConfig {
    /// The pinned plexd version (`PLEXD_VERSION`): `1.4.2`, `v1.4.2`, `0.1.0-rc.1+abc`.
    pub version: String,
    pub source: Source,
}

/// Where the binaries come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A directory holding `plexd-linux-amd64` and/or `plexd-linux-arm64` (the embedded
    /// default: the plexd built from this workspace). Checksums are computed from the files.
    Local { dir: PathBuf },
    /// An upstream mirror, fetched on the first request per platform, checked against the
    /// pinned checksums and cached on disk.
    Mirror(MirrorConfig),
}

/// The longest a connection to the mirror may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest silence while reading an answer from the mirror.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest one fetch from the mirror may take in all (a 512 MiB binary at 1 MiB/s fits).
pub const TOTAL_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The most redirects one fetch follows; every one must stay on https.
pub const MAX_REDIRECTS: usize = 5;
/// The default cap of one binary (a signed manifest's size, when smaller, is the cap).
pub const DEFAULT_MAX_BINARY_BYTES: u64 = 512 * 1024 * 1024;

/// An upstream mirror of plexd releases. Only `https://`: the binaries' integrity comes from
/// the pinned checksums or the signed manifest, never from the mirror, but an http mirror
/// would also show every node's download to the network.
#[derive(Debug, Clone)]
pub struct MirrorConfig {
    /// The URL of one binary, with placeholders: `{version}`, `{arch}` (`amd64`), `{platform}`
    /// (`linux-amd64`) and `{file}` (`plexd-linux-amd64`), e.g.
    /// `https://mirror.example/plexd/{version}/plexd-linux-{arch}`.
    pub url_template: String,
    /// Where the digests every fetched binary must have come from.
    pub checksums: PinnedChecksums,
    /// Verified binaries are kept in `<cache_dir>/<version>/`.
    pub cache_dir: PathBuf,
    /// A PEM CA trusted for the mirror besides the system store.
    pub ca_file: Option<PathBuf>,
    /// A binary larger than this is refused while it downloads.
    pub max_binary_bytes: u64,
    pub connect_timeout: Duration,
    /// The longest silence while reading an answer.
    pub read_timeout: Duration,
    /// The longest one fetch may take.
    pub total_timeout: Duration,
}

/// Where the checksums of a mirrored release come from: the server's own configuration, never
/// the mirror on first use.
#[derive(Debug, Clone)]
pub enum PinnedChecksums {
    /// The text of a sha256sum list, given in the server's configuration.
    Inline(String),
    /// A signed release manifest ([`crate::manifest`]) at this URL (placeholder `{version}`
    /// allowed), trusted only when one of `keys` signed it and it names the pinned version.
    /// Once verified it is kept in the cache directory (and checked again at every start); a
    /// later, different manifest on the mirror is never fetched for this version.
    SignedManifest { url: String, keys: Vec<ReleaseKey> },
}

/// A configuration that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "the plexd version {0:?} is not {rule}; set PLEXD_VERSION to a release such as 1.4.2",
        rule = plexsphere_wire::version::RULE
    )]
    Version(String),
    #[error(
        "the mirror URL template {template:?} {problem}; write it like https://mirror.example/plexd/{{version}}/plexd-linux-{{arch}}"
    )]
    Template {
        template: String,
        problem: &'static str,
    },
    #[error("the pinned checksums given in the configuration are unusable: {0}")]
    Checksums(#[from] ChecksumsError),
    #[error(
        "cannot read the CA file {path} for the plexd mirror: {reason}; fix the path or the PEM"
    )]
    CaFile { path: PathBuf, reason: String },
    #[error(
        "cannot use the cache directory {path} for plexd downloads: {source}; create it and make it writable by the server"
    )]
    CacheDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot build the HTTP client for the plexd mirror: {0}")]
    Client(String),
    #[error(
        "a signed release manifest needs at least one trusted release key; give --plexd-release-key (`plexsphere release-key generate` prints one)"
    )]
    NoReleaseKey,
}

impl DownloadsConfig {
    pub fn local(version: impl Into<String>, dir: impl Into<PathBuf>) -> Self {
        Self {
            version: version.into(),
            source: Source::Local { dir: dir.into() },
        }
    }

    pub fn mirror(version: impl Into<String>, mirror: MirrorConfig) -> Self {
        Self {
            version: version.into(),
            source: Source::Mirror(mirror),
        }
    }
}

impl MirrorConfig {
    /// A mirror with the default limits: [`CONNECT_TIMEOUT`], [`READ_TIMEOUT`],
    /// [`TOTAL_TIMEOUT`], [`DEFAULT_MAX_BINARY_BYTES`].
    pub fn new(
        url_template: impl Into<String>,
        checksums: PinnedChecksums,
        cache_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            url_template: url_template.into(),
            checksums,
            cache_dir: cache_dir.into(),
            ca_file: None,
            max_binary_bytes: DEFAULT_MAX_BINARY_BYTES,
            connect_timeout: CONNECT_TIMEOUT,
            read_timeout: READ_TIMEOUT,
            total_timeout: TOTAL_TIMEOUT,
        }
    }
}

/// The release must be a plexd version (`plexsphere_wire::version`): safe in a URL and as a
/// directory name.
pub fn check_version(version: &str) -> Result<(), ConfigError> {
    if plexsphere_wire::version::valid(version) {
        Ok(())
    } else {
        Err(ConfigError::Version(version.to_owned()))
    }
}

/// Fills a URL template's placeholders; `None` for `platform` when the template is a
/// checksums URL (only `{version}` is allowed there).
pub fn expand(
    template: &str,
    version: &str,
    platform: Option<Platform>,
) -> Result<String, ConfigError> {
    let err = |problem| ConfigError::Template {
        template: template.to_owned(),
        problem,
    };
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    let mut per_platform = false;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| err("has a `{` without `}`"))?;
        let value = match (&after[..close], platform) {
            ("version", _) => version,
            ("arch", Some(p)) => p.arch(),
            ("platform", Some(p)) => p.slug(),
            ("file", Some(p)) => p.file_name(),
            ("arch" | "platform" | "file", None) => {
                return Err(err(
                    "names a platform, but a checksums URL serves all of them",
                ));
            }
            _ => {
                return Err(err(
                    "has an unknown placeholder (known: {version}, {arch}, {platform}, {file})",
                ));
            }
        };
        per_platform |= after[..close] != *"version";
        out.push_str(value);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    if platform.is_some() && !per_platform {
        return Err(err(
            "has no {arch}, {platform} or {file}, so every platform would get the same file",
        ));
    }
    match reqwest::Url::parse(&out) {
        Ok(url) if url.scheme() == "https" && url.host().is_some() => Ok(out),
        Ok(url) if url.scheme() == "http" => Err(err(
            "is plain http://; a plexd mirror is fetched over https only (serve the mirror over TLS, and give --plexd-mirror-ca if its CA is private)",
        )),
        _ => Err(err("does not give an https URL with a host")),
    }
}

/// Checks everything that can be checked without I/O; the pinned checksums when inline.
pub fn validate(config: &DownloadsConfig) -> Result<Option<Checksums>, ConfigError> {
    check_version(&config.version)?;
    let Source::Mirror(m) = &config.source else {
        return Ok(None);
    };
    for p in Platform::ALL {
        expand(&m.url_template, &config.version, Some(p))?;
    }
    match &m.checksums {
        PinnedChecksums::Inline(text) => Ok(Some(Checksums::parse(text)?)),
        PinnedChecksums::SignedManifest { url, keys } => {
            expand(url, &config.version, None)?;
            if keys.is_empty() {
                return Err(ConfigError::NoReleaseKey);
            }
            Ok(None)
        }
    }
}

/// A URL as logs and answers may show it: without user name or password.
pub fn redact(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            if !u.username().is_empty() || u.password().is_some() {
                let _ = u.set_username("");
                let _ = u.set_password(None);
            }
            u.to_string()
        }
        Err(_) => "<unparsable URL>".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        for ok in ["1.4.2", "v1.4.2", "0.1.0-rc.1+abc", "nightly_2026"] {
            assert!(check_version(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "../etc",
            "1.0/x",
            "-v",
            "1 0",
            &"9".repeat(65),
        ] {
            assert!(check_version(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn templates_expand_per_platform() {
        let t = "https://mirror.example/plexd/{version}/plexd-linux-{arch}";
        assert_eq!(
            expand(t, "1.2.3", Some(Platform::LinuxArm64)).unwrap(),
            "https://mirror.example/plexd/1.2.3/plexd-linux-arm64"
        );
        assert_eq!(
            expand(
                "https://m/{platform}/{file}",
                "1",
                Some(Platform::LinuxAmd64)
            )
            .unwrap(),
            "https://m/linux-amd64/plexd-linux-amd64"
        );
        assert_eq!(
            expand("https://m/{version}/checksums.sha256", "1", None).unwrap(),
            "https://m/1/checksums.sha256"
        );
    }

    #[test]
    fn bad_templates_are_refused() {
        let amd = Some(Platform::LinuxAmd64);
        for (t, platform) in [
            ("https://m/{version}/plexd", amd),
            ("https://m/{version}/{os}-{arch}", amd),
            ("https://m/{version/{arch}", amd),
            ("ftp://m/{arch}", amd),
            ("/relative/{arch}", amd),
            ("https://m/{arch}/checksums", None),
            ("http://m/{version}/{arch}", amd),
            ("http://m/{version}/plexd-release.json", None),
        ] {
            assert!(
                matches!(expand(t, "1", platform), Err(ConfigError::Template { .. })),
                "{t}"
            );
        }
    }

    #[test]
    fn validate_parses_inline_checksums() {
        let digest = "ab".repeat(32);
        let cfg = DownloadsConfig::mirror(
            "1.0.0",
            MirrorConfig::new(
                "https://m/{version}/plexd-{platform}",
                PinnedChecksums::Inline(format!("{digest}  plexd-linux-arm64\n")),
                "/tmp/x",
            ),
        );
        let pinned = validate(&cfg).unwrap().unwrap();
        assert!(pinned.get(Platform::LinuxArm64).is_some());
        assert!(pinned.get(Platform::LinuxAmd64).is_none());
        let bad = DownloadsConfig::mirror(
            "1.0.0",
            MirrorConfig::new(
                "https://m/{version}/plexd-{platform}",
                PinnedChecksums::Inline("nonsense\n".into()),
                "/tmp/x",
            ),
        );
        assert!(matches!(validate(&bad), Err(ConfigError::Checksums(_))));
        assert!(validate(&DownloadsConfig::local("../x", "/tmp")).is_err());
    }

    #[test]
    fn redact_drops_credentials() {
        assert_eq!(redact("https://user:pw@m.example/a"), "https://m.example/a");
        assert_eq!(redact("https://m.example/a"), "https://m.example/a");
    }
}
