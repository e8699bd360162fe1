//! What goes into the base image, as data: the suite, the packages, the configuration files.
//! The recipe's hash names the cache directory, so a changed recipe builds a new image. The
//! Debian mirror is where the packages come from, not what the image is: it is not hashed.

use std::path::Path;

/// Bump when the build steps in `image.rs` change in a way the recipe's data does not show.
const BUILD_STEPS_VERSION: u32 = 1;

/// The mirror used when the host's apt configuration names none for the suite.
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// Where the cloud-init settings of every machine live inside the image.
pub const CLOUD_CFG_PATH: &str = "/etc/cloud/cloud.cfg.d/90-plexsphere.cfg";

/// The settings cloud-init 22.4 needs in a minimal root: the NoCloud seed, no `update-locale`
/// (the root has no `locales`), and no network rendering (systemd-networkd gets the machine's
/// static address from `/etc/systemd/network/host0.network`; cloud-init would otherwise write a
/// DHCP fallback for host0 that takes precedence and never gets a lease), and no SSH host keys
/// (the image has no SSH server; generating them only logs warnings).
///
/// cloud-init 22.4's schema wants a string for `locale` and logs one "Invalid cloud-config"
/// warning about this base config at boot; `false` is still what skips the module, and the
/// user-data's own schema check (`cloud-init schema --system`) is unaffected.
pub const CLOUD_CFG: &str = "\
# Written by plexsphere-nspawn. The seed comes from /var/lib/cloud/seed/nocloud/; the network is
# systemd-networkd's (/etc/systemd/network/host0.network), not cloud-init's.
datasource_list: [ NoCloud, None ]
locale: false
ssh_genkeytypes: []
network:
  config: disabled
";

/// A file written into the image after the packages are installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageFile {
    Text {
        path: String,
        contents: String,
        mode: u32,
    },
    /// A symlink to `/dev/null`, which masks a vendor file of the same name (systemd's
    /// `80-container-host0.network` would otherwise ask for DHCP on host0).
    Mask { path: String },
}

impl ImageFile {
    pub fn path(&self) -> &str {
        match self {
            ImageFile::Text { path, .. } | ImageFile::Mask { path } => path,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    /// The Debian suite, e.g. `bookworm`.
    pub suite: String,
    /// debootstrap's `--include`.
    pub include: Vec<String>,
    /// Installed afterwards inside the root with `apt-get install --no-install-recommends`.
    pub extra: Vec<String>,
    pub files: Vec<ImageFile>,
    /// Units enabled with `systemctl --root`.
    pub enable: Vec<String>,
}

impl Recipe {
    /// The image of the broker's local machines: Debian bookworm with systemd, cloud-init,
    /// curl, openssl, iproute2 and ping, networkd enabled, cloud-init reading NoCloud.
    pub fn bookworm() -> Recipe {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        Recipe {
            suite: "bookworm".into(),
            include: s(&[
                "systemd",
                "systemd-sysv",
                "dbus",
                "iproute2",
                "iputils-ping",
                "ca-certificates",
                "curl",
                "openssl",
            ]),
            extra: s(&["cloud-init"]),
            files: vec![
                ImageFile::Text {
                    path: CLOUD_CFG_PATH.into(),
                    contents: CLOUD_CFG.into(),
                    mode: 0o644,
                },
                ImageFile::Mask {
                    path: "/etc/systemd/network/80-container-host0.network".into(),
                },
            ],
            enable: s(&["systemd-networkd.service"]),
        }
    }

    /// A stable text of everything that makes the image what it is.
    pub fn canonical(&self) -> String {
        let mut out = format!("build-steps {BUILD_STEPS_VERSION}\nsuite {}\n", self.suite);
        out.push_str(&format!("include {}\n", self.include.join(",")));
        out.push_str(&format!("extra {}\n", self.extra.join(",")));
        for unit in &self.enable {
            out.push_str(&format!("enable {unit}\n"));
        }
        for f in &self.files {
            match f {
                ImageFile::Text {
                    path,
                    contents,
                    mode,
                } => out.push_str(&format!(
                    "file {path} {mode:o} {} {}\n",
                    contents.len(),
                    contents.escape_default()
                )),
                ImageFile::Mask { path } => out.push_str(&format!("mask {path}\n")),
            }
        }
        out
    }

    /// The first 16 hex digits of the SHA-256 of [`Recipe::canonical`].
    pub fn hash(&self) -> String {
        let digest = ring::digest::digest(&ring::digest::SHA256, self.canonical().as_bytes());
        hex::encode(&digest.as_ref()[..8])
    }

    /// The cache directory's name: `<suite>-<hash>`.
    pub fn dir_name(&self) -> String {
        format!("{}-{}", self.suite, self.hash())
    }
}

/// The mirror this host's apt uses for `suite`, else [`DEFAULT_MIRROR`].
pub fn host_mirror(suite: &str) -> String {
    let mut files = vec![Path::new("/etc/apt/sources.list").to_path_buf()];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<_> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "list" || x == "sources"))
            .collect();
        more.sort();
        files.extend(more);
    }
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let deb822 = file.extension().is_some_and(|x| x == "sources");
        if let Some(m) = mirror_in(&text, deb822, suite) {
            return m;
        }
    }
    DEFAULT_MIRROR.to_string()
}

/// The first http(s) URI of a `deb` source for exactly `suite` in an apt sources file, either
/// one-line style (`sources.list`) or deb822 (`*.sources`).
pub fn mirror_in(text: &str, deb822: bool, suite: &str) -> Option<String> {
    let web = |u: &str| u.starts_with("http://") || u.starts_with("https://");
    if !deb822 {
        return text.lines().find_map(|line| {
            let line = line.split('#').next().unwrap_or_default();
            let mut words = line.split_whitespace().peekable();
            if words.next() != Some("deb") {
                return None;
            }
            if words.peek().is_some_and(|w| w.starts_with('[')) {
                // Options: `[arch=amd64 signed-by=...]`, possibly spread over several words.
                for w in words.by_ref() {
                    if w.ends_with(']') {
                        break;
                    }
                }
            }
            let uri = words.next()?;
            (words.next() == Some(suite) && web(uri)).then(|| uri.trim_end_matches('/').to_string())
        });
    }
    for stanza in text.split("\n\n") {
        let field = |name: &str| -> Option<String> {
            stanza.lines().find_map(|l| {
                let l = l.trim();
                if l.starts_with('#') {
                    return None;
                }
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_string())
            })
        };
        let has = |name: &str, want: &str| {
            field(name).is_some_and(|v| v.split_whitespace().any(|w| w == want))
        };
        if !has("Types", "deb") || !has("Suites", suite) {
            continue;
        }
        if field("Enabled").is_some_and(|v| v.eq_ignore_ascii_case("no")) {
            continue;
        }
        if let Some(uri) =
            field("URIs").and_then(|v| v.split_whitespace().find(|u| web(u)).map(str::to_string))
        {
            return Some(uri.trim_end_matches('/').to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_recipe_has_what_the_machines_need() {
        let r = Recipe::bookworm();
        for p in [
            "systemd",
            "systemd-sysv",
            "dbus",
            "iproute2",
            "ca-certificates",
            "curl",
            "openssl",
            "iputils-ping",
        ] {
            assert!(r.include.iter().any(|x| x == p), "{p} missing");
        }
        assert_eq!(r.extra, ["cloud-init"]);
        assert!(CLOUD_CFG.contains("datasource_list: [ NoCloud, None ]"));
        assert!(CLOUD_CFG.contains("locale: false"));
        assert!(CLOUD_CFG.contains("ssh_genkeytypes: []"));
        assert!(CLOUD_CFG.contains("network:\n  config: disabled"));
        assert!(r.dir_name().starts_with("bookworm-"));
        assert_eq!(r.hash().len(), 16);
    }

    #[test]
    fn the_hash_is_stable_and_follows_every_part_of_the_recipe() {
        let base = Recipe::bookworm();
        assert_eq!(base.hash(), Recipe::bookworm().hash());
        let mut more = base.clone();
        more.include.push("less".into());
        assert_ne!(base.hash(), more.hash());
        let mut cfg = base.clone();
        if let ImageFile::Text { contents, .. } = &mut cfg.files[0] {
            contents.push_str("# changed\n");
        }
        assert_ne!(base.hash(), cfg.hash());
        let mut mode = base.clone();
        if let ImageFile::Text { mode: m, .. } = &mut mode.files[0] {
            *m = 0o600;
        }
        assert_ne!(base.hash(), mode.hash());
        let mut units = base.clone();
        units.enable.clear();
        assert_ne!(base.hash(), units.hash());
    }

    #[test]
    fn mirror_from_deb822_skips_other_suites_and_comments() {
        let text = "\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
";
        assert_eq!(
            mirror_in(text, true, "bookworm").as_deref(),
            Some("http://deb.debian.org/debian")
        );
        assert_eq!(mirror_in(text, true, "trixie"), None);
        let sec = mirror_in(text, true, "bookworm-security");
        assert_eq!(
            sec.as_deref(),
            Some("http://deb.debian.org/debian-security")
        );
    }

    #[test]
    fn mirror_from_deb822_honours_enabled_no_and_non_web_uris() {
        let text = "Types: deb\nURIs: http://a.example/debian\nSuites: bookworm\nEnabled: no\n\n\
                    Types: deb-src deb\nURIs: file:/srv/mirror https://b.example/debian/\nSuites: bookworm\n";
        assert_eq!(
            mirror_in(text, true, "bookworm").as_deref(),
            Some("https://b.example/debian")
        );
    }

    #[test]
    fn mirror_from_one_line_sources() {
        let text = "\
# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://mirror.example/debian/ bookworm main contrib
deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main
";
        assert_eq!(
            mirror_in(text, false, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(
            mirror_in("deb cdrom:[Debian]/ bookworm main\n", false, "bookworm"),
            None
        );
    }
}
