//! What a plexd version string may be, for every place that takes one: a node's registration
//! and heartbeats (`plexd_version`), and the release the control plane serves at
//! `/downloads/plexd`, where the version becomes part of a URL and a directory name.

/// The rule in words, for error messages.
pub const RULE: &str = "1-64 of letters, digits and `.+-_` starting with a letter or digit";

/// Whether `v` is a plexd version: `[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}`. Every semver string
/// (plexd reports its Cargo version) is one; none can leave a directory or break a URL.
pub fn valid(v: &str) -> bool {
    v.len() <= 64
        && v.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-' | b'_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semver_and_release_names_pass_paths_and_blanks_do_not() {
        for ok in ["0.1.0", "1.4.2", "v1.4.2", "0.1.0-rc.1+abc", "nightly_2026"] {
            assert!(valid(ok), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "../etc",
            "1.0/x",
            "-v",
            "1 0",
            "1.0\n",
            &"9".repeat(65),
        ] {
            assert!(!valid(bad), "{bad:?}");
        }
        assert!(valid(&"9".repeat(64)));
    }
}
