//! The platforms plexd is built for, and the names they go by in paths and checksum lines.

use std::fmt;

/// A platform plexd is released for. The path segment is `linux-<arch>`; the file name in a
/// release and in `checksums.sha256` is `plexd-linux-<arch>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Platform {
    LinuxAmd64,
    LinuxArm64,
}

impl Platform {
    /// Every platform, in the order checksum lines and the index list them.
    pub const ALL: [Platform; 2] = [Platform::LinuxAmd64, Platform::LinuxArm64];

    /// `amd64` / `arm64`: what `{arch}` expands to in a mirror URL template.
    pub fn arch(self) -> &'static str {
        match self {
            Platform::LinuxAmd64 => "amd64",
            Platform::LinuxArm64 => "arm64",
        }
    }

    /// `linux-amd64`: the last path segment under `/downloads/plexd/`.
    pub fn slug(self) -> &'static str {
        match self {
            Platform::LinuxAmd64 => "linux-amd64",
            Platform::LinuxArm64 => "linux-arm64",
        }
    }

    /// `plexd-linux-amd64`: the file name in a release, a cache and `checksums.sha256`.
    pub fn file_name(self) -> &'static str {
        match self {
            Platform::LinuxAmd64 => "plexd-linux-amd64",
            Platform::LinuxArm64 => "plexd-linux-arm64",
        }
    }

    /// The platform of a path segment (`linux-amd64`), if plexd is built for it.
    pub fn from_slug(slug: &str) -> Option<Platform> {
        Platform::ALL.into_iter().find(|p| p.slug() == slug)
    }

    /// The platform of a release file name (`plexd-linux-amd64`).
    pub fn from_file_name(name: &str) -> Option<Platform> {
        Platform::ALL.into_iter().find(|p| p.file_name() == name)
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.slug())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in Platform::ALL {
            assert_eq!(Platform::from_slug(p.slug()), Some(p));
            assert_eq!(Platform::from_file_name(p.file_name()), Some(p));
            assert_eq!(p.file_name(), format!("plexd-{}", p.slug()));
            assert_eq!(p.slug(), format!("linux-{}", p.arch()));
        }
        assert_eq!(Platform::from_slug("linux-riscv64"), None);
        assert_eq!(Platform::from_slug("windows-amd64"), None);
        assert_eq!(Platform::from_slug("plexd-linux-amd64"), None);
        assert_eq!(Platform::from_file_name("linux-amd64"), None);
    }
}
